"""A conflict over a key, settled (docs/design.md §6; the terms are rules/keys.py's). An enqueue inserts as always,
and only if its key is taken does it come here, in a transaction of its own: the holding job's row is locked, then
judged by its own terms in database time. A job past its terms gives the key up (its row keeps the rest); one still
holding it answers as the new enqueue asks: refused, its id returned, or (if it has not started) its payload and
time replaced, or its time moved by debounce. Under the row's lock a claim cannot start it meanwhile (a claim skips
locked rows), and two enqueues of one key settle one after the other, so whatever machines enqueue it, one job
holds a key at a time. The conditions are SQL, so qp_enqueue (sqlfunctions) settles the same way in the database.
"""

import functools
from typing import Any, NamedTuple

from sqlalchemy import Float, String, and_, bindparam, case, cast, null, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement, FromClause

from ..rules.errors import DuplicateKey, InvalidJob, echoed
from ..rules.job import JobSpec
from ..rules.keys import KeyScope, OnConflict
from ..rules.states import JobState
from .dbtime import db_now
from .schema import jobs
from .sql.portable import least

NOT_STARTED = (JobState.WAITING, JobState.QUEUED)
UNFINISHED = (*NOT_STARTED, JobState.RUNNING)


class Settled(NamedTuple):
    """The job an enqueue answers with, and how: "existing", "replaced" or "debounced"."""

    job_id: int
    how: str


def holding(table: FromClause, now: ColumnElement[float]) -> ColumnElement[bool]:
    """Whether a job of `table` still holds its key at `now`, by its own terms."""
    scope, state = table.c.key_scope, table.c.state
    succeeded_within = and_(
        state == JobState.SUCCEEDED,
        or_(
            and_(scope == KeyScope.UNTIL, now < table.c.key_hold),
            and_(scope == KeyScope.AFTER, now < table.c.finished_at + table.c.key_hold),
        ),
    )
    return or_(
        scope.is_(None),
        state.in_(NOT_STARTED),
        and_(scope != KeyScope.WAITING, state == JobState.RUNNING),
        succeeded_within,
    )


def debounced_at(
    dialect: str, table: FromClause, now: ColumnElement[float], debounce: Any, max_delay: Any
) -> ColumnElement[float]:
    """A debounced job's new time: `debounce` after now, but no later than `max_delay` (if not NULL) after the
    first enqueue of its key, which made the row."""
    return case(
        (max_delay.is_(None), now + debounce), else_=least(dialect, now + debounce, table.c.created_at + max_delay)
    )


@functools.cache
def _holder_statement() -> Any:
    """holder_read of key `b_key`, built once."""
    return holder_read(bindparam("b_key", type_=String))


def holder_read(key: ColumnElement[str]) -> Any:
    """The job holding `key`, locked: its id, whether it holds the key still and whether it has not started (the
    Python enqueue's read, and qp_enqueue's)."""
    held = select(jobs.c.id, holding(jobs, db_now()).label("holding"), jobs.c.state.in_(NOT_STARTED).label("waiting"))
    return held.where(jobs.c.key == key).with_for_update()


def settle(conn: Connection, spec: JobSpec, *, delay: float, at: float | None) -> Settled | None:
    """In the caller's transaction: settle `spec`'s enqueue with the job holding its key, as above; None if the key
    is free now (none holds it, or its holder just gave it up): the caller inserts again."""
    terms = spec.terms
    dialect = conn.dialect.name
    b_debounce = bindparam("b_debounce", terms.debounce, Float)
    b_max_delay = cast(bindparam("b_max_delay", terms.max_delay, Float), Float)  # typed when NULL too
    holder = conn.execute(_holder_statement(), dict(b_key=spec.key)).one_or_none()
    if holder is None:
        return None
    if not holder.holding:
        conn.execute(update(jobs).where(jobs.c.id == holder.id).values(key=None))
        return None
    how = terms.settles
    if how == OnConflict.REJECT:
        raise DuplicateKey(spec.key)
    if how == OnConflict.EXISTING and terms.debounce is None:
        return Settled(holder.id, "existing")
    if not holder.waiting:
        raise InvalidJob(
            f"job {holder.id} holds key {echoed(spec.key)} and has started: "
            f"{'debounce' if terms.debounce is not None else 'on_conflict replace'} changes only a job that waits "
            "(give the key a scope of waiting to enqueue anew once it starts)"
        )
    if terms.debounce is not None:
        when: Any = debounced_at(dialect, jobs, db_now(), b_debounce, b_max_delay)
    else:
        when = bindparam("b_at", at, Float) if at is not None else db_now() + bindparam("b_delay", delay, Float)
    changes: dict[str, Any] = dict(run_at=when)
    if how == OnConflict.REPLACE:
        changes["payload"] = spec.payload if spec.payload is not None else null()
    conn.execute(update(jobs).where(jobs.c.id == holder.id).values(changes))
    return Settled(holder.id, "debounced" if terms.debounce is not None else "replaced")
