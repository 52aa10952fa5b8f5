"""Who is alive and whose turn it is: pure functions of machine rows and database time (DESIGN 2, 3).

Every node evaluates these on the same rows and the same instant and gets the
same answer, which is what lets the farm take turns without talking.
"""

import math
from dataclasses import dataclass

from .states import MachineState


@dataclass(frozen=True)
class Liveness:
    """How a judge decides that a peer is dead.

    A peer is dead when it has been silent for longer than `dead_after`, where
    silence is only counted from the start of the judge's own unbroken run of
    check-ins (Quartz's rule): when the database itself stalls, everyone's
    last_seen ages together and nobody is judged for the database's silence.
    """

    dead_after: float
    judge_streak_start: float = -math.inf

    def is_dead(self, last_seen: float, db_now: float) -> bool:
        return db_now - max(last_seen, self.judge_streak_start) > self.dead_after


def roster(machines, db_now: float, liveness: Liveness, join_delay: float) -> list[int]:
    """Ids of the machines that take turns: active, alive, joined long enough ago; sorted by id.

    `machines` are mappings with id, state, last_seen and joined_at.
    """
    return sorted(
        m["id"]
        for m in machines
        if m["state"] == MachineState.ACTIVE
        and not liveness.is_dead(m["last_seen"], db_now)
        and db_now - m["joined_at"] >= join_delay
    )


def slot_of(db_now: float, period: float) -> int:
    return math.floor(db_now / period)


def slot_owner(ids: list[int], slot: int) -> int | None:
    return ids[slot % len(ids)] if ids else None


def slot_start(slot: int, period: float) -> float:
    return slot * period


def next_turn(ids: list[int], me: int, db_now: float, period: float) -> int | None:
    """The first slot at or after now that belongs to `me` under this roster, or None if not in it."""
    if me not in ids:
        return None
    slot = slot_of(db_now, period)
    ahead = (ids.index(me) - slot) % len(ids)
    return slot + ahead


def machine_status(row, db_now: float, liveness: Liveness) -> MachineState:
    """The state an operator sees: the stored state, or DEAD when the machine stopped checking in."""
    if row["state"] != MachineState.STOPPED and liveness.is_dead(row["last_seen"], db_now):
        return MachineState.DEAD
    return MachineState(row["state"])
