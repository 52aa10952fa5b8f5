"""What a node counts as it works, for its metrics: a few additions under one lock per batch of jobs or turn, read
whole by a scrape (queueprocessor.node.metrics turns a reading into Prometheus metrics).

The node keeps these counts whether or not it serves metrics: they cost well under a microsecond a job, and a node
that serves them does no more work per job than one that does not (prometheus_client's own metric objects would
take a lock and look up a labelled child on every call). This module imports nothing beyond the standard library,
so a node that serves no metrics never loads prometheus_client.
"""

import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a claimed job is only read here
    from ..rules.job import Claimed

# Upper bounds, in seconds, of the histograms' buckets: jobs run from milliseconds (HTTP) to hours (commands);
# a turn starts within a millisecond or two of its slot unless the node or the database is slow.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
LATENESS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


# (queue, executor) of a claimed job: an attrgetter, so that counting a claim's or a batch's jobs by their labels
# runs in C, with no Python call per job.
job_labels: Callable[["Claimed"], tuple[str, str]] = attrgetter("queue", "executor")


class Buckets:
    """A histogram's observations: how many fell in each bucket (not cumulative; the last is above every bound),
    and their sum."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def add(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.sum += value * times

    def copy(self) -> "Buckets":
        twin = Buckets(self.bounds)
        twin.counts, twin.sum = list(self.counts), self.sum
        return twin


@dataclass(frozen=True)
class Reading:
    """The counts at one instant (a scrape's copy). Keys are (queue, executor), ended adds the outcome."""

    claimed: dict[tuple[str, str], int]
    ended: dict[tuple[str, str, str], int]
    durations: dict[tuple[str, str], Buckets]
    lateness: Buckets
    renewals_failed: int
    fences: int


class Tally:
    """A node's counts since it was made. Written by its threads (claims: the turn timer; durations: the runner's
    loop; endings: the result writer; renewals: the heartbeat; fences: the watchdog), read by a scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claimed: Counter[tuple[str, str]] = Counter()
        self._ended: Counter[tuple[tuple[str, str], str]] = Counter()  # ((queue, executor), outcome): see ended
        self._durations: dict[tuple[str, str], Buckets] = {}
        self._lateness = Buckets(LATENESS_BUCKETS)
        self._renewals_failed = 0
        self._fences = 0

    def claimed(self, jobs: Iterable["Claimed"]) -> None:
        with self._lock:
            self._claimed.update(map(job_labels, jobs))

    def ran(self, jobs: list["Claimed"], seconds: list[float]) -> None:
        """Jobs whose work is over, with the seconds each took, however it ended. A batch's jobs took the same
        time: each histogram adds each distinct duration once."""
        worked = Counter(zip(map(job_labels, jobs), seconds))
        with self._lock:
            for (labels, took), times in worked.items():
                buckets = self._durations.get(labels)
                if buckets is None:
                    buckets = self._durations[labels] = Buckets(RUN_BUCKETS)
                buckets.add(took, times)

    def ended(self, jobs: list["Claimed"], outcomes: list[str]) -> None:
        """How jobs' runs ended, each job with its outcome, once that is written (or given up: LOST)."""
        with self._lock:
            self._ended.update(zip(map(job_labels, jobs), outcomes))

    def ended_with(self, *outcomes: str) -> int:
        """How many jobs ended with one of these outcomes, whatever their queue and executor."""
        with self._lock:
            return sum(count for (_labels, outcome), count in self._ended.items() if outcome in outcomes)

    def turn(self, lateness: float) -> None:
        """A turn taken `lateness` seconds into its slot."""
        with self._lock:
            self._lateness.add(lateness)

    def renewal_failed(self) -> None:
        """A check-in, which renews every lease we hold, did not get through."""
        with self._lock:
            self._renewals_failed += 1

    def fenced(self) -> None:
        """The watchdog stopped our jobs before their leases could run out (see watchdog.Watchdog)."""
        with self._lock:
            self._fences += 1

    def read(self) -> Reading:
        with self._lock:
            return Reading(
                dict(self._claimed),
                {(*labels, outcome): count for (labels, outcome), count in self._ended.items()},
                {labels: buckets.copy() for labels, buckets in self._durations.items()},
                self._lateness.copy(),
                self._renewals_failed,
                self._fences,
            )
