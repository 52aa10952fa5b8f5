"""A schedule's jitter and upcoming runs as pure functions: the same on every machine, in every process."""

import hashlib

import pytest

from queueprocessor.rules.errors import InvalidJob
from queueprocessor.rules.schedules import (
    Recurrence,
    backfilled,
    check_overlap,
    jitter_of,
    order_key_of,
    upcoming_runs,
)

ROW = dict(name="report", cron=None, tz=None, every=3600.0, jitter=600.0, paused=False, paused_until=None)


def test_jitter_is_a_hash_of_the_key_not_of_the_process():
    key = "report@2026-11-22T03:00:00.000+01:00"
    assert jitter_of(key, 600.0) == pytest.approx(jitter_of(key, 1.0) * 600.0)
    assert jitter_of(key, 600.0) == pytest.approx(600.0 * int("".join(f"{b:02x}" for b in _sha(key)[:8]), 16) / 2**64)
    assert jitter_of(key, 0.0) == 0.0 and 0.0 <= jitter_of(key, 600.0) < 600.0


def _sha(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def test_upcoming_runs_are_the_next_occurrences_with_their_jitter_earliest_first():
    now = 1_800_000_000.0
    runs = upcoming_runs(ROW, now)
    hourly = Recurrence(every=3600.0)
    expected = sorted(t + jitter_of(f"report@{hourly.label(t)}", 600.0) for t in hourly.upcoming(now - 600.0, 8))
    assert runs == [t for t in expected if t > now][:5]
    assert upcoming_runs(ROW | dict(paused=True), now) == []
    later = upcoming_runs(ROW | dict(paused=True, paused_until=now + 86400), now)
    assert len(later) == 5 and min(later) > now + 86400


def test_order_keys_the_farm_gives_and_keeps():
    assert order_key_of("n", "allow", None) is None
    assert order_key_of("n", "skip", "mine") == "mine"
    assert order_key_of("n", "skip", None) == "schedule:n"
    assert len(order_key_of("n" * 200, "skip", None) or "") <= 200


@pytest.mark.parametrize(
    "overlap, jitter, pause, message",
    [
        ("sometimes", 0, None, "unknown overlap policy 'sometimes'"),
        ("skip", -1, None, "jitter must be from 0 to 86400 seconds (got -1)"),
        ("skip", True, None, "jitter must be from 0"),
        ("skip", 0, 0, "pause_on_failure must be from 1 to 1000 runs (got 0)"),
        ("skip", 0, 2.5, "pause_on_failure must be from 1 to 1000 runs"),
    ],
)
def test_bad_policies_are_one_line(overlap, jitter, pause, message):
    with pytest.raises(InvalidJob) as refused:
        check_overlap(overlap, jitter, pause)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_a_backfill_range_is_past_forward_and_bounded():
    hourly = Recurrence(every=3600.0)
    assert backfilled(hourly, 0.0, 3 * 3600.0, 10**9) == [0.0, 3600.0, 7200.0, 10800.0]
    for start, end, now in ((10.0, 5.0, 100.0), (0.0, 200.0, 100.0), (0.0, 3600.0 * 2000, 10**9)):
        with pytest.raises(InvalidJob):
            backfilled(hourly, start, end, now)
