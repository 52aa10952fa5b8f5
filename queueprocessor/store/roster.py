"""The roster version: a heartbeat learns what changed in O(1) rows.

Every change of a row the roster is made of bumps qp_roster.version in the same
transaction and writes the new version on that row (sql.machines.bump_roster,
beside the store's other writes): a machine joining, stopping, writing a new
state, or being buried. So a heartbeat reads one number, its own row's wish and
the few machines that have gone quiet (read_farm), and reads machine rows only
when the number moved: those changed since its version (read_changes, through
their index), or every row (read_all) when it cannot tell what changed or is far
behind (roster.KnownMachines.catch_up); partial indexes answer the rest (schema),
so a steady heartbeat reads a handful of index entries whatever the farm's size,
and a change about one row per node. A burial stores a judged death on the dead
machine's row, guarded by the last_seen the judge saw, so it never buries a
machine that has checked in since; the buried machine's next check-in revives it
(MachineStore.heartbeat) and bumps the version again.

The two statements every node runs every heartbeat, the read (farm_statement)
and the check-in (sql.machines.checkin_statement, run by MachineStore.heartbeat), are
built once, everything that varies bound, and on PostgreSQL go straight to the
driver (base.Raw), as the claim does: building and executing them through
SQLAlchemy was most of an idle node's CPU.
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Executable,
    Float,
    Integer,
    Subquery,
    bindparam,
    func,
    literal,
    select,
    true,
    update,
)

from ..rules.clock import Sample
from ..rules.events import EventKind
from ..rules.states import MachineState
from .base import StoreBase
from .dbtime import db_now
from .events import record_machine_event
from .schedule_policy import wake_at
from .schema import CHECKING_IN_SQL, WISHED, Id, machines, queues
from .sql.machines import VERSION, bump_roster, newest_backlog


def _one_row() -> Subquery:
    """A one-row table to outer-join the machines to, so a read answers with the time even when none match."""
    return select(literal(1).label("one")).subquery("one")


@functools.cache
def farm_statement(backlog: bool) -> Executable:
    """The heartbeat's read (RosterStore.read_farm) for machine `me`, suspects last seen before `before` and, with
    `backlog`, the newest backlog turn from slot `since` on.

    It reads O(1) rows: the wish and the oldest last_seen come from their indexes (schema), and the machines
    are scanned for suspects only when that oldest one is older than `before`."""
    wish = (
        select(machines.c.wish)
        .where(machines.c.id == bindparam("me", type_=Id), WISHED)
        .correlate(None)
        .scalar_subquery()
    )
    oldest = select(func.min(machines.c.last_seen)).where(CHECKING_IN_SQL).correlate(None).scalar_subquery()
    bound = bindparam("before", type_=Float)
    suspects = (
        select(machines.c.id, machines.c.last_seen)
        .where(oldest < bound, CHECKING_IN_SQL, machines.c.last_seen < bound)
        .subquery("suspects")
    )
    upcoming = select(func.min(wake_at())).scalar_subquery()  # the schedules' next look (store/schedule_policy.py)
    changed = select(func.max(queues.c.changed_at)).scalar_subquery()
    since = bindparam("since", type_=BigInteger) if backlog else None
    return select(
        db_now(), VERSION, newest_backlog(since), upcoming, wish, changed, suspects.c.id, suspects.c.last_seen
    ).select_from(_one_row().outerjoin(suspects, true()))


@functools.cache
def _read_statement(changes: bool) -> Executable:
    """The roster version and the machine rows (every row; with `changes`, the first `most` changed after version
    `since`, in the order of their change), outer-joined to one row so that the version comes back when none match.
    Their order and their number make PostgreSQL read the changed rows by their index even on a table it has
    no statistics of yet (it would read the table whole to find a few rows)."""
    rows = select(machines)
    if changes:
        rows = (
            rows.where(machines.c.changed > bindparam("since", type_=BigInteger))
            .order_by(machines.c.changed)
            .limit(bindparam("most", type_=Integer))
        )
    picked = rows.subquery("machines")
    return select(VERSION, picked).select_from(_one_row().outerjoin(picked, true())).order_by(picked.c.id)


@dataclass(frozen=True)
class FarmRead:
    """What a node learns from its heartbeat read."""

    now: float
    version: int | None  # the roster version
    backlog_slot: int | None
    next_schedule: float | None  # earliest occurrence of an active schedule not yet made a job
    wish: str | None  # an operator's wish on this machine's row
    suspects: dict[int, float]  # id -> last_seen of the machines checking in last seen before the read's bound
    sample: Sample | None = None  # the read timed as a clock sample, when asked for
    queues_changed: float | None = None  # when an operator last changed a queue's settings (see store/queues.py)


class RosterStore:
    def __init__(self, store: StoreBase):
        self.store = store

    def read_farm(
        self, machine_id: int, before: float, backlog_since: int | None = None, stamp: Callable[[], float] | None = None
    ) -> FarmRead:
        """The heartbeat's read, one statement (farm_statement): the database's time, the roster version, the
        newest backlog turn since a slot, the next schedule occurrence to materialise, our own row's wish, and
        the suspects: the machines checking in that were last seen before `before`. With `stamp`, the read is
        also a clock sample."""
        params = {"me": machine_id, "before": before}
        if backlog_since is not None:
            params["since"] = backlog_since
        statement = farm_statement(backlog_since is not None)
        if stamp:
            sample, rows = self.store.timed(statement, stamp, params)
        else:
            sample, rows = None, self.store.rows(statement, params)
        first = rows[0]
        return FarmRead(
            first[0],
            first[1],
            first[2],
            first[3],
            first[4],
            {row[6]: row[7] for row in rows if row[6] is not None},
            sample,
            first[5],
        )

    def read_all(self) -> tuple[int | None, list[dict[str, Any]]]:
        """The roster version and every machine row by id, read together."""
        return self._read(_read_statement(False), {})

    def read_changes(self, since: int, most: int) -> tuple[int | None, list[dict[str, Any]]]:
        """The roster version and at most `most` machine rows changed after version `since` (the first changed),
        read together through their index: as many rows as changed, whatever the farm's size. Whether they are
        all that changed is roster.KnownMachines.catch_up's to judge."""
        return self._read(_read_statement(True), {"since": since, "most": most})

    def _read(self, statement: Executable, params: dict[str, Any]) -> tuple[int | None, list[dict[str, Any]]]:
        rows = self.store.rows(statement, params)
        keys = machines.c.keys()
        return rows[0][0], [dict(zip(keys, row[1:])) for row in rows if row[1] is not None]

    def bury(self, machine_id: int, last_seen: float, judge: str | None = None) -> bool:
        """Store a machine's death, if it is still as silent as its judge (`judge`, as the event log names it) saw
        it; the roster changed."""
        with self.store.engine.begin() as conn:
            buried = (
                conn.execute(
                    update(machines)
                    .where(machines.c.id == machine_id, machines.c.last_seen == last_seen, CHECKING_IN_SQL)
                    .values(state=MachineState.DEAD)
                ).rowcount
                == 1
            )
            if buried:
                bump_roster(conn, machine_id)
                silent = "stopped checking in"
                record_machine_event(conn, EventKind.MACHINE_DEAD, machine_id, silent, judge or self.store.actor)
        return buried
