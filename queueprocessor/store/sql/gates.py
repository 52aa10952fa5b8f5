"""The gates of named queues (docs/design.md §9): a queue's row with a farm-wide limit or rate holds its jobs back
(the gated flag), gives a claim room under its running count and rate bucket, and counts what starts and leaves."""

import functools
from collections import Counter
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    Boolean,
    Integer,
    String,
    and_,
    bindparam,
    case,
    cast,
    exists,
    false,
    func,
    literal,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.elements import BindParameter

from ...rules.breaker import DEFAULT_COOL_DOWN as COOL
from ...rules.breaker import HALF_OPEN, SHUT
from ...rules.states import JobState
from ..dbtime import db_now
from ..schema import jobs, queues
from .due import due
from .portable import greatest, least


def refilled(dialect: str, tokens: Any, refilled_at: Any, count: Any, per: Any, burst: Any) -> Any:
    """The tokens a token bucket holds now, in database time: the `tokens` it held at `refilled_at`, refilled since at
    `count` per `per` seconds, at most its `burst` (a queue's bucket, and a key's: sql/fair.py)."""
    return least(dialect, burst, tokens + (db_now() - refilled_at) * count / per)


def bucket(dialect: str, q: Any) -> Any:
    """The tokens a queue's rate bucket holds now (see refilled; a bucket never spent is full; a queue without a
    rate has none, NULL)."""
    now = refilled(dialect, q.c.tokens, q.c.refilled_at, q.c.rate_count, q.c.rate_per, q.c.burst)
    return case((q.c.tokens.is_(None), q.c.burst), else_=now)


def _guarded(q: Any) -> Any:
    """Queue row `q` has a farm-wide limit, rate or breaker, is fair or has a limit or rate per key: its jobs start
    only within them, each claim of them under the row's lock (see rules.queues.guarded, the same test in Python)."""
    return or_(
        q.c.max_running.isnot(None),
        q.c.rate_count.isnot(None),
        q.c.breaker_failures.isnot(None),
        q.c.fair == true(),
        per_key(q),
    )


def per_key(q: Any) -> Any:
    """Queue row `q` has a limit or a rate per fairness key (see rules.queues.per_key)."""
    return or_(q.c.key_limit.isnot(None), q.c.key_rate_count.isnot(None))


def _shut(q: Any) -> Any:
    """Queue row `q`'s breaker is open or half-open: its claims take one job (a canary) once breaker_at has come,
    none before (rules/breaker.py)."""
    return or_(*(q.c.breaker_state == literal(state) for state in SHUT))  # no IN (...): claims are compiled once


def holds_back(q: Any) -> Any:
    """Queue row `q` keeps its jobs from the claim's main branch: it is paused, or guarded (see _guarded)."""
    return or_(q.c.paused, _guarded(q))


def gated_now(queue: ColumnElement[str]) -> ColumnElement[bool]:
    """Whether a job of `queue` (a column or a value) is gated now: its queue's row holds its jobs back (see
    holds_back). Every statement that makes a job queued from outside running sets it so (an enqueue, a retry);
    a change of the row sets it again for the queue's unfinished jobs (QueueStore.put, regate_statements)."""
    g = queues.alias("gq")
    return case((exists(select(g.c.name).where(g.c.name == queue, holds_back(g))), true()), else_=false())


@functools.cache
def regate_statements(one: bool = False) -> tuple[Any, ...]:
    """The updates that set the gated flag of every queued or running job (with `one`, of queue `b_queue` only)
    to what its queue's row says now: queued jobs to gate, each walking the index it is in (when no queue holds
    its jobs back, the first reads nothing), queued jobs to let go, and running jobs, which keep their flag for
    when they are queued again (a retry, a lost lease)."""
    which = [jobs.c.queue == bindparam("b_queue", type_=String)] if one else []
    q = queues.alias("rq")
    holding = select(q.c.name).where(holds_back(q))
    queued, running = jobs.c.state == JobState.QUEUED, jobs.c.state == JobState.RUNNING
    return (
        update(jobs).where(queued, jobs.c.gated == false(), jobs.c.queue.in_(holding), *which).values(gated=true()),
        update(jobs).where(queued, jobs.c.gated == true(), jobs.c.queue.notin_(holding), *which).values(gated=false()),
        update(jobs)
        .where(running, jobs.c.gated != gated_now(jobs.c.queue), *which)
        .values(gated=gated_now(jobs.c.queue)),
    )


