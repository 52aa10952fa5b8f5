"""The executor interface: how a node runs one kind of work.

An executor validates a job before it is stored (bad work is refused at the
door with a clear reason) and again when it runs (allow-lists are the running
node's). `run` is a coroutine so a timeout or a lost lease can cancel it.
"""

import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, NoReturn

from ..rules.job import Claimed, JobSpec
from ..rules.limits import SNOOZE_CAP
from ..store.types import Progress
from .warden import Leash

Results = Callable[[int], dict[str | int, Any]]  # a job id -> what its parents returned (store.flows.FlowStore)
STOP_GRACE = 1.0  # seconds a stopped job gets to end by itself before it is forced or reported (JobContext.grace)


class JobContext:
    """What a running job may know about itself; `cancelled` is set when it must stop.

    The flag is made on first use, by the job or by whoever stops it: most jobs never look at it, and an Event
    (a lock and a condition) cost a busy node a twentieth of its time per job. `grace` is how long the job may
    take to end by itself once told: the runner shortens it for a job whose lease is being lost, whose stop must be
    over before another machine may take the job. `deadline` (time.monotonic()) is when work the job runs outside
    the node must be dead, pushed back by each renewal of its lease (see JobRunner.renewed); `leash`, the warden's
    hold on such work (a command's process group), through which the runner extends and stops it from any thread."""

    __slots__ = (
        "job_id",
        "attempt",
        "fence",
        "machine_id",
        "grace",
        "_cancelled",
        "_results",
        "reported",
        "told",
        "deadline",
        "leash",
        "traceparent",
    )
    _making = threading.Lock()  # two threads asking for the flag at once get the same one

    def __init__(
        self,
        job_id: int,
        attempt: int,
        fence: int,
        machine_id: int,
        results: Results | None = None,
        deadline: float = math.inf,
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.fence = fence
        self.machine_id = machine_id
        self.traceparent: str | None = None  # its run's span on a tracing node (docs/design.md §12)
        self.grace = STOP_GRACE
        self._cancelled: threading.Event | None = None
        self._results = results
        self.reported: Progress | None = None  # the latest progress the job reported
        self.told: Progress | None = None  # the last one written to the database (set by the heartbeat)
        self.deadline = deadline
        self.leash: Leash | None = None  # set by the executor once its work outside the node is held

    def results(self) -> dict[str | int, Any]:
        """What the jobs this one runs after returned (`after=`, a workflow's parent steps): by step name in a
        workflow, else by job id; None for one that did not succeed. Read from the database when asked (a
        blocking read: an async function calls it through asyncio.to_thread)."""
        return {} if self._results is None else self._results(self.job_id)

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far the job is: `fraction` from 0 to 1, and a short message. Costs no database write here:
        the node's next heartbeat writes the latest report with the lease renewal (at most one a heartbeat, about
        a second), fenced like every write of the run (docs/design.md §3)."""
        self.reported = Progress.of(fraction, message)

    def snooze(self, seconds: float, reason: str | None = None) -> NoReturn:
        """End this run now, asking to be run again `seconds` from now (at most a day) without spending an attempt:
        raises Snooze, which the job lets through (sync, async or batch function alike; a batch function may
        instead return `Snooze(seconds)` as one job's entry). `reason` goes into the run's record. A job snoozes at
        most MAX_SNOOZES (50) times: the next snooze fails its run, spending an attempt."""
        raise Snooze(seconds, reason or "snoozed by the job")

    def stop(self, grace: float | None = None) -> None:
        """Tell the job to stop, from any thread (`grace`: a shorter time to end by itself, for a lost lease): its
        flag, and its work outside the node at once, through its leash (the runner's loop may be blocked)."""
        if grace is not None:
            self.grace = grace
        self.cancelled.set()
        if self.leash is not None:
            self.leash.stop(self.grace)

    def renewed(self, deadline: float) -> None:
        """Its lease was renewed: its work outside the node may live until `deadline`, told its leash at once."""
        self.deadline = deadline
        if self.leash is not None:
            self.leash.extend(deadline)

    @property
    def cancelled(self) -> threading.Event:
        if self._cancelled is None:
            with self._making:
                if self._cancelled is None:
                    self._cancelled = threading.Event()
        return self._cancelled


class JobFailed(Exception):
    """The work ran and did not succeed; the message is the run's error, `output` what it printed.
    `permanent`: no retry could succeed (the callable does not exist, the host is not allowed), so the job
    fails at once instead of backing off through its attempts. `throttled`: the target answered 429 or 503 (read
    by whatever slows a queue down for its targets' sake: rules.job.Ending.throttled)."""

    def __init__(self, message: str, output: str | None = None, permanent: bool = False, throttled: bool = False):
        super().__init__(message)
        self.output = output
        self.permanent = permanent
        self.throttled = throttled


def seconds_text(seconds: float) -> str:
    """Seconds as a run's record says them: `30`, `1.5`, `86400`."""
    return f"{seconds:.3f}".rstrip("0").rstrip(".")


class Snooze(JobFailed):
    """The run ends asking to be put back in the queue `delay` seconds from now without spending an attempt
    (docs/design.md §9): raised by context.snooze, by the HTTP executor for a 429 or 503 with Retry-After and by the
    command executor for exit code 75; a batch function may return one as a job's entry, for that job alone. A
    JobFailed, so that whatever ends a run with one (a batch's entries, a call's failure) carries it unchanged.
    `delay` is cut to SNOOZE_CAP, the message saying so; a job that has snoozed MAX_SNOOZES times already fails
    instead, spending an attempt (RunStore.finish_many)."""

    def __init__(
        self, delay: float, reason: str = "snoozed by the job", output: str | None = None, throttled: bool = False
    ):
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not delay >= 0 or math.isnan(delay):
            raise ValueError(f"a snooze is a number of seconds from 0 (got {delay!r})")
        asked, self.delay = float(delay), min(float(delay), SNOOZE_CAP)
        cut = f" (the cap: it asked {seconds_text(asked)} s)" if asked > SNOOZE_CAP else ""
        super().__init__(f"{reason}; back in {seconds_text(self.delay)} s{cut}", output, throttled=throttled)


OUTPUT_LIMIT = 4000  # characters of output kept with a run (the end: that is where errors are)


def excerpt(text: str | None) -> str | None:
    if not text:
        return None
    return text if len(text) <= OUTPUT_LIMIT else "…" + text[-OUTPUT_LIMIT:]


class Executor(ABC):
    name: str

    @abstractmethod
    def validate(self, spec: JobSpec) -> None:
        """Raise InvalidJob with a clear reason if this node would refuse to run `spec`."""

    @abstractmethod
    async def run(self, job: Claimed, context: JobContext) -> str | None:
        """Do the work. Return an output excerpt; raise JobFailed (or anything) when it fails."""

    def batch_size(self, target: str) -> int | None:
        """The most jobs of `target` one run_batch call takes; 0: its jobs run one per run() (the default); None:
        not known until prepare(target) has been awaited."""
        return 0

    async def prepare(self, target: str) -> None:
        """Learn what batch_size needs to know about `target` (a Python executor imports it). Raises what run()
        would fail with: the runner then runs its jobs one by one, to fail each with it."""
        return None

    async def run_batch(self, jobs: list[Claimed], contexts: list[JobContext]) -> list[str | None | JobFailed]:
        """Do the work of `jobs` (one target, at most batch_size) in one call: each job's output excerpt, or the
        JobFailed that fails it alone; raise (JobFailed or anything) to fail them all."""
        raise NotImplementedError(f"{self.name} jobs do not run in batches")

    async def warm(self, job: Claimed) -> None:
        """`job` was claimed ahead of its time and waits for it (a schedule's occurrence): load meanwhile what
        its first run would load (a client library, its module), so that run starts on time instead of that
        load late. Never fails: what goes wrong is for the run to report. Here: nothing to load."""
        return None
