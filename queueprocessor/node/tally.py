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
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a claimed job is only read here
    from ..store.types import Claimed

# Upper bounds, in seconds, of the histograms' buckets: jobs run from milliseconds (HTTP) to hours (commands);
# a turn starts within a millisecond or two of its slot unless the node or the database is slow.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
LATENESS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def job_labels(job: "Claimed") -> tuple[str, str]:
    """(queue, executor) of a claimed job."""
    return job.queue, job.executor


class Buckets:
    """A histogram's observations: how many fell in each bucket (not cumulative; the last is above every bound),
    and their sum."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def add(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

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
        self._ended: Counter[tuple[str, str, str]] = Counter()
        self._durations: dict[tuple[str, str], Buckets] = {}
        self._lateness = Buckets(LATENESS_BUCKETS)
        self._renewals_failed = 0
        self._fences = 0

    def claimed(self, jobs: Iterable["Claimed"]) -> None:
        with self._lock:
            self._claimed.update(job_labels(job) for job in jobs)

    def ran(self, worked: Iterable[tuple["Claimed", float]]) -> None:
        """Jobs whose work is over, each (job, seconds it took), however it ended."""
        with self._lock:
            for job, seconds in worked:
                labels = job_labels(job)
                buckets = self._durations.get(labels)
                if buckets is None:
                    buckets = self._durations[labels] = Buckets(RUN_BUCKETS)
                buckets.add(seconds)

    def ended(self, endings: Iterable[tuple["Claimed", str]]) -> None:
        """How jobs' runs ended, each (job, outcome), once that is written (or given up: LOST)."""
        with self._lock:
            self._ended.update((*job_labels(job), outcome) for job, outcome in endings)

    def ended_with(self, *outcomes: str) -> int:
        """How many jobs ended with one of these outcomes, whatever their queue and executor."""
        with self._lock:
            return sum(count for (*_labels, outcome), count in self._ended.items() if outcome in outcomes)

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
                dict(self._ended),
                {labels: buckets.copy() for labels, buckets in self._durations.items()},
                self._lateness.copy(),
                self._renewals_failed,
                self._fences,
            )
