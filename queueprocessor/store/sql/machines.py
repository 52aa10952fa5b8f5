"""A machine's check-in (MachineStore.heartbeat) and the roster version every roster change bumps and writes on the
row it changed (store/roster.py reads them)."""

import functools
from typing import Any

from sqlalchemy import Float, Integer, String, bindparam, case, func, literal, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement

from ..dbtime import db_now
from ..schema import Id, machines, roster_version, turns

# The roster version, as a column.
VERSION = select(roster_version.c.version).where(roster_version.c.id == 1).scalar_subquery()


def bump_roster(conn: Connection, machine_id: int | None) -> None:
    """Say, inside the transaction that changed machine `machine_id`'s row, that the roster changed, and write the
    new version on that row (None: on the row the caller makes next, as VERSION). The bump comes before that
    write: its lock on the version row makes the changes take their numbers in the order they commit, so a read
    that sees version v sees every row changed at v or before."""
    conn.execute(update(roster_version).where(roster_version.c.id == 1).values(version=roster_version.c.version + 1))
    if machine_id is not None:
        conn.execute(update(machines).where(machines.c.id == machine_id).values(changed=VERSION))


def newest_backlog(since: int | ColumnElement[int] | None) -> ColumnElement[int | None]:
    """The newest slot from `since` on whose turn found more due work than its holder could take, as a column."""
    if since is None:
        return literal(None)
    return select(func.max(turns.c.slot)).where(turns.c.slot >= since, turns.c.backlog).scalar_subquery()


@functools.cache
def checkin_statement(applied: bool, any_state: bool = False, returning: bool = False) -> Any:
    """A machine's check-in (MachineStore.heartbeat): machine `b_me` writes its figures and is seen now; with
    `applied`, the wish `b_applied` it just applied is cleared, unless an operator wished again since. It
    matches only while the row's state is `b_state` (a new state changes the roster: see MachineStore.heartbeat),
    or whatever the state with `any_state`; with `returning`, it answers with the id it matched."""
    wish: ColumnElement[Any] = machines.c.wish
    if applied:
        wish = case((machines.c.wish == bindparam("b_applied", type_=String), None), else_=machines.c.wish)
    state = bindparam("b_state", type_=String)
    mine = machines.c.id == bindparam("b_me", type_=Id)
    statement = (
        update(machines)
        .where(mine if any_state else mine & (machines.c.state == state))
        .values(
            last_seen=db_now(),
            state=state,
            wish=wish,
            running=bindparam("b_running", type_=Integer),
            done_count=bindparam("b_done", type_=Integer),
            failed_count=bindparam("b_failed", type_=Integer),
            clock_offset=bindparam("b_offset", type_=Float),
            rtt=bindparam("b_rtt", type_=Float),
            error_bound=bindparam("b_bound", type_=Float),
        )
    )
    return statement.returning(machines.c.id) if returning else statement
