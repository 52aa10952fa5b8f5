"""Runs claimed jobs on an asyncio loop in its own thread, so any job can be cancelled.

Cancellation is how a node keeps its promises: a job past its timeout, a job
an operator cancelled, and every job of a node that lost contact with the
database for longer than its lease (self-fencing) are stopped here.

A run is known by its job and fence (RunKey), never by its job alone: a node can claim a job back (a new
fence) while its own stopped run of it (the old fence) is still ending, and each run must stay renewed and
stoppable until its own end is written. The newer run starts its work only once the older one's has ended,
so this machine never runs one job twice at once either.

A batch function's jobs (`@job(batch=N)`) that a claim brings together are run by one call, in one task
(batches.Batches), grouped by target and timeout, up to N at a time; each keeps its own entry, lease, fence,
attempt and end. Nothing waits for a batch to fill: a batch is what one claim brought, so a lone job starts at
once, in a batch of one. The call is one unit of work: stopping one of its jobs (a cancel, a lost lease) sets that
job's flag, and the job ends as stopped once the call returns, its result discarded; the call itself is cancelled
only when every one of its jobs is stopped, or by its timeout, which ends every job of it.
"""

import asyncio
import logging
import math
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from ..executors import Executor, JobContext, executor_for
from ..rules.job import Claimed
from ..rules.logs import about
from ..rules.states import Kind, Outcome
from ..store.stores import Store
from ..store.types import Progress
from ..tracing import NodeTracer
from .batches import Batches
from .flowcount import FlowCount
from .recorder import Recorder
from .runs import (
    EXHAUSTED,
    OWN_CANCEL,
    OutOfTime,
    RunKey,
    Running,
    bounded,
    cancelled_itself,
    failed_end,
    stopped_end,
    timed_out,
)
from .tally import Tally

log = logging.getLogger("queueprocessor.runner")

# How long a stopping runner lets the jobs it still holds end and their results be written (a stopped job's task,
# a write under way or waiting to try again) before it closes its loop.
LAST_WRITE = 5.0
PULSE = 0.25  # seconds between the loop's notes that it turns (see stalled_for)


def work_deadline(leased_at: float, leash: float) -> float:
    """When the work outside the node of a run leased at `leased_at` (the send time of its claim or last renewal) must
    be dead: `leash` seconds later (FarmTiming.leash; a runner given none holds no deadline). JobContext.deadline."""
    return leased_at + leash if leash < math.inf else math.inf