def _cut(dialect: str, q: Any, mine: Any) -> Any:
    """`mine` cut to the room guarded queue row `q` gives: its free places under the limit, its bucket's whole
    tokens. (SQLAlchemy gives SQLite a floor() of its own, in Python, that fails on NULL: hence the CASE.)"""
    tokens = case((q.c.rate_count.is_(None), mine), else_=cast(func.floor(bucket(dialect, q)), Integer))
    canary = case((_shut(q), case((q.c.breaker_at <= db_now(), 1), else_=0)), else_=mine)
    return least(dialect, mine, func.coalesce(q.c.max_running - q.c.running, mine), tokens, canary)


def taken(dialect: str, n: Any) -> dict[str, Any]:
    """What starting `n` jobs of a queue does to its row: `n` more running, if it is limited, `n` tokens
    spent, if it is rated (from the bucket as it is now, in database time), and a canary sent, if its breaker is
    open or half-open (half-open now, the next canary one cool-down later)."""
    q = queues
    rated = q.c.rate_count.isnot(None)
    return dict(
        running=case((q.c.max_running.isnot(None), q.c.running + n), else_=q.c.running),
        tokens=case((rated, bucket(dialect, q) - n), else_=q.c.tokens),
        refilled_at=case((rated, db_now()), else_=q.c.refilled_at),
        breaker_state=case((_shut(q), literal(HALF_OPEN)), else_=q.c.breaker_state),
        breaker_at=case((_shut(q), db_now() + func.coalesce(q.c.breaker_cooldown, COOL)), else_=q.c.breaker_at),
    )


@functools.cache
def taken_statement(dialect: str) -> Any:
    """Where the claim cannot count for itself (all but PostgreSQL): `b_spent` jobs of queue `b_queue` started,
    written in the claim's transaction, under the row's lock."""
    return (
        update(queues)
        .where(queues.c.name == bindparam("b_queue"))
        .values(**taken(dialect, bindparam("b_spent", type_=Integer)))
    )


def freed(counts: Any) -> Any:
    """The running counts of limited queues lowered by `counts`' rows (queue, n: how many of its jobs left
    running), their rows locked in name order first, as every claim locks them, so the two never deadlock."""
    limited = (
        select(queues.c.name)
        .where(queues.c.name.in_(select(counts.c.queue)), queues.c.max_running.isnot(None))
        .order_by(queues.c.name)
        .with_for_update()
        .cte("limited")
    )
    return (
        update(queues)
        .where(queues.c.name == counts.c.queue, queues.c.name.in_(select(limited.c.name)))
        .values(running=queues.c.running - counts.c.n)
    )


@functools.cache
def freed_statement() -> Any:
    """Where jobs leave running in a transaction of several statements (a release, a requeue, a finish on all
    but PostgreSQL): `b_freed` jobs of queue `b_queue` did, which lowers its running count if it is limited.
    Run per queue in name order (see `freed`)."""
    return (
        update(queues)
        .where(queues.c.name == bindparam("b_queue"), queues.c.max_running.isnot(None))
        .values(running=queues.c.running - bindparam("b_freed", type_=Integer))
    )


def free_places(conn: Connection, queues_left: Iterable[str]) -> None:
    """Jobs of these queues (one name per job) left running in this transaction: their limited queues' running
    counts go down with them, in name order (see `freed`)."""
    left = Counter(queues_left)
    if left:
        conn.execute(freed_statement(), [dict(b_queue=q, b_freed=n) for q, n in sorted(left.items())])


@functools.cache
def recount_statement(one: bool = False) -> Any:
    """The running count of every limited queue (with `one`, of queue `b_queue` only), counted afresh from its
    jobs (see QueueStore.recount)."""
    r = jobs.alias("r")
    running = select(func.count()).select_from(r).where(r.c.queue == queues.c.name, r.c.state == JobState.RUNNING)
    which = [queues.c.name == bindparam("b_queue", type_=String)] if one else []
    return update(queues).where(queues.c.max_running.isnot(None), *which).values(running=running.scalar_subquery())


