"""A queue's breaker and adaptive rate (docs/design.md §9), pure: what their settings may be, and the state
machine that moves them. Given a queue row's flow columns (Flow), what a batch of endings did (Seen) and the
database's time, `step` says the row's new columns and the events they log; store/breakers.py reads and writes
the row, and the claim reads only the breaker's state and its next canary's time (store/sql/gates.py).

The breaker: closed, it counts failures (FAILED, TIMEOUT or throttled endings) in windows of W seconds from the
first; N in one window open it. Open, the queue's claims stop; after the cool-down the claim lets one job through
(a canary: the claim that takes it makes the breaker half-open and puts the next canary one cool-down later).
Half-open, a failure opens it again, a success ramps the queue's rate back up from 1/8 of the configured rate,
doubling it every quarter of a cool-down (a queue without a rate closes at once); a ramp that ends closes it.
The adaptive rate (AIMD): THROTTLED_TO_CUT throttled endings within ADAPT_WINDOW halve the current rate, not below
the floor; a window without any raises it by a tenth of the configured rate, up to it.
"""

import re
from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import BadQueueInput
from .events import EventKind
from .queues import MAX_LIMIT, UNCHANGED, Rate, seconds_in

CLOSED, OPEN, HALF_OPEN, RAMP = "closed", "open", "half-open", "ramp"
STATES = (CLOSED, OPEN, HALF_OPEN, RAMP)
SHUT = (OPEN, HALF_OPEN)  # the claim lets one job through at breaker_at, none before
DEFAULT_COOL_DOWN = 30.0
MAX_SECONDS = 86400.0
RAMP_STEPS = 3  # a ramp starts at 1/2**RAMP_STEPS of the configured rate
RAMP_STEP = 0.25  # of a cool-down: how long each step of a ramp lasts
CUT = 0.5  # what a cut keeps of the current rate
RAISE = 0.1  # of the configured rate: what a window without throttling adds
THROTTLED_TO_CUT = 2
ADAPT_WINDOW = 10.0  # seconds
_BREAKER = re.compile(r"\s*(\d+)\s*/\s*(\S+)\s*\Z")
_TIME_RULE = "a time from 1s to 1d: seconds, or a number and s, min or h"


@dataclass(frozen=True)
class Breaker:
    """`failures` failures within `window` seconds open the breaker: "5/60s" is Breaker(5, 60.0)."""

    failures: int
    window: float

    @classmethod
    def parse(cls, text: object) -> "Breaker":
        if isinstance(text, Breaker):
            return text
        found = _BREAKER.match(text) if isinstance(text, str) else None
        window = seconds_in(found.group(2)) if found else None
        if not found or not 1 <= int(found.group(1)) <= MAX_LIMIT or window is None or not 1 <= window <= MAX_SECONDS:
            raise BadQueueInput(
                "{0} {value} is not a breaker: use {limit}",
                "breaker",
                value=text,
                limit=f"N/TIME, N failures from 1 to {MAX_LIMIT} within a time from 1s to 1d, e.g. 5/60s",
            )
        return cls(int(found.group(1)), window)

    def __str__(self) -> str:
        return f"{self.failures}/{self.window:g}s"


def check_cool_down(value: object) -> float | None:
    """How long an open breaker waits before its first canary, and between canaries (None: DEFAULT_COOL_DOWN)."""
    if value is None:
        return None
    seconds = seconds_in(value)
    if seconds is None or not 1 <= seconds <= MAX_SECONDS:
        raise BadQueueInput.out_of("cool_down", value, _TIME_RULE)
    return seconds


def check_floor(value: object, rate: Rate | None) -> float | None:
    """An adaptive rate's floor (a Rate or "1/s"; None: no adaptive rate), in starts per second, below the queue's
    configured `rate`, which it needs: the ceiling it adapts under."""
    if value is None:
        return None
    floor = Rate.parse(value)
    if rate is None:
        raise BadQueueInput("{0} {value} needs a rate to adapt: set one first", "adaptive", value=value)
    if floor.per_second >= rate.per_second:
        raise BadQueueInput.out_of("adaptive", value, f"a floor below the queue's rate, {rate}")
    return floor.per_second


