"""Who is alive and whose turn it is: pure functions of machine rows and database time (docs/design.md §2, §3).

Every node evaluates these on the same rows and the same instant and gets the
same answer, which is what lets the farm take turns without talking. The node
and bench/simulate.py both decide with these functions, so what the simulator
shows for a thousand machines is what the code does.
"""

import bisect
import copy
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .states import CHECKING_IN, MachineState

Row = dict[str, Any]  # a machine's row, as the store reads it


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

    def dies_at(self, last_seen: float) -> float:
        """The instant a peer last seen at `last_seen` turns dead, unless it checks in again."""
        return max(last_seen, self.judge_streak_start) + self.dead_after


def roster(machines: Iterable[Row], db_now: float, liveness: Liveness, join_delay: float) -> list[int]:
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


def slot_end(slot: int, period: float) -> float:
    """When `slot` ends in database time: a turn recorded later is refused (sql.turns.turn_row)."""
    return (slot + 1) * period


def slot_owner(ids: list[int], slot: int) -> int | None:
    return ids[slot % len(ids)] if ids else None


def slot_start(slot: int, period: float) -> float:
    return slot * period


def next_turn(ids: list[int], me: int, db_now: float, period: float) -> int | None:
    """The first slot at or after now that belongs to `me` under this roster (sorted), or None if not in it."""
    place = bisect.bisect_left(ids, me)
    if place == len(ids) or ids[place] != me:
        return None
    slot = slot_of(db_now, period)
    return slot + (place - slot) % len(ids)


def upcoming_turn(ids: list[int], me: int, db_now: float, period: float, last_taken: int) -> int | None:
    """Our next slot under this roster that we have not taken yet (`last_taken`); None if not in the roster."""
    turn = next_turn(ids, me, db_now, period)
    if turn is not None and turn == last_taken:
        turn = next_turn(ids, me, slot_start(turn + 1, period), period)
    return turn


def turn_to_take(
    ids: list[int], me: int, db_now: float, period: float, error_bound: float, last_taken: int
) -> int | None:
    """The slot whose turn we take now, if any: ours under this roster, not taken yet, and begun by more than
    our clock's error bound, so that by our estimate it has surely begun in database time."""
    slot = slot_of(db_now, period)
    if slot == last_taken or slot_owner(ids, slot) != me or db_now - slot_start(slot, period) <= error_bound:
        return None
    return slot


def turn_wait(turn: int, db_now: float, period: float, error_bound: float, margin: float) -> float:
    """Seconds until we may take `turn` (its start plus our error bound, plus `margin`); at least `margin`."""
    return max(slot_start(turn, period) + error_bound + margin - db_now, margin)


def machine_status(row: Row, db_now: float, liveness: Liveness) -> MachineState:
    """The state an operator sees: the stored state, or DEAD when the machine stopped checking in."""
    if row["state"] != MachineState.STOPPED and liveness.is_dead(row["last_seen"], db_now):
        return MachineState.DEAD
    return MachineState(row["state"])


def _quiet(rows: Iterable[Row], before: float) -> dict[int, float]:
    """id -> last_seen of the rows checking in last seen before `before`: suspects."""
    return {row["id"]: row["last_seen"] for row in rows if row["state"] in CHECKING_IN and row["last_seen"] < before}