def held_queues(dialect: str, names: list[BindParameter[str]]) -> Any:
    """PostgreSQL: the rows of the claim's guarded queues (`names`: the queue parameters of the branches that
    lock) that can give it work now (not paused, a free place, a whole token, a job due), locked in name order.
    A locking read returns each row as the last claim or finish that held it left it, where the statement's
    snapshot may be older: so the claim cuts its branches to the room the row gives now, and counts what it took
    on the row, in the same statement (docs/design.md §9).
    The rows are named one parameter each, not by one array: planned for any array, the server guessed ten rows
    and costed the plan it keeps above one for the names at hand, so it planned the claim afresh at every run
    (1 ms, as much as the run)."""
    h = queues.alias("h")
    g = jobs.alias("hj")
    return (
        select(
            h.c.name,
            h.c.max_running,
            h.c.running,
            h.c.rate_count,
            h.c.rate_per,
            h.c.burst,
            h.c.tokens,
            h.c.refilled_at,
            h.c.breaker_state,
            h.c.breaker_at,
        )
        .where(
            h.c.name.in_(names) if names else false(),
            h.c.paused == false(),
            or_(h.c.max_running.is_(None), h.c.running < h.c.max_running),
            or_(h.c.rate_count.is_(None), bucket(dialect, h) >= 1),
            or_(h.c.breaker_state.is_(None), ~_shut(h), h.c.breaker_at <= db_now()),
            exists(select(g.c.id).where(g.c.gated == true(), g.c.queue == h.c.name, due(g))),
        )
        .order_by(h.c.name)
        .with_for_update()
        .cte("held")
    )


def branch_room(dialect: str, i: int, limit: Any, held: Any = None, keyed: bool = False) -> Any:
    """How many queued jobs branch `i` of a claim may take from queue `b_q{i}`: the room the node gives it
    (`b_room{i}`: its own limit for the queue, or its free room), cut, for a queue with a farm-wide limit or
    rate, to the room its row gives (see _cut): as the claim statement locked it (`held`, PostgreSQL), or as
    the claim's transaction locked it before (JobStore.claim). None at all from a paused queue, from a guarded
    one that the node did not know as guarded (`b_locked{i}` false: it has not read the settings yet), nor, in a
    branch that does not keep limits and rates per key (not `keyed`), from a queue that has one."""
    q = queues.alias(f"q{i}")
    mine = bindparam(f"b_room{i}", type_=Integer)
    if held is None:
        cut = _cut(dialect, q, mine)
    else:  # no held row: the queue gives no room now
        cut = func.coalesce(select(_cut(dialect, held, mine)).where(held.c.name == q.c.name).scalar_subquery(), 0)
    unknown = [] if keyed else [(per_key(q), 0)]
    room = case(
        (q.c.paused, 0),
        (and_(_guarded(q), bindparam(f"b_locked{i}", type_=Boolean) == false()), 0),
        *unknown,
        (_guarded(q), cut),
        else_=mine,
    )
    found = select(room).where(q.c.name == bindparam(f"b_q{i}", type_=String)).scalar_subquery()
    return greatest(dialect, least(dialect, func.coalesce(found, mine), limit), 0)


def counted(dialect: str, picked: Any, held: Any, take_expired: bool) -> Any:
    """What a claim started of each guarded queue whose row it holds (see held_queues), counted on that row in the
    same statement: the picked rows that were queued (every picked row is claimed, see _lost), not those taken
    over, which were running and counted already."""
    queued = [picked.c.state == JobState.QUEUED] if take_expired else []
    started = (
        select(picked.c.queue, func.count().label("n")).where(*queued).group_by(picked.c.queue).subquery("started")
    )
    return (
        update(queues)
        .where(queues.c.name == started.c.queue, queues.c.name.in_(select(held.c.name)))
        .values(**taken(dialect, started.c.n))
    )
