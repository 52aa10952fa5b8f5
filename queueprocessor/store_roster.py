"""The statements behind the roster version (issue 11): a heartbeat learns what changed in O(1) rows.

Every change of a row the roster is made of bumps qp_roster.version in the
same transaction (bump_roster): a machine joining, stopping, writing a new
state, or being buried. So a heartbeat reads one number, its own row's wish and
the few machines that have gone quiet (read_farm), and reads every row
(read_all) only when the number moved. A burial stores a judged death on the
dead machine's row, guarded by the last_seen the judge saw, so it never buries
a machine that has checked in since; the buried machine's next check-in
revives it (Store.heartbeat) and bumps the version again.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import and_, bindparam, false, func, literal, or_, select, true, update
from sqlalchemy.engine import Connection

from .clock import Sample
from .dbtime import db_now
from .schema import machines, queues, roster_version, schedules, turns
from .states import CHECKING_IN, MachineState

if TYPE_CHECKING:  # store imports this module for bump_roster
    from .store import Store

VERSION = select(roster_version.c.version).where(roster_version.c.id == 1).scalar_subquery()


def bump_roster(conn: Connection) -> None:
    """Say, inside the transaction that changed a roster row, that the roster changed."""
    conn.execute(update(roster_version).where(roster_version.c.id == 1)
                 .values(version=roster_version.c.version + 1))


def newest_backlog(since: int | None):
    """The newest slot from `since` on whose turn found more due work than its holder could take, as a column."""
    if since is None:
        return literal(None)
    return select(func.max(turns.c.slot)).where(turns.c.slot >= since, turns.c.backlog).scalar_subquery()


def _one_row():
    """A one-row table to outer-join the machines to, so a read answers with the time even when none match."""
    return select(literal(1).label("one")).subquery("one")


@dataclass(frozen=True)
class FarmRead:
    """What a node learns from its heartbeat read."""

    now: float
    version: int | None  # the roster version
    backlog_slot: int | None
    next_schedule: float | None  # earliest occurrence of an active schedule not yet made a job
    wish: str | None  # an operator's wish on this machine's row
    suspects: dict[int, float]  # id -> last_seen of the machines checking in that have been quiet for `stale`
    sample: Sample | None = None  # the read timed as a clock sample, when asked for
    queues_changed: float | None = None  # when an operator last changed a queue's settings (see store_queues)


class RosterStore:
    def __init__(self, store: "Store"):
        self.store = store

    def read_farm(self, machine_id: int, stale: float, backlog_since: int | None = None,
                  stamp: Callable[[], float] | None = None) -> FarmRead:
        """The heartbeat's read, one statement of O(1) rows: the database's time, the roster version, the
        newest backlog turn since a slot, the next schedule occurrence to materialise, our own row's wish, and
        the suspects. With `stamp`, the read is also a clock sample."""
        backlog = newest_backlog(backlog_since)
        upcoming = select(func.min(schedules.c.next_run)).where(schedules.c.paused == false()).scalar_subquery()
        quiet = and_(machines.c.state.in_(CHECKING_IN), machines.c.last_seen < db_now() - bindparam("stale", stale))
        watched = or_(machines.c.id == bindparam("me", machine_id), quiet)
        changed = select(func.max(queues.c.changed_at)).scalar_subquery()
        statement = (select(db_now(), VERSION, backlog, upcoming, machines.c.id, machines.c.last_seen, machines.c.wish,
                            changed)
                     .select_from(_one_row().outerjoin(machines, watched)))
        if stamp:
            sample, rows = self.store.timed(statement, stamp)
        else:
            sample, rows = None, self.store.rows(statement)
        now, version, backlog_slot, next_schedule = rows[0][:4]
        wish = next((row[6] for row in rows if row[4] == machine_id), None)
        suspects = {row[4]: row[5] for row in rows
                    if row[4] is not None and (row[4] != machine_id or row[5] < now - stale)}
        return FarmRead(now, version, backlog_slot, next_schedule, wish, suspects, sample, rows[0][7])

    def read_all(self) -> tuple[int | None, float, list[dict]]:
        """The roster version, the database's time and every machine row by id, read together."""
        rows = self.store.rows(select(db_now(), VERSION, machines)
                               .select_from(_one_row().outerjoin(machines, true())).order_by(machines.c.id))
        keys = machines.c.keys()
        found = [dict(zip(keys, row[2:])) for row in rows if row[2] is not None]
        return rows[0][1], rows[0][0], found

    def bury(self, machine_id: int, last_seen: float) -> bool:
        """Store a machine's death, if it is still as silent as its judge saw it; the roster changed."""
        with self.store.engine.begin() as conn:
            buried = conn.execute(
                update(machines)
                .where(machines.c.id == machine_id, machines.c.last_seen == last_seen,
                       machines.c.state.in_(CHECKING_IN))
                .values(state=MachineState.DEAD)
            ).rowcount == 1
            if buried:
                bump_roster(conn)
        return buried
