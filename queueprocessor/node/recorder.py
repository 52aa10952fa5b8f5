"""Writing how runs ended: the runner's group commit (see Recorder), and the hand-back of runs it stopped itself.

A run leaves the runner's `running` (its lease no longer renewed) only once its end is written, or given up on
after RECORD_RETRIES: until then its job is ours, so a finished job is not run again elsewhere.
"""

import asyncio
import logging
from collections.abc import Callable

from ..rules.job import Ending
from ..rules.logs import about
from ..rules.states import Outcome
from ..store.stores import Store
from .flowcount import FlowCount
from .runs import Running, retry_in

log = logging.getLogger("queueprocessor.runner")

# Pauses between tries to write a result while the database is away (a restart, a failover): the job
# stays ours meanwhile, its lease renewed by every heartbeat that gets through, so a finished job is
# not run again elsewhere; its fence refuses a late write if someone took it over after all.
RECORD_RETRIES = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
# A busy node's results wait up to LINGER seconds for others, while fewer than LINGER_UNTIL are waiting and at
# least as many jobs are still at work: slow jobs (HTTP) end a few at a time, and each write has a fixed cost.
LINGER = 0.005
LINGER_UNTIL = 16


class Recorder:
    """Group commit, on the runner's loop: results that arrive while one batch is being written go
    together in the next, so a busy node writes many results per transaction and an idle one waits for none.
    The writes themselves (record_many) run in a thread of the loop's executor.

    It is given what it uses of its runner, not the runner: `working()`, how many jobs are at work (whether to
    linger), and `written(done)`, told of the runs whose end is written or given up on; and `flows`, which counts
    each written batch for the queues with a breaker or an adaptive rate."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        store: Store,
        machine_id: int,
        db_now: Callable[[], float],
        working: Callable[[], int],
        written: Callable[[list[tuple[Running, Outcome]]], None],
        flows: FlowCount | None = None,
    ):
        self.loop, self.store, self.machine_id, self.db_now = loop, store, machine_id, db_now
        self.working, self.written = working, written
        self.flows = flows  # counts endings for the queues with a breaker or an adaptive rate
        self.waiting: list[Running] = []  # ended, their `ending` not written yet
        self.busy = False
        self.task: asyncio.Task[None] | None = None  # the writer (_write), while busy
        self._lingering: asyncio.Future[None] | None = None  # resolved when the linger is over (see _linger)

    def record(self, entries: list[Running]) -> None:
        """Write each entry's `ending` with the next batch. Nobody waits for it: the writer tries again by itself
        while the database is away, and a job leaves `running` (its lease no longer renewed) once it is written."""
        self.waiting += entries
        if not self.busy:
            self.busy = True
            self.task = self.loop.create_task(self._write())
        elif len(self.waiting) >= LINGER_UNTIL and self._lingering is not None:
            self._linger_over()

    async def _linger(self) -> None:
        """More results are on their way: wait for them, up to LINGER, or until LINGER_UNTIL are waiting (fast
        jobs fill a batch in well under LINGER, and the results a node holds unwritten count against its room)."""
        self._lingering = self.loop.create_future()
        timer = self.loop.call_later(LINGER, self._linger_over)
        await self._lingering
        timer.cancel()
        self._lingering = None

    def _linger_over(self) -> None:
        if self._lingering is not None and not self._lingering.done():
            self._lingering.set_result(None)

    async def _write(self) -> None:
        try:
            while self.waiting:
                if len(self.waiting) < LINGER_UNTIL and self.working() >= LINGER_UNTIL:
                    await self._linger()
                batch, self.waiting = self.waiting, []
                loop = self.loop
                for entry in await loop.run_in_executor(None, self.record_many, batch):
                    loop.call_later(RECORD_RETRIES[entry.tries], self.record, [entry])
                    entry.tries += 1
        finally:
            self.busy = False

    def record_many(self, entries: list[Running]) -> list[Running]:
        """Write how runs ended, all finishes in one transaction. Returns those to try again later: the
        database is away (unless it was their last try)."""
        again: list[Running] = []
        done: list[tuple[Running, Outcome]] = []
        ending: list[Running] = []
        for entry in entries:
            assert entry.ending is not None  # recorded with its ending (see Recorder.record)
            if entry.ending[0] != Outcome.LOST:
                ending.append(entry)
            elif self.release(entry):
                done.append((entry, Outcome.LOST))
            else:
                again.append(entry)
        endings = []
        now = self.db_now()  # read once for the batch: a singleton's back-off is all that uses it (see retry_in)
        for entry in ending:
            assert entry.ending is not None
            outcome, error, output, final, snooze, throttled = entry.ending
            retry = retry_in(entry, outcome, final, now, snooze)
            endings.append(Ending(entry.job, outcome, error, retry, output, throttled))
        try:
            states = self.store.runs.finish_many(self.machine_id, endings)
        except Exception as exc:  # database away: try again; in the end the lease expires and it runs elsewhere
            for entry in ending:
                if entry.tries < len(RECORD_RETRIES):
                    log.warning(
                        "could not record job %s yet (%s); trying again", entry.job.id, exc, extra=about(entry.job.id)
                    )
                    again.append(entry)
                else:
                    log.warning(
                        "could not record job %s (%s); its lease will expire and it will be re-run",
                        entry.job.id,
                        exc,
                        extra=about(entry.job.id),
                    )
                    done.append((entry, Outcome.LOST))
        else:
            if self.flows is not None:
                self.flows.written(endings, states)
            debug = log.isEnabledFor(logging.DEBUG)
            for entry, state in zip(ending, states):
                assert entry.ending is not None
                job, (outcome, error, *_) = entry.job, entry.ending
                if state is None:
                    log.warning(
                        "result of job %s refused by its fence: another machine owns it now",
                        job.id,
                        extra=about(job.id),
                    )
                elif debug or outcome != Outcome.SUCCEEDED:  # thousands a second on a busy node: successes at debug
                    level = logging.DEBUG if outcome == Outcome.SUCCEEDED else logging.INFO
                    log.log(
                        level,
                        "job %s attempt %s %s -> %s%s",
                        job.id,
                        job.attempts,
                        outcome,
                        state,
                        f" ({error})" if error else "",
                        extra=about(job.id),
                    )
                done.append((entry, outcome if state else Outcome.LOST))
        self.written(done)
        return again

    def release(self, entry: Running) -> bool:
        """We stopped it ourselves; hand it back if it is still ours (it usually is not). False: try again."""
        assert entry.ending is not None and entry.ending[1] is not None  # a run we stopped says why
        job, error = entry.job, entry.ending[1]
        try:
            if self.store.runs.release(job, self.machine_id, error):
                log.info("job %s handed back to the queue: %s", job.id, error, extra=about(job.id))
        except Exception as exc:
            if entry.tries < len(RECORD_RETRIES):
                log.warning("could not hand job %s back yet (%s); trying again", job.id, exc, extra=about(job.id))
                return False
            log.warning("could not hand job %s back (%s); its lease will expire", job.id, exc, extra=about(job.id))
        return True
