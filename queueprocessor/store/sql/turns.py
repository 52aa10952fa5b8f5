"""The turn (docs/design.md §2): its record in qp_turns and the looks it takes beside its claim (docs/design.md
§9)."""

import functools
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    Integer,
    bindparam,
    case,
    exists,
    false,
    insert,
    literal_column,
    null,
    or_,
    select,
    true,
)
from sqlalchemy.sql import ColumnElement

from ..dbtime import db_now
from ..schema import Id, jobs, turns
from .due import due, unpaused
from .portable import among


def guarded_due(dialect: str) -> Any:
    """The turn's look at the queues it does not claim from (docs/design.md §9): is a job of one of `b_guarded` (the
    node's queues with a farm-wide limit or rate, claimed only under their row's lock) due within the horizon,
    next in line for its key and not paused? If so, the turn claims nothing and the node makes one locked claim
    of every queue, so the queues' jobs are taken in one order of priority."""
    g = jobs.alias("g")
    return exists(
        select(g.c.id).where(g.c.gated == true(), due(g), among(dialect, g.c.queue, "b_guarded"), unpaused(g))
    )


def elsewhere_due(dialect: str) -> Any:
    """The turn's other look: is a job due now in a queue the node does not serve (`b_served`) but a live
    peer does (one of `b_elsewhere`, or any with `b_any_other`: a peer serves every queue), not paused? If so
    the turn is flagged as a backlog, so a machine that serves it claims at once."""
    e = jobs.alias("e")
    theirs = or_(bindparam("b_any_other", type_=Boolean), among(dialect, e.c.queue, "b_elsewhere"))
    return exists(
        select(e.c.id).where(
            e.c.gated == false(), due(e, horizon=False), theirs, ~among(dialect, e.c.queue, "b_served"), unpaused(e)
        )
    )


def looks(dialect: str, guarded: bool, elsewhere: bool, room_left: Any = None) -> list[Any]:
    """The two looks as columns `guarded_due` and `elsewhere_due`, NULL where not asked (elsewhere_due also
    where the condition `room_left` does not hold: a full turn-holder first asks about its own backlog)."""
    guarded_look = case((guarded_due(dialect), true()), else_=false()) if guarded else null()
    elsewhere_look: ColumnElement[Any] = null()
    if elsewhere:
        skip = [] if room_left is None else [(~room_left, null())]
        elsewhere_look = case(*skip, (elsewhere_due(dialect), true()), else_=false())
    # Each in a sub-select of its own: in SQLite's RETURNING, SQLAlchemy would drop the aliases from its columns.
    return [
        select(guarded_look).scalar_subquery().label("guarded_due"),
        select(elsewhere_look).scalar_subquery().label("elsewhere_due"),
    ]


TURN_COLUMNS = ["slot", "machine_id", "taken_at", "claimed", "backlog"]


def turn_row(ends: bool) -> Any:
    """The row of slot `b_slot`'s turn, taken by `b_machine` now. With `ends`, only while that slot lasts in
    database time (until `b_ends`): an insert held up on its way past the slot's end would otherwise poll
    beside the next slot's own turn, two polls in one slot (docs/design.md §2)."""
    now = db_now()
    row = select(
        bindparam("b_slot", type_=BigInteger),
        bindparam("b_machine", type_=Id),
        now,
        literal_column("0", Integer),
        false(),
    )
    return row.where(now < bindparam("b_ends", type_=Float)) if ends else row


@functools.cache
def turn_statement(dialect: str, guarded: bool, elsewhere: bool, ends: bool = False) -> Any:
    """Where the claim cannot record the turn itself (all but PostgreSQL): the record of slot `b_slot` (see
    turn_row; none if it came too late), returning the turn's looks (see `looks`) on SQLite; SQL Server allows
    no sub-select in OUTPUT, so it asks them apart (looks_statement)."""
    record = insert(turns).from_select(TURN_COLUMNS, turn_row(ends))
    if dialect == "mssql":
        return record
    return record.returning(turns.c.slot, *looks(dialect, guarded, elsewhere))


@functools.cache
def looks_statement(dialect: str, guarded: bool, elsewhere: bool) -> Any:
    """SQL Server's turn looks, asked after its turn record (see turn_statement)."""
    return select(*looks(dialect, guarded, elsewhere))
