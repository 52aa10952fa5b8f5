"""Loading ahead what a new schedule's work needs, on every node (docs/design.md §6).

An occurrence is claimed a period before its time, and its executor loads meanwhile what its first run needs (an
HTTP client, a Python job's module: Executor.warm). On a loaded machine that load can take longer than a period, and
turns go round, so a new schedule's first occurrences, each some node's first job of its kind, started late by it.
So every node loads it as soon as its heartbeat shows a new schedule, and a schedule's first occurrence is more than
two periods away (rules.schedules.first_occurrence).
"""

import asyncio
from collections.abc import Callable

from ..rules.job import Claimed
from ..store.schedules import ScheduleStore
from .runner import JobRunner


class Warmup:
    """Owned by qp-heartbeat, which calls `note` with each read's earliest occurrence to make."""

    def __init__(self, schedules: ScheduleStore, runner: Callable[[], JobRunner | None]):
        self.schedules = schedules
        self.runner = runner  # the node's, once started
        self._seen: float | None = None

    def note(self, upcoming: float | None) -> None:
        """An earliest occurrence sooner than the one last seen (or the first seen: a node just started) means a
        schedule was added or resumed: load what every active schedule's work needs, on the runner's loop. In
        between, the earliest only moves later as occurrences are made, and nothing is read."""
        last, self._seen = self._seen, upcoming
        runner = self.runner()
        if runner is None or upcoming is None or (last is not None and upcoming >= last):
            return
        for name, target in self.schedules.work():
            executor = runner.executors.get(name)
            if executor is not None:  # (one this node lacks is for its run to report)
                stand_in = Claimed(0, name, target, "GET", None, 0, 0, None, 0, upcoming)
                asyncio.run_coroutine_threadsafe(executor.warm(stand_in), runner.loop)
