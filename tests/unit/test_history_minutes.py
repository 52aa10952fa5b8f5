"""Which turn writes which minute of the farm's history (store/stats.py): exactly one slot per minute, a little
after the minute ends, whatever the period."""

import pytest

from queueprocessor.store.stats import MINUTE, WRITE_LAG, minute_to_write


@pytest.mark.parametrize("period", [0.25, 1.0, 7.0, 60.0])
def test_one_slot_a_minute_writes_the_minute_just_ended(period):
    slots = range(round(3600 / period), round(7200 / period))
    written = {slot: minute_to_write(slot, period) for slot in slots if minute_to_write(slot, period) is not None}
    minutes = sorted(written.values())
    assert minutes == list(range(minutes[0], minutes[0] + len(minutes) * MINUTE, MINUTE)) and len(minutes) >= 59
    for slot, minute in written.items():
        assert minute + MINUTE + WRITE_LAG <= slot * period < minute + 2 * MINUTE + WRITE_LAG