class KnownMachines:
    """A node's copy of the machine rows, kept current by a heartbeat read of O(1) rows
    (a farm's check-ins must not grow with its size).

    The node reads rows only when the farm's roster version moves (a machine
    joined, stopped, was buried or wrote a new state), and then only the rows
    changed since its version (each change writes its version on its row), or
    every row when that is no dearer or it cannot tell (catch_up). Between versions
    only last_seen moves, and the heartbeat read names just the machines checking
    in that were last seen before a bound (`before`, a little over a heartbeat
    ago): the suspects, with their last_seen. Every other machine checking in was
    seen since, and the bound stands in for its last_seen. A dying machine turns
    suspect well before its dead timeout, so every node judges it dead at the same
    instant from the same last_seen, as when every node read every row.
    """

    def __init__(self) -> None:
        self.version: int | None = None
        self._rows: dict[int, Row] = {}  # as read at `version`
        self._suspects: dict[int, float] = {}  # id -> last_seen
        self._fresh_since = -math.inf  # every machine checking in that is not a suspect was seen after this
        self._memo: tuple[tuple[int | None, Liveness, float, bool], float, float, list[int]] | None = None  # roster()

    def current(self, version: int | None) -> bool:
        """Is our copy of the rows that version's? (A farm without a version is always re-read.)"""
        return version is not None and version == self.version

    def replace(self, version: int | None, rows: list[Row], before: float) -> None:
        """Every row, read together with their roster version; those checking in last seen `before` are suspects."""
        self.version = version
        self._rows = {row["id"]: row for row in rows}
        self._memo = None
        self.update(before, _quiet(rows, before))

    def behind(self, version: int | None) -> tuple[int, int] | None:
        """When the farm's `version` is ahead of ours by fewer changes than we know rows, so that reading the rows
        changed since (one at most per change) costs less than reading them all: our version, and the most rows
        to read, twice the changes we know of (room for those made since the farm's version was read). Else None."""
        if version is None or self.version is None or not 0 < version - self.version < len(self._rows):
            return None
        return self.version, 2 * (version - self.version)

    def catch_up(self, version: int | None, changed: list[Row], before: float, suspects: dict[int, float]) -> bool:
        """Take the rows changed since our version (`changed`, read together with the farm's `version`) into
        our copy, with the heartbeat read's `suspects` for the rest. Only if each version since ours is still
        on a row: a row changed again since holds only its newest, and an older node bumps the version without
        writing it on the row (schema 13), so a missing number may hide a change; then nothing is taken
        (False), and the caller reads every row."""
        if version is None or self.version is None:
            return False
        if sum(1 for row in changed if self.version < row["changed"] <= version) != version - self.version:
            return False
        fresh = {row["id"]: row for row in changed}
        self.version = version
        self._rows = self._rows | fresh
        self._memo = None
        theirs = {machine_id: seen for machine_id, seen in suspects.items() if machine_id not in fresh}
        self.update(before, theirs | _quiet(changed, before))
        return True

    def update(self, before: float, suspects: dict[int, float]) -> bool:
        """A heartbeat read under our version: the machines checking in last seen before `before`. Whether the
        suspects changed (else the roster changes only as time passes, as changes_at says)."""
        self._fresh_since = before
        if suspects == self._suspects:
            return False
        self._suspects = dict(suspects)
        self._memo = None
        return True

    def last_seen(self, row: Row) -> float:
        seen: float = row["last_seen"]
        if row["id"] in self._suspects:
            return self._suspects[row["id"]]
        if row["state"] in CHECKING_IN:
            return max(seen, self._fresh_since)
        return seen

    def machines(self) -> list[Row]:
        """The rows, each with the last_seen we know for it."""
        return [row | {"last_seen": self.last_seen(row)} for row in self._rows.values()]

    def dead(self, db_now: float, liveness: Liveness) -> list[tuple[int, float]]:
        """(id, last_seen) of the suspects this judge finds dead: to bury, so that nobody reads them again."""
        return [
            (machine_id, seen)
            for machine_id, seen in self._suspects.items()
            if machine_id in self._rows and liveness.is_dead(seen, db_now)
        ]

    def name(self, machine_id: int) -> str:
        """A known machine's name, for what an operator reads (ids mean nothing to them)."""
        name: str = self._rows[machine_id]["name"]
        return name

    def copy(self) -> "KnownMachines":
        """A copy for other threads to read while the heartbeat goes on learning in ours: whole, because our
        rows and suspects are replaced, never changed in place. Its memo is its own; readers that fill it
        from the same copy fill it alike."""
        twin = copy.copy(self)
        twin._memo = None
        return twin

    def stale(self, db_now: float, liveness: Liveness) -> bool:
        """Is our last read too old to vouch for the machines it saw checking in (each then counts as dead at its
        own last_seen)? The next read brings them back: news for a turn timer asleep on the stale roster."""
        return db_now >= liveness.dies_at(self._fresh_since)

    def changes_at(self, db_now: float, liveness: Liveness, join_delay: float) -> float:
        """The first instant from `db_now` on at which roster() may change by itself, with no new read (a
        join delay or a dead timeout running out); inf if none is coming. A node sleeps until then."""
        self.roster(db_now, liveness, join_delay)
        assert self._memo is not None  # roster() has just made it
        stale = liveness.dies_at(self._fresh_since)
        # Past that instant our last read is too old to vouch for the machines it saw checking in: the stale roster's
        # own changes are in its memo (roster()); the instant itself is no longer one to wake for (waking for an
        # instant past would spin the turn timer until the next read).
        return min(self._memo[2], stale if stale > db_now else math.inf)

    def roster(self, db_now: float, liveness: Liveness, join_delay: float) -> list[int]:
        """roster() of what we know, recomputed only when it may have changed: a new version or suspect, a
        newcomer's join delay or a suspect's dead timeout running out, or our own heartbeats stopping (every
        machine's bound then ages past the dead timeout)."""
        # Computed before or after our last read went stale: a roster made stale must not outlive the next read, nor
        # a fresh one the read going stale.
        stale = self.stale(db_now, liveness)
        key = (self.version, liveness, join_delay, stale)
        memo = self._memo  # (key, valid from, valid until, roster)
        if memo is not None and memo[0] == key and memo[1] <= db_now < memo[2]:
            return memo[3]
        rows = self.machines()
        ids = roster(rows, db_now, liveness, join_delay)
        changes = [row["joined_at"] + join_delay for row in rows if row["state"] == MachineState.ACTIVE]
        changes += [liveness.dies_at(seen) for seen in self._suspects.values()]
        if stale:  # the machines our last read saw check in after its bound die each at its own time, one by one
            changes += [liveness.dies_at(row["last_seen"]) for row in rows if row["state"] == MachineState.ACTIVE]
        # Valid from the last change before now (our estimate of now may step back a little) to the next one.
        self._memo = (
            key,
            max((t for t in changes if t < db_now), default=-math.inf),
            min((t for t in changes if t >= db_now), default=math.inf),
            ids,
        )
        return ids
