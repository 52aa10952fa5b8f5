"""Unit tests of the offset estimator with a fake clock (docs/design.md §1)."""

import pytest

from queueprocessor.rules.clock import FakeClock, OffsetEstimator, SystemClock


def ask(clock, db_offset, before, after):
    """A fake database whose clock is monotonic + db_offset; the answer is taken after `before`
    seconds of network delay and arrives after `after` more."""

    def answer():
        clock.advance(before)
        db = clock.monotonic() + db_offset
        clock.advance(after)
        return db

    return answer


def test_symmetric_delay_gives_the_exact_offset():
    clock = FakeClock()
    estimator = OffsetEstimator(clock)
    estimator.measure(ask(clock, 500.0, 0.002, 0.002))
    assert estimator.db_now() - clock.monotonic() == pytest.approx(500.0, abs=1e-9)
    assert estimator.error_bound() == pytest.approx(0.002, abs=1e-6)


def test_the_sample_with_the_smallest_round_trip_wins():
    clock = FakeClock()
    estimator = OffsetEstimator(clock)
    estimator.measure(ask(clock, 500.0, 0.050, 0.001))  # slow and lopsided: 24.5 ms wrong
    estimator.measure(ask(clock, 500.0, 0.0005, 0.0005))
    estimator.measure(ask(clock, 500.0, 0.001, 0.030))
    assert estimator.rtt() == pytest.approx(0.001)
    assert estimator.db_now() - clock.monotonic() == pytest.approx(500.0, abs=1e-6)


def test_error_bound_covers_asymmetric_delay():
    clock = FakeClock()
    estimator = OffsetEstimator(clock)
    estimator.measure(ask(clock, 500.0, 0.009, 0.001))
    error = abs(estimator.db_now() - (clock.monotonic() + 500.0))
    assert error == pytest.approx(0.004)
    assert error <= estimator.error_bound()


def test_estimate_is_anchored_to_the_monotonic_clock_not_the_wall():
    clock = SystemClock(skew=0.0)
    estimator = OffsetEstimator(clock)
    estimator.measure(lambda: 1_000_000.0 + clock.monotonic())
    before = estimator.db_now() - clock.monotonic()
    offset_before = estimator.offset()
    clock.step(3600)  # someone set the wall clock an hour ahead
    assert estimator.db_now() - clock.monotonic() == pytest.approx(before, abs=1e-3)
    # The published offset (db - wall) shows the step, so operators see the skewed machine.
    assert estimator.offset() == pytest.approx(offset_before - 3600, abs=1e-3)


def test_old_samples_lose_to_fresh_ones_through_drift():
    clock = FakeClock()
    estimator = OffsetEstimator(clock, window=4)
    estimator.measure(ask(clock, 1.0, 0.001, 0.001))
    clock.advance(1000)  # 1000 s later, drift may have added 50 ms of error to that sample
    estimator.measure(ask(clock, 1.0, 0.005, 0.005))
    assert estimator.rtt() == pytest.approx(0.010)


def test_no_sample_yet_is_an_error_not_a_guess():
    estimator = OffsetEstimator(FakeClock())
    assert not estimator.synced
    with pytest.raises(RuntimeError):
        estimator.db_now()


def test_fake_clock_refuses_to_go_backwards():
    with pytest.raises(ValueError):
        FakeClock().advance(-1)
