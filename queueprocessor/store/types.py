"""The plain data the store takes and gives besides the job model (rules/job.py): what a claim asks for and from
which queues, what a turn looks at and found, and how far a run is."""

from dataclasses import dataclass
from typing import Any, NamedTuple

from ..rules.job import Claimed
from ..rules.limits import PROGRESS_NOTE


@dataclass(frozen=True)
class Plan:
    """Which queues a claim takes from (docs/design.md §9), as the node works it out for each claim.

    `served`: the node's queues (() for every queue). `alone`: queues claimed in branches of their own, each
    (queue, room, locked): at most `room` of its jobs (the node's own limit for it, or all its free room), and,
    when `locked`, within the queue's farm-wide limit and rate, whose row the claim locks (on PostgreSQL in the
    claim statement itself). A queue with a farm-wide limit or rate gives work only to a claim that locked it.
    `keyed`: those of them with a limit per key, kept by their branches (a queue with one gives no work to a branch
    that does not keep it)."""

    served: tuple[str, ...] = ()
    alone: tuple[tuple[str, int, bool], ...] = ()
    keyed: tuple[str, ...] = ()

    @property
    def branches(self) -> tuple[bool, ...]:
        """Per branch of its own, whether its queue is guarded (see sql.claim.ClaimShape)."""
        return tuple(locked for _name, _room, locked in self.alone)

    @property
    def keyed_branches(self) -> tuple[bool, ...]:
        """Per branch of its own, whether it keeps its queue's limit per key (see sql.claim.ClaimShape)."""
        return tuple(locked and name in self.keyed for name, _room, locked in self.alone)

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
class ClaimRequest:
    """What a claim asks for (JobStore.claim, and JobStore.take_turn_and_claim after its turn): up to `limit` jobs of
    the queues `plan` names, for machine `machine_id`, each under a lease of `lease` seconds. Queued jobs due within
    `horizon` seconds from now are claimable; with `take_expired`, running ones whose lease ran out too, and only
    those that ran out before `expired_before` (database time) if given."""

    machine_id: int
    limit: int
    lease: float
    horizon: float = 0.0
    take_expired: bool = True
    expired_before: float | None = None
    plan: Plan = EVERY_QUEUE

    def params(self) -> dict[str, Any]:
        """The bound parameters every claim shape takes (a turn's claim adds its own)."""
        params: dict[str, Any] = dict(b_machine=self.machine_id, b_limit=self.limit, b_lease=self.lease)
        params["b_horizon"] = self.horizon
        if self.expired_before is not None:
            params["b_before"] = self.expired_before
        return params | self.plan.params()

    def shape(self) -> dict[str, Any]:
        """What the request makes of its statement's shape (see sql.claim.ClaimShape)."""
        return dict(
            take_expired=self.take_expired,
            bounded=self.expired_before is not None,
            served=bool(self.plan.served),
            branches=self.plan.branches,
            keyed=self.plan.keyed_branches if self.plan.keyed else (),
        )


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
