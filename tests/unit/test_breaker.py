"""The breaker's and the adaptive rate's pure rules (rules/breaker.py): settings as typed, and the state machine
moved by batches of endings in database time."""

import pytest

from queueprocessor.rules.breaker import (
    ADAPT_WINDOW,
    CLOSED,
    HALF_OPEN,
    OPEN,
    RAMP,
    Breaker,
    Flow,
    Seen,
    check_cool_down,
    check_floor,
    flow_settings,
    quiet,
    step,
)
from queueprocessor.rules.errors import BadQueueInput
from queueprocessor.rules.events import EventKind
from queueprocessor.rules.queues import UNCHANGED, Rate

BREAKER = Flow(breaker_failures=3, breaker_window=60.0, breaker_cooldown=20.0, breaker_state=CLOSED)
FAIL, OK = Seen(failed=1), Seen(succeeded=1)


def kinds(events):
    return [kind for kind, _ in events]


def test_settings_as_typed_and_refused_in_one_line():
    assert Breaker.parse("5/60s") == Breaker(5, 60.0) and str(Breaker.parse(" 5 / 2min ")) == "5/120s"
    assert check_cool_down("30s") == 30.0 and check_cool_down(None) is None and check_cool_down(45) == 45.0
    assert check_floor("1/s", Rate(10, 1.0)) == 1.0 and check_floor(None, None) is None
    for bad in ("5", "0/60s", "five/60s", "5/0s", "5/3d", None, 5):
        with pytest.raises(BadQueueInput, match="is not a breaker"):
            Breaker.parse(bad)
    for bad in ("soon", 0, "2d", True):
        with pytest.raises(BadQueueInput, match="cool_down"):
            check_cool_down(bad)
    with pytest.raises(BadQueueInput, match="needs a rate"):
        check_floor("1/s", None)
    with pytest.raises(BadQueueInput, match="below the queue's rate"):
        check_floor("10/s", Rate(10, 1.0))
    with pytest.raises(BadQueueInput) as refused:
        Breaker.parse("lots")
    assert "\n" not in str(refused.value)


def test_n_failures_within_the_window_open_it_and_older_ones_do_not_count():
    flow, events = step(BREAKER, Seen(failed=2), now=100.0)
    assert flow.state == CLOSED and flow.breaker_count == 2 and not events
    late, events = step(flow, FAIL, now=161.0)
    assert late.state == CLOSED and late.breaker_count == 1, "the window began anew: the two are too old"
    shut, events = step(flow, Seen(throttled=1), now=150.0)
    assert shut.state == OPEN and shut.breaker_at == 170.0 and kinds(events) == [EventKind.QUEUE_BREAKER_OPENED]
    assert "3 failures within 60 s" in events[0][1]
    assert step(shut, Seen(failed=5, succeeded=5), now=160.0) == (shut, []), "open: runs begun before it opened"


def test_a_canary_failure_reopens_and_a_success_ramps_a_rated_queue_back_to_its_rate():
    half = Flow(
        **{**BREAKER.__dict__, "breaker_state": HALF_OPEN, "breaker_at": 200.0, "rate_count": 8, "rate_per": 1.0}
    )
    reopened, events = step(half, FAIL, now=190.0)
    assert reopened.state == OPEN and reopened.breaker_at == 210.0 and "a canary failed" in events[0][1]
    ramp, events = step(half, OK, now=190.0)
    assert ramp.state == RAMP and ramp.current == 1.0 and ramp.ceiling == 8.0 and ramp.rate_set_per == 1.0
    assert kinds(events) == [EventKind.QUEUE_BREAKER_RAMP] and ramp.breaker_at == 195.0
    assert step(ramp, OK, now=194.0) == (ramp, []), "a step lasts a quarter of the cool-down"
    rates, now = [], 195.0
    while ramp.state == RAMP:
        ramp, events = step(ramp, OK, now=now)
        rates.append(ramp.current)
        now += 5.0
    assert rates == [2.0, 4.0, 8.0] and ramp.state == CLOSED and ramp.rate_set_per is None
    assert kinds(events) == [EventKind.QUEUE_BREAKER_CLOSED] and ramp.rate_per == 1.0


def test_a_queue_without_a_rate_closes_on_its_first_canary_success():
    flow, events = step(Flow(**{**BREAKER.__dict__, "breaker_state": HALF_OPEN}), OK, now=5.0)
    assert flow.state == CLOSED and kinds(events) == [EventKind.QUEUE_BREAKER_CLOSED]


def test_aimd_halves_on_throttling_not_below_the_floor_and_adds_a_tenth_per_quiet_window():
    flow = Flow(adapt_floor=2.0, rate_count=10, rate_per=1.0)
    assert step(flow, OK, 0.0) == (flow, []), "at full rate, successes change nothing"
    one, _ = step(flow, Seen(throttled=1), 0.0)
    assert one.current == 10.0 and one.adapt_throttled == 1
    cut, events = step(one, Seen(throttled=1), 1.0)
    assert cut.current == 5.0 and cut.ceiling == 10.0 and kinds(events) == [EventKind.QUEUE_RATE_ADAPTED]
    assert events[0][1] == "2 throttled: rate 10/s -> 5/s"
    cut, _ = step(cut, Seen(throttled=2), 2.0)
    cut, _ = step(cut, Seen(throttled=2), 3.0)
    assert cut.current == 2.0, "not below the floor"
    assert step(cut, OK, 3.0 + ADAPT_WINDOW - 1)[0].current == 2.0, "raised only after a quiet window"
    up, events = step(cut, OK, 3.0 + ADAPT_WINDOW)
    assert up.current == pytest.approx(3.0) and events[0][1] == "no throttling: rate 2/s -> 3/s"
    now = 3.0 + ADAPT_WINDOW
    while up.rate_set_per is not None:
        now += ADAPT_WINDOW
        up, _ = step(up, OK, now)
    assert up.rate_per == 1.0 and up.current == 10.0 and quiet(up.__dict__)


def test_no_adapting_while_the_breaker_is_not_closed():
    flow = Flow(**{**BREAKER.__dict__, "breaker_state": OPEN, "adapt_floor": 1.0, "rate_count": 10, "rate_per": 1.0})
    assert step(flow, Seen(throttled=5), 0.0) == (flow, [])


def test_settings_on_a_row_keep_the_ceiling_apart_and_refuse_a_rate_under_the_floor():
    row = dict(rate_count=10, rate_per=4.0, rate_set_per=1.0, adapt_floor=1.0)
    assert flow_settings(row, {}, UNCHANGED, UNCHANGED, None, 1.0) == dict(
        adapt_floor=None, adapt_at=None, adapt_throttled=None, rate_per=1.0, rate_set_per=None, burst=10.0, tokens=None
    ), "no adaptive rate left: the configured rate is back"
    with pytest.raises(BadQueueInput, match="no rate above its floor"):
        flow_settings(row, dict(rate_count=1, rate_per=1.0), UNCHANGED, UNCHANGED, UNCHANGED, 1.0)
    made = flow_settings({}, {}, "5/60s", "10s", UNCHANGED, 1.0)
    assert made["breaker_state"] == CLOSED and made["breaker_cooldown"] == 10.0 and made["breaker_failures"] == 5