class JobRunner:
    """Owns the event loop thread and the set of jobs this node is running."""

    def __init__(
        self,
        store: Store,
        machine_id: int,
        executors: dict[str, Executor],
        db_now: Callable[[], float],
        on_done: Callable[[Claimed, Outcome], None],
        on_room: Callable[[], None] = lambda: None,
        tally: Tally | None = None,
        fenced_grace: float = 0.1,
        leash: float = math.inf,
        on_failure: Callable[[str], None] = lambda _why: None,
        flows: FlowCount | None = None,
        tracer: NodeTracer | None = None,
    ):
        """`on_done(job, outcome)` once a job's result is written; `on_room()` as soon as jobs' work is over,
        before that write (see room), and again once their results are written (one call for the jobs of a pass of
        the loop, or of a batch). `tally` counts claims, durations and endings for the node's metrics.
        `fenced_grace`: how long a job stopped for a lost lease may take to end by itself before it is forced
        (see JobContext.grace): its stop must be over before the lease runs out. `leash`: see work_deadline.
        `on_failure(why)` if the loop is interrupted (the node then stops, as when one of its threads dies).
        `flows` counts the written endings of queues with a breaker or an adaptive rate (see Recorder). `tracer`, on
        a tracing node only, makes each traced run's spans (docs/design.md §12)."""
        self.store = store
        self.machine_id = machine_id
        self._read_results = store.flows.results  # what a job's parents returned, read when it asks (JobContext)
        self.on_failure = on_failure
        self.tracer = tracer
        self._pulsed = time.monotonic()  # when the loop last turned (see _pulse)
        self.executors = executors
        self.db_now = db_now
        self.on_done = on_done
        self.on_room = on_room
        self.tally = tally or Tally()
        self.fenced_grace, self.leash = fenced_grace, leash
        self.running: dict[RunKey, Running] = {}
        self._newest: dict[int, Running] = {}  # job id -> its newest run in `running` (see submit_many)
        self._writing = 0  # entries of `running` whose work is over (recording)
        self._refusing: str | None = None  # a stop reason: runs submitted from now on are handed back at once
        self._no_singletons = False  # draining: singletons submitted from now on are handed back at once
        # The jobs whose work is over since the last _report_worked, and the seconds each worked.
        self._worked: list[Claimed] = []
        self._worked_for: list[float] = []
        self._lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, name="qp-runner", daemon=True)
        self.recorder = Recorder(self.loop, store, machine_id, db_now, self.working, self._written, flows)
        self.batches = Batches(self.loop, executors, db_now, self._execute, self._ended)

    def start(self) -> None:
        self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._pulse)
        while True:
            try:
                self.loop.run_forever()
                break
            except BaseException:  # a task let a SystemExit or KeyboardInterrupt through: the loop itself is sound
                log.exception("the runner's event loop was interrupted; stopping this node")
                self.on_failure("the runner's event loop was interrupted")
        self.loop.run_until_complete(self._wind_down(LAST_WRITE))
        for executor in self.executors.values():
            closer = getattr(executor, "close", None)
            if closer:
                self.loop.run_until_complete(closer())
        self.loop.close()

    def _pulse(self) -> None:
        """Note that the loop turns (see stalled_for); again in PULSE seconds."""
        self._pulsed = self.loop.time()
        self.loop.call_later(PULSE, self._pulse)

    def stalled_for(self) -> tuple[float, str | None]:
        """How long the loop has not turned beyond its pulse (0: it turns), and, if it has not, where its thread is:
        an `async def` job that blocks the loop (CPU work, time.sleep, a blocking call) holds up every stop of
        an HTTP call or a coroutine on this node (docs/design.md §3), which the watchdog says aloud."""
        late = time.monotonic() - self._pulsed - PULSE
        if late <= 0 or self.thread.ident is None:
            return 0.0, None
        frame = sys._current_frames().get(self.thread.ident)
        return late, None if frame is None else "".join(traceback.format_stack(frame)[-3:]).strip()

    async def _wind_down(self, timeout: float) -> None:
        """On the stopped loop, before it closes: the jobs still held end and their results are written, for up to
        `timeout` seconds (stop() often comes right after stop_all(), and a job takes passes of the loop to stop).
        Then what is left is cancelled, and each job still held is named: its lease will expire. A task left
        pending would be destroyed with the loop ("Task was destroyed but it is pending"), its result lost."""
        deadline = self.loop.time() + timeout
        while (self.count() or self._others()) and self.loop.time() < deadline:
            await asyncio.sleep(0.01)
        for job_id, _fence in self.held():
            log.warning(
                "could not record job %s before stopping; its lease will expire and it will be re-run",
                job_id,
                extra=about(job_id),
            )
        while tasks := self._others():  # a job's task cancelled here hands its result to a new writer: once more
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)

    def _others(self) -> set[asyncio.Task[Any]]:
        return asyncio.all_tasks(self.loop) - {asyncio.current_task(self.loop)}

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    # -- called from other threads ----------------------------------------

    def count(self) -> int:
        """Jobs held: working, or writing how they ended."""
        with self._lock:
            return len(self.running)

    def working(self) -> int:
        """Jobs whose work is still going on."""
        with self._lock:
            return len(self.running) - self._writing

    def room(self, capacity: int) -> int:
        """How many more jobs may start. `capacity` limits the jobs at work, not those only writing their
        result, so the next claim overlaps that write instead of waiting for it; at most `capacity` may be
        writing (a database slow to take results slows the claims too)."""
        with self._lock:  # called twice per job while a backlog is worked off: one look at both counts
            held = len(self.running)
            working = held - self._writing
        return min(capacity - working, 2 * capacity - held)

    def held(self) -> list[RunKey]:
        with self._lock:
            return list(self.running)

    def held_in(self, queue: str) -> int:
        """How many jobs of `queue` we hold (a machine's own limit for a queue counts them until their end is
        written, as the database does)."""
        with self._lock:
            return sum(1 for r in self.running.values() if r.job.queue == queue)

    def leases(self) -> list[tuple[RunKey, float]]:
        """(run, monotonic send time of its claim or its last renewal) for every run we hold."""
        with self._lock:
            return [(key, r.leased_at) for key, r in self.running.items()]

    def progress_news(self) -> dict[RunKey, tuple[JobContext, Progress]]:
        """The runs whose job reported progress not yet written, each with its context and latest report."""
        with self._lock:
            found = ((key, r.context, r.context.reported) for key, r in self.running.items())
            return {key: (context, p) for key, context, p in found if p is not None and p is not context.told}

    def renewed(self, runs: list[RunKey], sent: float) -> None:
        """These runs' leases were renewed by a statement sent at `sent` (monotonic): their leases run from no
        earlier. Only the runs it renewed: one claimed while it was on its way is not credited with it."""
        with self._lock:
            for entry in (renewed := [e for k in runs if (e := self.running.get(k)) and e.leased_at < sent]):
                entry.leased_at = sent
        for entry in renewed:  # from the heartbeat's thread: a blocked loop cannot keep a renewal from their work
            entry.context.renewed(work_deadline(sent, self.leash))

    def submit(self, job: Claimed, leased_at: float = float("-inf")) -> None:
        self.submit_many([job], leased_at)

    def submit_many(self, jobs: list[Claimed], leased_at: float = float("-inf"), slot: int | None = None) -> None:
        """Start a claim's jobs: one wake-up of the loop for all of them. A job we still hold a run of (stopped,
        and ending) gets a run of its own beside it, which starts once the older run's work is over. A claim that
        comes after refuse() (a stop) or, for singletons, after release_singletons() (a drain) is handed back.
        `slot`: the turn that claimed them, if one did (a traced run's claim span names it)."""
        deadline = work_deadline(leased_at, self.leash)
        contexts = [JobContext(j.id, j.attempts, j.fence, self.machine_id, self._results, deadline) for j in jobs]
        entries = [Running(job, context, leased_at) for job, context in zip(jobs, contexts, strict=True)]
        with self._lock:
            for entry in entries:
                entry.prior = self._newest.get(entry.job.id)
                self._newest[entry.job.id] = entry
                self.running[entry.key] = entry
                if self._refusing is not None:
                    entry.stop_reason = self._refusing
                elif self._no_singletons and entry.job.kind == Kind.SINGLETON:
                    entry.stop_reason = "released"
        if self.tracer is not None:  # held (renewed) meanwhile; before any starts: its work gets its span's context
            self.tracer.claimed(entries, leased_at, slot, self.store.jobs.traceparents)
        self.tally.claimed(jobs)
        self.loop.call_soon_threadsafe(self._launch_many, entries)

    def refuse(self, reason: str) -> None:
        """From now on hand back every job submitted, with `reason` (see stop_job): the node is stopping, and a
        turn still under way may yet claim some."""
        with self._lock:
            self._refusing = reason

    def stop_job(self, key: RunKey, reason: str) -> bool:
        """Stop a run: reason 'cancelled' (operator), 'lost' (lease gone or fenced off), 'released' (handed back
        to the farm) or 'exit' (handed back: the operator stopped the node at once). False if there was nothing
        left to stop. A run stopped for a lost lease is given `fenced_grace` to end before it is forced."""
        with self._lock:
            entry = self.running.get(key)
            if entry is None or entry.stop_reason is not None or entry.recording:
                return False
            entry.stop_reason = reason
        entry.context.stop(self.fenced_grace if reason == Outcome.LOST else None)  # its work outside, from here
        self.loop.call_soon_threadsafe(self._cancel, entry)
        return True

    def _cancel(self, entry: Running) -> None:
        # A task cancelled before its first step never enters _execute, so the job would stay
        # running (and renewed) forever; one not begun yet sees stop_reason when it begins. One whose
        # work ended after stop_job() looked is writing its result: cancelling that write would lose it
        # (both run on this loop, so `recording` cannot change under this look). A batch's call is cancelled only
        # once every job of it is stopped: the others' work goes on, and this one ends when the call returns. One
        # waiting for its target's first import (not begun: its executor has not seen it) ends at once.
        if not entry.begun:
            self.batches.drop(entry)
        elif not entry.recording:
            if entry.batch is not None and any(other.stop_reason is None for other in entry.batch):
                return
            assert entry.task is not None  # begun: its task runs _execute
            entry.task.cancel()

    def release_singletons(self) -> None:
        """Hand our singletons back, and any claimed from now on: they never finish, so a leaving machine must
        give them up (a turn already past its look at our state may still claim one)."""
        with self._lock:
            self._no_singletons = True
            keys = [key for key, entry in self.running.items() if entry.job.kind == Kind.SINGLETON]
        for key in keys:
            self.stop_job(key, "released")

    def hand_back_waiting(self, reason: str) -> None:
        """Hand back the runs whose work has not begun (their time, our older run of the job): a paused or draining
        machine keeps none (docs/design.md §7). Looked at on the loop, where work begins: none is cut short. One
        that waits for our older run of its job is handed back once that run's work is over (see _after_prior)."""
        self.loop.call_soon_threadsafe(self.stop_all, reason, True)

    def stop_all(self, reason: str, waiting: bool = False) -> None:
        """Stop every run we hold (with `waiting`, those whose work has not begun)."""
        with self._lock:
            keys = [key for key, entry in self.running.items() if entry.waiting or not waiting]
        for key in keys:
            self.stop_job(key, reason)

    def _results(self, job_id: int) -> dict[str | int, Any]:
        """JobContext.results: a database read, refused on the loop's own thread, where it would hold up every job
        of the node and every stop (an `async def` job calls it through asyncio.to_thread)."""
        if threading.get_ident() == self.thread.ident:
            raise RuntimeError(
                "context.results() reads the database and would block every job of this node: in an async def "
                "job, call it as `await asyncio.to_thread(context.results)`"
            )
        return self._read_results(job_id)

    # -- on the loop ------------------------------------------------------

    def _launch_many(self, entries: list[Running]) -> None:
        # One reading for the claim's jobs: each starts now, or sleeps until its run_at; a batch function's jobs
        # that can start now go together, by target and timeout, up to its batch size per call.
        now, began = self.db_now(), self.loop.time()
        for entry in entries:
            entry.started, entry.began = now, began
        self.batches.launch(entries, now)

    async def _execute(self, entry: Running) -> None:
        job = entry.job
        marking = None  # the write of its real start, for a job claimed ahead of its time
        try:
            entry.begun = True
            if entry.prior is not None:
                await self._after_prior(entry)
            if entry.stop_reason is not None:
                raise asyncio.CancelledError
            if job.exhausted:
                ending = EXHAUSTED
            else:
                executor = executor_for(self.executors, job.executor)
                if early := job.run_at > entry.started:  # claimed early: start exactly at run_at in database time
                    await executor.warm(job)  # what its first run would load, loaded while it waits
                    await asyncio.sleep(job.run_at - self.db_now())
                if entry.stop_reason is not None:  # handed back while it waited (see hand_back_waiting)
                    raise asyncio.CancelledError
                entry.waiting = False
                if early:
                    marking = self.loop.run_in_executor(None, self._mark_started, job)
                    entry.started, entry.began = self.db_now(), self.loop.time()
                output = await bounded(executor.run(job, entry.context), job.timeout)
                ending = Outcome.SUCCEEDED, None, output, False, None, False
        except OutOfTime:
            entry.context.cancelled.set()
            ending = timed_out(job)
        except asyncio.CancelledError:
            ending = OWN_CANCEL if entry.stop_reason is None and cancelled_itself() else stopped_end(entry.stop_reason)
        except BaseException as exc:  # a SystemExit from the work too: it must not end the loop (see failed_end)
            ending = failed_end(exc)
        self._writing_results([entry])
        if marking is not None:  # the run's row takes its start from the job's row when it ends: written first
            await asyncio.wait({marking})
        entry.ending = ending
        if self.tracer is not None:
            self.tracer.ended([entry])
        self.recorder.record([entry])  # the job's task ends here: the writer sees its result through

    async def _after_prior(self, entry: Running) -> None:
        """Wait until our older run of this job (stopped: its fence is out of date) has stopped working, so the
        job never runs twice at once here. Meanwhile the new run is held, renewed and stoppable like any other, but
        a stop does not cut this wait short: the run ends (and its job is handed back, or taken by another machine)
        only once the older run's work is over. The older run waited for its own older one in turn, so the wait
        covers every run of the job this machine still has at work."""
        prior, entry.prior = entry.prior, None
        if prior is None or prior.recording:
            return
        log.info(
            "job %s claimed again (fence %s) while its stopped run (fence %s) is still ending: it starts once "
            "that run has",
            entry.job.id,
            entry.job.fence,
            prior.job.fence,
            extra=about(entry.job.id),
        )
        stopped = False
        while not prior.recording:
            if prior.over is None:
                prior.over = self.loop.create_future()
            try:
                await asyncio.shield(prior.over)
            except asyncio.CancelledError:
                stopped = True  # said once the older run's work is over
        if stopped:
            raise asyncio.CancelledError

    def _ended(self, entries: list[Running]) -> None:
        """The work of a batch's jobs is over and each has its ending: they make room, and their ends are written."""
        self._writing_results(entries)
        if self.tracer is not None:
            self.tracer.ended(entries)
        self.recorder.record(entries)

    def _writing_results(self, entries: list[Running]) -> None:
        """Their work is over: they no longer count against capacity (see room), only their results are to be
        written. The tally and the node hear of it once per pass of the loop, for every job that ended in that
        pass."""
        with self._lock:
            for entry in entries:
                entry.recording = True
            self._writing += len(entries)
        first = not self._worked
        now = self.loop.time()
        for entry in entries:  # a loop, not comprehensions: most often a one-call job's one entry
            self._worked.append(entry.job)
            self._worked_for.append(now - entry.began)
            if entry.over is not None:  # a newer run of its job waits for this one's work to be over
                entry.over.set_result(None)
        if first:
            self.loop.call_soon(self._report_worked)

    def _report_worked(self) -> None:
        jobs, seconds = self._worked, self._worked_for
        self._worked, self._worked_for = [], []
        self.tally.ran(jobs, seconds)
        self.on_room()

    def _mark_started(self, job: Claimed) -> None:
        try:
            self.store.runs.mark_started(job)
        except Exception as exc:  # only the history's start time is at stake
            log.warning("could not record the start of job %s: %s", job.id, exc, extra=about(job.id))

    def _written(self, done: list[tuple[Running, Outcome]]) -> None:
        """Jobs whose end is written (or given up on) leave `running`; the tally and the node hear of them, and
        of the room made, once for the batch."""
        with self._lock:
            for entry, _ in done:
                del self.running[entry.key]
                if self._newest.get(entry.job.id) is entry:
                    del self._newest[entry.job.id]
            self._writing -= len(done)
        if self.tracer is not None:
            self.tracer.written([entry for entry, _ in done])
        self.tally.ended([entry.job for entry, _ in done], [outcome for _, outcome in done])
        for entry, outcome in done:
            self.on_done(entry.job, outcome)
        self.on_room()