def flow_settings(
    row: dict[str, Any], values: dict[str, object], breaker: object, cool_down: object, adaptive: object, period: float
) -> dict[str, object]:
    """The qp_queues columns for what an operator gives of a breaker, its cool-down and an adaptive rate (UNCHANGED:
    not given; None: remove), on queue row `row` as it is, with `values`, the other settings given with them
    (a rate: the new ceiling). A queue left with neither gets its configured rate back (`period` sizes its
    bucket); BadQueueInput for a setting refused, or a rate that would leave an adaptive rate without one above
    its floor."""
    out: dict[str, object] = {}
    if breaker is not UNCHANGED:
        parsed = None if breaker is None else Breaker.parse(breaker)
        out |= dict(
            breaker_failures=parsed and parsed.failures,
            breaker_window=parsed and parsed.window,
            breaker_count=0 if parsed else None,
            breaker_from=None,
        )
        if parsed is None or row.get("breaker_failures") is None:  # a new breaker starts closed
            out |= dict(breaker_state=parsed and CLOSED, breaker_at=None)
    if cool_down is not UNCHANGED:
        out["breaker_cooldown"] = check_cool_down(cool_down)
    rated = "rate_count" in values
    count = values["rate_count"] if rated else row.get("rate_count")
    per = values["rate_per"] if rated else row.get("rate_set_per") or row.get("rate_per")
    rate = Rate(count, per) if isinstance(count, int) and isinstance(per, float) else None
    if adaptive is not UNCHANGED:
        out |= dict(adapt_floor=check_floor(adaptive, rate), adapt_at=None, adapt_throttled=None)
    elif rated and row.get("adapt_floor") is not None and (rate is None or row["adapt_floor"] >= rate.per_second):
        raise BadQueueInput(
            "{0} {value} leaves the adaptive rate (floor {limit}) no rate above its floor: remove it first",
            "rate",
            value=str(rate) if rate else None,
            limit=rate_text(row["adapt_floor"]),
        )
    kept = {**row, **out}
    if not rated and row.get("rate_set_per") and not watched(kept) and rate is not None:
        out |= dict(rate_per=rate.per_seconds, rate_set_per=None, burst=rate.burst(period), tokens=None)
    return out


def rate_text(per_second: float) -> str:
    """A rate as events and tables show it: starts per second, three figures ("2.5/s")."""
    return f"{per_second:.3g}/s"


@dataclass(frozen=True)
class Flow:
    """A queue row's columns that the breaker and the adaptive rate read and move (store/schema.py says what each
    holds). rate_per is the rate the claim's bucket uses now; rate_set_per, while that is lowered, the configured
    one's (the ceiling)."""

    breaker_failures: int | None = None
    breaker_window: float | None = None
    breaker_cooldown: float | None = None
    breaker_state: str | None = None
    breaker_at: float | None = None
    breaker_count: int | None = None
    breaker_from: float | None = None
    adapt_floor: float | None = None
    adapt_at: float | None = None
    adapt_throttled: int | None = None
    rate_count: int | None = None
    rate_per: float | None = None
    rate_set_per: float | None = None

    @classmethod
    def of(cls, row: Any) -> "Flow":
        """From a row (a mapping) holding at least these columns."""
        return cls(**{f.name: row[f.name] for f in fields(cls)})

    @property
    def state(self) -> str:
        return self.breaker_state or CLOSED

    @property
    def cool_down(self) -> float:
        return self.breaker_cooldown or DEFAULT_COOL_DOWN

    def _per_second(self, per: float | None) -> float:
        assert self.rate_count is not None and per  # asked only of a rated queue
        return self.rate_count / per

    @property
    def current(self) -> float:
        """The rate the claim uses now, starts per second."""
        return self._per_second(self.rate_per)

    @property
    def ceiling(self) -> float:
        """The configured rate, starts per second."""
        return self._per_second(self.rate_set_per or self.rate_per)

    def rated(self, per_second: float) -> "Flow":
        """This row at rate `per_second` (the ceiling at most: then no longer lowered)."""
        assert self.rate_count is not None
        if per_second >= self.ceiling * (1 - 1e-9):
            return replace(self, rate_per=self.rate_set_per or self.rate_per, rate_set_per=None)
        return replace(self, rate_per=self.rate_count / per_second, rate_set_per=self.rate_set_per or self.rate_per)


def watched(row: Any) -> bool:
    """Does queue row `row` have a breaker or an adaptive rate (its endings are counted; see store/breakers.py)?"""
    return row.get("breaker_failures") is not None or row.get("adapt_floor") is not None


def quiet(row: Any) -> bool:
    """A batch of successes alone changes nothing on this row: its breaker is closed and its rate is the
    configured one (so a node writes nothing for it, see store/breakers.py)."""
    return (row.get("breaker_state") or CLOSED) == CLOSED and row.get("rate_set_per") is None


@dataclass(frozen=True)
class Seen:
    """What one batch of endings of a queue did: failed (FAILED or TIMEOUT), throttled, succeeded."""

    failed: int = 0
    throttled: int = 0
    succeeded: int = 0


Events = list[tuple[EventKind, str]]


def step(flow: Flow, seen: Seen, now: float) -> tuple[Flow, Events]:
    """The row after a batch of endings `seen` at database time `now`, and the events it logs."""
    events: Events = []
    if flow.breaker_failures is not None:
        flow, events = _breaker(flow, seen, now)
    if flow.adapt_floor is not None and flow.rate_count is not None and flow.state == CLOSED:
        flow, adapted = _adapt(flow, seen, now)
        events += adapted
    return flow, events


