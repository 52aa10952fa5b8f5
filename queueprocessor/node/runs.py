"""A run this node holds: one job under one fence, from its claim until its end is written (see runner)."""

import asyncio
import random
from collections.abc import Awaitable
from typing import Any, TypeVar

from ..executors import JobContext, JobFailed, Snooze
from ..rules.errors import NotAllowed, QPError
from ..rules.job import Claimed
from ..rules.states import Kind, Outcome

RunKey = tuple[int, int]  # (job id, fence): one run of a job, as every write of it is guarded

# Errors recorded for work this node stopped on purpose (any other stop: the lease was lost).
STOPPED: dict[str | None, str] = {
    Outcome.CANCELLED: "cancelled by an operator",
    "released": "handed back: its machine is leaving the farm",
    "paused": "handed back before it started: its machine was paused",
    "exit": "handed back unfinished: the operator stopped its machine (no attempt spent)",
}
LOST_LEASE = "stopped: this machine lost its lease"

# How a run ended: outcome, error, output, failed for good, a snooze's delay (SNOOZED only), throttled (its target
# answered 429 or 503: Ending.throttled).
RunEnd = tuple[Outcome, str | None, str | None, bool, float | None, bool]
T = TypeVar("T")


# A job claimed back from a lost lease on its last attempt: failed, not run.
EXHAUSTED: RunEnd = (
    Outcome.FAILED,
    "lease lost on its last attempt (its machine died or was cut off)",
    None,
    False,
    None,
    False,
)


def stopped_end(stop_reason: str | None) -> RunEnd:
    """How a run this node stopped ends: cancelled by an operator, else lost (handed back, or its lease gone)."""
    outcome = Outcome.CANCELLED if stop_reason == Outcome.CANCELLED else Outcome.LOST
    return outcome, STOPPED.get(stop_reason, LOST_LEASE), None, False, None, False


def timed_out(job: Claimed) -> RunEnd:
    return Outcome.TIMEOUT, f"stopped after its timeout of {job.timeout:g} s", None, False, None, False


def failed_end(error: BaseException) -> RunEnd:
    """How a run whose work raised `error` ends: a JobFailed as it says; a refusal by this node's allow-lists as a
    failure a retry may mend (it may land on a machine that allows it); any other refusal by this node (an unknown
    executor, a malformed target) for good; anything else as a failure a retry may mend (a bad job fails alone; the
    node goes on), a SystemExit or KeyboardInterrupt included: work that tries to end the node's process ends only
    its own run. A Snooze ends it snoozed, for its delay."""
    if isinstance(error, Snooze):
        return Outcome.SNOOZED, str(error), error.output, False, error.delay, error.throttled
    if isinstance(error, JobFailed):
        return Outcome.FAILED, str(error), error.output, error.permanent, None, error.throttled
    if isinstance(error, NotAllowed):
        return Outcome.FAILED, f"{error} (a retry may run on a machine that allows it)", None, False, None, False
    if isinstance(error, QPError):
        return Outcome.FAILED, str(error), None, True, None, False
    return Outcome.FAILED, f"{type(error).__name__}: {error}", None, False, None, False


# A CancelledError the work raised itself: a failure like any other. Taken for a stop, it would be handed back with
# its attempt refunded, and run again for ever.
OWN_CANCEL: RunEnd = (
    Outcome.FAILED,
    "asyncio.CancelledError raised by the job itself (it awaited something that was cancelled), not a stop by its "
    "node: catch it in the job, or let it fail",
    None,
    False,
    None,
    False,
)


def cancelled_itself() -> bool:
    """Whether the CancelledError just caught in a run's task came from its work alone: when this node cancels the
    task (a stop, the job's timeout, the runner closing), the task is being cancelled."""
    task = asyncio.current_task()
    return task is not None and not task.cancelling()


class OutOfTime(Exception):
    """A run's work was cut off by the job's own timeout (see bounded)."""


async def bounded(work: Awaitable[T], timeout: float | None) -> T:
    """`work`, cut off after `timeout` seconds (None or 0: never). Only that cut raises OutOfTime: a TimeoutError
    the work raises itself (a socket's, a client library's) is its own failure, not the job's timeout."""
    if not timeout:
        return await work
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            return await work
    except TimeoutError:
        if scope.expired():
            raise OutOfTime from None
        raise


class Running:
    """A job this node holds, from its claim until its end is written (a busy node makes thousands a second:
    slots, and its ending kept here rather than in an object of its own)."""

    __slots__ = (
        "job",
        "key",
        "context",
        "task",
        "stop_reason",
        "recording",
        "begun",
        "leased_at",
        "started",
        "began",
        "ending",
        "tries",
        "prior",
        "batch",
        "waiting",
        "over",
        "trace",
    )

    def __init__(self, job: Claimed, context: JobContext, leased_at: float = float("-inf")):
        self.job = job
        self.key: RunKey = (job.id, job.fence)
        self.context = context
        self.task: asyncio.Task[None] | None = None
        self.stop_reason: str | None = None  # why we cancelled it: CANCELLED, LOST, "released" or "exit"
        self.recording = False  # the work is over; only its result is being written
        self.begun = False  # _execute has started, so a cancellation reaches its handlers
        self.leased_at = leased_at  # monotonic send time of its claim or of the last renewal that renewed it
        self.started = 0.0
        self.began = 0.0  # the loop's (monotonic) time at `started`: its work's duration is measured from here
        self.ending: RunEnd | None = None
        self.tries = 0  # writes of its ending that the database was away for
        self.prior: Running | None = None  # this machine's older run of the same job, still held at our claim
        self.batch: list[Running] | None = None  # the runs of its batch function's call (one task: `task`), if any
        self.waiting = True  # claimed, its work not begun: waiting for its launch, its time or an older run of it
        # Resolved once its work is over (`recording`): made when a newer run of its job must wait for that
        self.over: asyncio.Future[None] | None = None
        self.trace: Any = None  # on a tracing node, its span going on: process, then settle (tracing.NodeTracer)


SINGLETON_SETTLED = 10.0  # seconds a singleton must run before it counts as having started well


def backoff(attempt: int, base: float = 1.0, cap: float = 300.0) -> float:
    """Seconds before retry number `attempt`: exponential with equal jitter (AWS's name for it): the step
    doubles up to `cap`, and the wait is drawn between half the step and the whole, so failures that came
    together spread out, yet no retry comes at once."""
    step: float = min(cap, base * 2 ** (attempt - 1))
    return random.uniform(0.5, 1.0) * step


def retry_in(entry: Running, outcome: str, final: bool, now: float, snooze: float | None = None) -> float | None:
    """When to run the job again: a snoozed job after its `snooze` delay; failures back off; a singleton restarts
    whenever it ends, quickly after a long run, slowly when it keeps ending at once. Work that failed for good
    (`final`) never runs again."""
    if snooze is not None:
        return snooze
    if final:
        return None
    if entry.job.kind == Kind.SINGLETON and outcome != Outcome.CANCELLED:
        return backoff(1) if now - entry.started >= SINGLETON_SETTLED else backoff(4)
    return backoff(entry.job.attempts) if outcome in (Outcome.FAILED, Outcome.TIMEOUT) else None
