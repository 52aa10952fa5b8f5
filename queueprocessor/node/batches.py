"""Starting a claim's jobs: each on its own, or a batch function's together, one call for up to its batch size.

A batch function's jobs (`@job(batch=N)`) that a claim brings together are run by one call, in one task, grouped
by target and timeout; each keeps its own entry (see runs.Running), lease, fence, attempt and end. Nothing waits
for a batch to fill: a lone job starts at once, in a batch of one.
"""

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from ..executors import Executor, JobFailed, executor_for
from ..rules.states import Kind, Outcome
from .runs import (
    OWN_CANCEL,
    OutOfTime,
    RunEnd,
    Running,
    bounded,
    cancelled_itself,
    failed_end,
    stopped_end,
    timed_out,
)


class Batches:
    """The runner's launcher, on its loop: what it starts, and how a batch's call ends each of its jobs."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        executors: dict[str, Executor],
        db_now: Callable[[], float],
        execute: Callable[[Running], Coroutine[Any, Any, None]],
        ended: Callable[[list[Running]], None],
    ):
        """`execute(entry)`: the runner's run of one job on its own; `ended(entries)`: their work is over and each
        has its ending, to be written."""
        self.loop = loop
        self.executors = executors
        self.db_now = db_now
        self.execute = execute
        self.ended = ended
        # Jobs waiting for their target's first import (see _prepare), each with its timeout's timer, if any
        self._unprepared: dict[Running, asyncio.TimerHandle | None] = {}

    def launch(self, entries: list[Running], now: float, prepared: bool = False) -> None:
        batches: dict[tuple[str, str, float | None], list[Running]] = {}
        unknown: dict[tuple[str, str], list[Running]] = {}  # targets whose executor must look at them first
        sizes: dict[tuple[str, str], int | None] = {}  # (executor, target): its batch size, asked once a launch
        for entry in entries:
            job = entry.job
            target = job.executor, job.target
            if target not in sizes:
                sizes[target] = self._batch_size(target, prepared)
            size = sizes[target]
            if size != 0 and not self._may_join(entry, now):
                size = 0
            if size is None:
                unknown.setdefault(target, []).append(entry)
                continue
            if not size:
                entry.task = self.loop.create_task(self.execute(entry))
                continue
            key = (job.executor, job.target, job.timeout)
            batch = batches.setdefault(key, [])
            batch.append(entry)
            if len(batch) == size:
                self._launch_batch(batches.pop(key))
        for batch in batches.values():
            self._launch_batch(batch)
        for (name, unprepared), waiting in unknown.items():
            for entry in waiting:
                self._unprepared[entry] = (
                    self.loop.call_later(entry.job.timeout, self._ran_out, entry) if entry.job.timeout else None
                )
            self.loop.create_task(self._prepare(self.executors[name], unprepared, waiting))

    async def _prepare(self, executor: Executor, target: str, entries: list[Running]) -> None:
        """A target this node has not run yet: its executor looks at it once (imports it), then its jobs of this
        claim start, together if it is a batch function; if it cannot be looked at, each runs (and fails) alone.
        Meanwhile each job can be stopped or run out of time (see drop): an import that hangs holds none of them."""
        try:
            await executor.prepare(target)
        except (Exception, asyncio.CancelledError):  # said by each job's own run; cancelled: the runner is closing
            entries = self._prepared(entries)
            for entry in entries:
                entry.task = self.loop.create_task(self.execute(entry))
            return
        self.launch(self._prepared(entries), self.db_now(), prepared=True)

    def _prepared(self, entries: list[Running]) -> list[Running]:
        """Those of `entries` still waiting for their target's import (not dropped meanwhile), now waiting no more."""
        still = []
        for entry in entries:
            if entry in self._unprepared:
                timer = self._unprepared.pop(entry)
                if timer is not None:
                    timer.cancel()
                still.append(entry)
        return still

    def drop(self, entry: Running) -> None:
        """A job stopped while it waits for its target's first import ends at once, as stopped: its work has not
        begun (nothing of the job has run), and an import that hangs must not hold it, renewed, for ever."""
        if entry in self._unprepared:
            self._end_waiting(entry, stopped_end(entry.stop_reason))

    def _ran_out(self, entry: Running) -> None:
        """Its timeout passed while it waited for its target's first import: it times out, as its run would."""
        if entry in self._unprepared:
            entry.context.cancelled.set()
            self._end_waiting(entry, timed_out(entry.job))

    def _end_waiting(self, entry: Running, ending: RunEnd) -> None:
        timer = self._unprepared.pop(entry)
        if timer is not None:
            timer.cancel()
        entry.ending = ending
        self.ended([entry])

    def _batch_size(self, target: tuple[str, str], prepared: bool) -> int | None:
        """How many jobs one call of `target`'s function (executor name, target) takes: 0, its jobs run one a call;
        None, its executor must prepare it first (once `prepared`, one that still cannot say runs them alone)."""
        executor = self.executors.get(target[0])
        size = executor.batch_size(target[1]) if executor is not None else 0
        return 0 if size is None and prepared else size

    @staticmethod
    def _may_join(entry: Running, now: float) -> bool:
        """Whether a batch function's job may start now in a batch. What must wait first (its time, an older run of
        it) or need not run (stopped, exhausted) goes alone, through _execute, and so does a singleton: it runs until
        stopped, and would hold the others' ends back (a batch function's singleton is a batch of one)."""
        job, prior = entry.job, entry.prior
        if entry.stop_reason is not None or job.run_at > now or job.kind == Kind.SINGLETON or job.exhausted:
            return False
        if prior is not None:
            if not prior.recording:
                return False
            entry.prior = None
        return True

    def _launch_batch(self, batch: list[Running]) -> None:
        task = self.loop.create_task(self._execute_batch(batch))
        for entry in batch:
            entry.task, entry.batch = task, batch

    async def _execute_batch(self, batch: list[Running]) -> None:
        """One call of a batch function for `batch`'s jobs; each ends on its own: by its entry of the call's
        result, all by the call's error or timeout, or, if it was stopped meanwhile, as stopped (its entry of the
        result discarded)."""
        for entry in batch:
            entry.begun, entry.waiting = True, False
        stopped = [entry for entry in batch if entry.stop_reason is not None]  # between its claim and now
        if stopped:
            self._end_batch(stopped, None, None)
            batch = [entry for entry in batch if entry.stop_reason is None]
            for entry in batch:
                entry.batch = batch
            if not batch:
                return
        job = batch[0].job
        results: list[str | None | JobFailed] | None = None
        failure: RunEnd | None = None
        try:
            executor = executor_for(self.executors, job.executor)
            coro = executor.run_batch([entry.job for entry in batch], [entry.context for entry in batch])
            results = await bounded(coro, job.timeout)
        except OutOfTime:
            for entry in batch:
                entry.context.cancelled.set()
            failure = timed_out(job)
        except asyncio.CancelledError:  # every job of it was stopped (or the runner is closing): each ends as such
            failure = OWN_CANCEL if cancelled_itself() else None  # unless the call raised it itself
        except BaseException as exc:  # a SystemExit from the call too: it must not end the loop (see failed_end)
            failure = failed_end(exc)
        self._end_batch(batch, results, failure)

    def _end_batch(
        self,
        batch: list[Running],
        results: list[str | None | JobFailed] | None,
        failure: RunEnd | None,
    ) -> None:
        """Each job of a batch's ending: stopped (whatever the call did), else `failure` for all, else its own
        entry of `results`; no results and no failure: the call was cancelled, and each ends by its stop."""
        for index, entry in enumerate(batch):
            if entry.stop_reason is not None or (failure is None and results is None):
                entry.ending = stopped_end(entry.stop_reason)
            elif failure is not None:
                entry.ending = failure
            else:
                assert results is not None
                result = results[index]
                if isinstance(result, JobFailed):
                    entry.ending = failed_end(result)
                else:
                    entry.ending = Outcome.SUCCEEDED, None, result, False, None, False
        self.ended(batch)