def opened(flow: Flow, now: float, why: str) -> tuple[Flow, Events]:
    """The breaker opens: claims stop, the first canary goes after the cool-down."""
    shut = replace(flow, breaker_state=OPEN, breaker_at=now + flow.cool_down, breaker_count=0, breaker_from=None)
    return shut, [(EventKind.QUEUE_BREAKER_OPENED, f"{why}: claims stop, a canary in {flow.cool_down:g} s")]


def closed(flow: Flow, why: str) -> tuple[Flow, Events]:
    """The breaker closes: the queue runs at its configured rate again."""
    done = replace(flow, breaker_state=CLOSED, breaker_at=None, breaker_count=0, breaker_from=None)
    if flow.rate_set_per is not None:
        done = replace(done, rate_per=flow.rate_set_per, rate_set_per=None)
    return done, [(EventKind.QUEUE_BREAKER_CLOSED, why)]


def _breaker(flow: Flow, seen: Seen, now: float) -> tuple[Flow, Events]:
    bad = seen.failed + seen.throttled
    if flow.state == OPEN:  # runs started before it opened: no canary has gone yet
        return flow, []
    if flow.state == HALF_OPEN:
        if bad:
            return opened(flow, now, "a canary failed")
        return _ramp(flow, now) if seen.succeeded else (flow, [])
    if bad:
        failures, window = flow.breaker_failures, flow.breaker_window
        assert failures is not None and window is not None
        window_over = flow.breaker_from is None or now - flow.breaker_from > window
        count = bad if window_over else (flow.breaker_count or 0) + bad
        flow = replace(flow, breaker_count=count, breaker_from=now if window_over else flow.breaker_from)
        if count >= failures:
            return opened(flow, now, f"{count} failures within {window:g} s")
    if flow.state == RAMP and flow.breaker_at is not None and now >= flow.breaker_at:
        return _ramp_step(flow, now)
    return flow, []


def _ramp(flow: Flow, now: float) -> tuple[Flow, Events]:
    """A canary passed: a queue with a rate ramps it back up from 1/2**RAMP_STEPS; one without closes."""
    if flow.rate_count is None:
        return closed(flow, "a canary passed")
    start = min(flow.current, flow.ceiling / 2**RAMP_STEPS)
    ramp = replace(flow.rated(start), breaker_state=RAMP, breaker_at=now + flow.cool_down * RAMP_STEP)
    return ramp, [
        (
            EventKind.QUEUE_BREAKER_RAMP,
            f"a canary passed: rate {rate_text(flow.current)} -> {rate_text(start)}, back to "
            f"{rate_text(flow.ceiling)} by steps",
        )
    ]


def _ramp_step(flow: Flow, now: float) -> tuple[Flow, Events]:
    up = flow.rated(min(flow.ceiling, flow.current * 2))
    if up.rate_set_per is None:
        return closed(flow, f"ramp done: rate back to {rate_text(flow.ceiling)}")
    up = replace(up, breaker_at=now + flow.cool_down * RAMP_STEP)
    return up, [(EventKind.QUEUE_RATE_ADAPTED, f"ramp: rate {rate_text(flow.current)} -> {rate_text(up.current)}")]


def _adapt(flow: Flow, seen: Seen, now: float) -> tuple[Flow, Events]:
    """AIMD on the current rate, in windows of ADAPT_WINDOW from a change or a throttled ending."""
    if flow.rate_set_per is None and not seen.throttled and not flow.adapt_throttled:
        return flow, []  # at full rate and nothing throttled: nothing to do
    floor = flow.adapt_floor
    assert floor is not None
    events: Events = []
    throttled = flow.adapt_throttled or 0
    if flow.adapt_at is None or now - flow.adapt_at >= ADAPT_WINDOW:
        if not throttled and flow.rate_set_per is not None:  # a window without throttling: add
            up = flow.rated(min(flow.ceiling, flow.current + RAISE * flow.ceiling))
            events.append((EventKind.QUEUE_RATE_ADAPTED, _adapted("no throttling", flow.current, up.current)))
            flow = up
        flow, throttled = replace(flow, adapt_at=now), 0
    throttled += seen.throttled
    if throttled >= THROTTLED_TO_CUT:
        cut = max(floor, flow.current * CUT)
        if cut < flow.current:
            events.append((EventKind.QUEUE_RATE_ADAPTED, _adapted(f"{throttled} throttled", flow.current, cut)))
            flow = flow.rated(cut)
        flow, throttled = replace(flow, adapt_at=now), 0
    return replace(flow, adapt_throttled=throttled), events


def _adapted(why: str, old: float, new: float) -> str:
    return f"{why}: rate {rate_text(old)} -> {rate_text(new)}"
