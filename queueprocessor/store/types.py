"""The plain data the store takes and gives: a job to enqueue, a job claimed, how a run ended, what a claim and a
turn take from which queues, what a turn found, and how far a run is."""

from dataclasses import dataclass
from typing import Any, NamedTuple

from ..rules.limits import MAX_ATTEMPTS, PROGRESS_NOTE
from ..rules.queues import DEFAULT
from ..rules.states import JobState, Kind, Outcome


class Claimed(NamedTuple):
    """A job this machine now owns, with the fence token every later write must quote (a tuple: a busy node makes
    thousands a second, straight from the claim's rows)."""

    id: int
    executor: str
    target: str
    method: str
    payload: str | None
    attempts: int
    max_attempts: int
    timeout: float | None
    fence: int
    run_at: float
    priority: int = 0
    kind: str = Kind.JOB
    queue: str = DEFAULT
    cancel_requested: bool = False  # a claim ends such a job cancelled, never hands it on (JobStore.claim)

    @property
    def exhausted(self) -> bool:
        """Claimed back from a lost lease on its last attempt: fail it, do not run it."""
        return self.kind != Kind.SINGLETON and self.attempts > self.max_attempts


class Ending(NamedTuple):
    """How one run ended, as the runner reports it (see RunStore.finish); a tuple, as a busy node makes thousands a
    second."""

    job: Claimed
    outcome: Outcome  # SUCCEEDED, FAILED, TIMEOUT or CANCELLED
    error: str | None = None
    retry_in: float | None = None  # requeue after this long, if attempts are left
    output: str | None = None

    @property
    def state(self) -> JobState:
        """The job's state after this ending."""
        if self.job.kind == Kind.SINGLETON and self.outcome != Outcome.CANCELLED and self.retry_in is not None:
            return JobState.QUEUED
        if self.outcome == Outcome.SUCCEEDED:
            return JobState.SUCCEEDED
        if self.outcome == Outcome.CANCELLED:
            return JobState.CANCELLED
        again = self.retry_in is not None and self.job.attempts < self.job.max_attempts
        return JobState.QUEUED if again else JobState.FAILED


@dataclass(frozen=True)
class JobSpec:
    """What to run; validated by the executors before it reaches the database."""

    executor: str
    target: str
    method: str = "GET"
    payload: str | None = None
    priority: int = 0
    max_attempts: int = MAX_ATTEMPTS
    timeout: float | None = None
    key: str | None = None
    kind: str = Kind.JOB  # or SINGLETON (see singletons)
    origin: str | None = None  # who enqueued it
    queue: str = DEFAULT
    order_key: str | None = None  # jobs of one key in one queue run one at a time, in enqueue order
    after: tuple[int, ...] = ()  # jobs it waits for (store/dependencies.py): it runs once they have succeeded
    after_ended: bool = False  # or once they have ended, whatever their outcome


@dataclass(frozen=True)
class Plan:
    """Which queues a claim takes from (docs/design.md §9), as the node works it out for each claim.

    `served`: the node's queues (() for every queue). `alone`: queues claimed in branches of their own, each
    (queue, room, locked): at most `room` of its jobs (the node's own limit for it, or all its free room), and,
    when `locked`, within the queue's farm-wide limit and rate, whose row the claim locks (on PostgreSQL in the
    claim statement itself). A queue with a farm-wide limit or rate gives work only to a claim that locked it."""

    served: tuple[str, ...] = ()
    alone: tuple[tuple[str, int, bool], ...] = ()

    @property
    def branches(self) -> tuple[bool, ...]:
        """Per branch of its own, whether its queue is guarded (see statements.ClaimShape)."""
        return tuple(locked for _name, _room, locked in self.alone)

    @property
    def locks(self) -> tuple[str, ...]:
        return tuple(sorted(name for name, _room, locked in self.alone if locked))  # in one order: no deadlock

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"b_served": list(self.served)} if self.served else {}
        for i, (name, room, locked) in enumerate(self.alone):
            params |= {f"b_q{i}": name, f"b_room{i}": room, f"b_locked{i}": locked}
        return params


EVERY_QUEUE = Plan()


@dataclass(frozen=True)
class Looks:
    """What a turn asks besides its claim, in the same statement (docs/design.md §9). `guarded`: our queues with a
    farm-wide limit or rate; while one of their jobs is due the turn claims nothing and says so, and we make
    one locked claim of every queue instead, so priority holds across them. `elsewhere`: the queues we do not
    serve that a live peer does (() for every queue we do not serve; None: do not ask), with `served`, ours."""

    guarded: tuple[str, ...] = ()
    elsewhere: tuple[str, ...] | None = None
    served: tuple[str, ...] = ()

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"b_guarded": list(self.guarded)} if self.guarded else {}
        if self.elsewhere is not None:
            params |= dict(b_elsewhere=list(self.elsewhere), b_any_other=not self.elsewhere, b_served=list(self.served))
        return params


NO_LOOKS = Looks()


@dataclass(frozen=True)
class Turn:
    """A turn: was the slot ours, what it claimed, and what its looks saw (None: not asked, or, for
    `elsewhere_due`, not asked because the claim took all the room it had)."""

    won: bool
    claimed: list[Claimed]
    guarded_due: bool | None = None
    elsewhere_due: bool | None = None


class Progress(NamedTuple):
    """How far a run is, as its job last said: a fraction from 0 to 1 and an optional short message."""

    fraction: float
    message: str | None

    @classmethod
    def of(cls, fraction: float, message: str | None) -> "Progress":
        """A report checked: a fraction outside 0..1 (or not a number) is the job's bug, raised where it called."""
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
            raise ValueError(f"progress must be a number from 0 to 1, not {fraction!r}")
        if message is not None and not isinstance(message, str):
            raise ValueError(f"a progress message must be text, not {type(message).__name__}")
        return cls(float(fraction), message[:PROGRESS_NOTE] if message else None)
