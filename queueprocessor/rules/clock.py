"""Local clocks and the estimate of database time (docs/design.md §1).

A node never trusts its wall clock for anything shared. It samples the
database's time the way Cristian's algorithm and NTP do and anchors the best
sample to its *monotonic* clock, so a wall-clock step cannot move its idea of
database time.
"""

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class Clock(Protocol):
    """What the engine needs of a local clock; injectable for tests and skew demos."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class SystemClock:
    """The machine's clocks, with an optional skew (and later steps) of the wall clock.

    `skew` simulates a machine whose wall clock is off by that many seconds;
    `step()` simulates an operator or NTP jumping the wall clock mid-run.
    """

    def __init__(self, skew: float = 0.0):
        self.skew = skew

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time() + self.skew

    def step(self, seconds: float) -> None:
        self.skew += seconds


class FakeClock:
    """A hand-driven clock for unit tests; it refuses to go backwards."""

    def __init__(self, start: float = 1_000.0, wall_offset: float = 1.7e9):
        self._mono = start
        self.wall_offset = wall_offset

    def monotonic(self) -> float:
        return self._mono

    def time(self) -> float:
        return self._mono + self.wall_offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a FakeClock cannot go backwards")
        self._mono += seconds


@dataclass(frozen=True)
class Sample:
    """One round trip: local monotonic send/receive times and the database's answer."""

    t0: float
    t1: float
    db: float

    @property
    def rtt(self) -> float:
        return self.t1 - self.t0

    @property
    def mono_offset(self) -> float:
        """db - monotonic at the midpoint of the round trip."""
        return self.db - (self.t0 + self.t1) / 2


class OffsetEstimator:
    """NTP's clock filter: keep recent samples, trust the one with the smallest round trip.

    The chosen sample's error bound is rtt/2 (the database answered somewhere
    inside the round trip) plus the drift the local oscillator may have gained
    since (DRIFT seconds per second).
    """

    DRIFT = 50e-6

    def __init__(self, clock: Clock, window: int = 16):
        self.clock = clock
        self._samples: deque[Sample] = deque(maxlen=window)
        self._lock = threading.Lock()

    def measure(self, ask_db: Callable[[], float]) -> Sample:
        """Time one call of `ask_db()` (which returns database time) and keep the sample."""
        t0 = self.clock.monotonic()
        db = ask_db()
        t1 = self.clock.monotonic()
        sample = Sample(t0, t1, db)
        self.add(sample)
        return sample

    def add(self, sample: Sample) -> None:
        with self._lock:
            self._samples.append(sample)

    @property
    def synced(self) -> bool:
        return bool(self._samples)

    def best(self) -> Sample:
        now = self.clock.monotonic()
        with self._lock:
            if not self._samples:
                raise RuntimeError("no clock sample yet: measure() the database first")
            return min(self._samples, key=lambda s: s.rtt / 2 + self.DRIFT * (now - s.t1))

    def db_now(self) -> float:
        """This node's estimate of the database's clock right now."""
        return self.clock.monotonic() + self.best().mono_offset

    def error_bound(self) -> float:
        best = self.best()
        return best.rtt / 2 + self.DRIFT * (self.clock.monotonic() - best.t1)

    def offset(self) -> float:
        """db - local wall clock, as published on the machine row (the GUI shows it)."""
        return self.db_now() - self.clock.time()

    def rtt(self) -> float:
        return self.best().rtt
