"""Fair shares, limits and rates per key in SQL (docs/design.md §9; rules/fairness.py says what they are).

A fair queue's job gets its virtual start tag as it is enqueued (`tag`), so its claims read the queue's jobs in tag
order off an index, as any held-back queue's are read in age order: fairness costs the claim nothing. A limit per
key is kept by the claim, under the queue row's lock: a job is picked only while its key's running units leave room
for it (`key_room`), and the picked jobs are cut to that room key by key (`within_key_budgets`); a rate per key
likewise, from each key's bucket (qp_key_buckets), spent by the claim in its transaction (store/key_flow.py).
"""

import functools
from typing import Any

from sqlalchemy import Float, String, and_, bindparam, case, exists, func, insert, literal, or_, select, true, update
from sqlalchemy.sql import ColumnElement

from ...rules.fairness import MAX_FAIR_KEY, ORDER_KEY, PAYLOAD, STEP
from ...rules.states import JobState
from ..dbtime import db_now
from ..schema import jobs, key_buckets, queues
from .gates import refilled
from .portable import json_text

NO_BOUND = 1e18  # a budget without a limit or rate per key: more units than any claim takes


def units(j: Any) -> ColumnElement[float]:
    """What job `j` holds of its key's limit while it runs: its cost (NULL: 1)."""
    return func.coalesce(j.c.cost, 1)


def _finish(t: Any) -> Any:
    """Where job `t`'s turn ends in its key's virtual time: its tag plus its cost over its weight."""
    return t.c.vtag + literal(STEP, Float) * units(t) / func.coalesce(t.c.fair_weight, 1.0)


def key_of(dialect: str, queue: Any, order_key: Any, payload: Any, valid: bool = False) -> Any:
    """The fairness key a job of `queue` without one of its own takes from its order key or a payload field, as its
    queue's `fair_from` says (rules.fairness.check_fair_from); NULL when the queue says nothing (columns or SQL;
    `valid`: the payload is JSON by construction)."""
    q = queues.alias("kf")
    field = func.substr(q.c.fair_from, len(PAYLOAD) + 1)
    taken = case(
        (q.c.fair_from == ORDER_KEY, order_key),
        (q.c.fair_from.like(f"{PAYLOAD}%"), func.substr(json_text(dialect, payload, field, valid), 1, MAX_FAIR_KEY)),
        else_=None,
    )
    return select(taken).where(q.c.name == queue).scalar_subquery()


def tag(queue: Any, key: Any, maybe_null: bool = False) -> Any:
    """The virtual start tag of a job of `queue` and fairness key `key` (values or SQL; `maybe_null`: SQL that may
    be NULL, such as key_of's) enqueued now, or NULL when the queue is not fair: the later of the queue's virtual
    time (the least tag waiting in it, or database time when none does) and the end of its key's last waiting job's
    turn. A key with nothing waiting starts at the queue's virtual time, so it is next in line whatever the others
    have waiting; a key with a backlog extends its own line."""
    t = jobs.alias("ft")
    waiting = and_(t.c.queue == queue, t.c.state == JobState.QUEUED, t.c.vtag.isnot(None))
    now = select(func.min(t.c.vtag)).where(waiting).scalar_subquery()
    same_key = t.c.fair_key.is_(None) if key is None else t.c.fair_key == key
    if maybe_null:
        same_key = or_(same_key, and_(t.c.fair_key.is_(None), key.is_(None)))
    last = select(_finish(t)).where(waiting, same_key).order_by(t.c.vtag.desc()).limit(1).scalar_subquery()
    virtual = func.coalesce(now, db_now())
    q = queues.alias("fq")
    fair = exists(select(q.c.name).where(q.c.name == queue, q.c.fair == true()))
    return case((~fair, None), (last > virtual, last), else_=virtual)  # a key with nothing waiting: no `last`


def running_units(queue: Any, key: Any) -> Any:
    """The units the running jobs of `queue` and fairness key `key` hold (columns or values): their costs' sum."""
    r = jobs.alias("kr")
    return (
        select(func.coalesce(func.sum(units(r)), 0))
        .where(r.c.queue == queue, r.c.fair_key == key, r.c.state == JobState.RUNNING)
        .correlate_except(r)  # with the job it counts for, two levels up (see _room)
        .scalar_subquery()
    )


def tokens_now(dialect: str, q: Any, b: Any) -> Any:
    """The tokens key bucket row `b` of queue row `q` holds now (see gates.refilled); a full bucket without a row
    (NULL `b`); NULL without a rate per key."""
    now = refilled(dialect, b.c.tokens, b.c.refilled_at, q.c.key_rate_count, q.c.key_rate_per, q.c.key_burst)
    return case((q.c.key_rate_count.is_(None), None), else_=func.coalesce(now, q.c.key_burst))


def _room(queue: Any, key: Any) -> Any:
    """The units fairness key `key` of queue `queue` may start now under its limit per key (NO_BOUND without one)."""
    q = queues.alias("kq")
    room = func.coalesce(q.c.key_limit - running_units(queue, key), NO_BOUND)
    return select(room).where(q.c.name == queue).correlate_except(q).scalar_subquery()


def _tokens(dialect: str, queue: Any, key: Any) -> Any:
    """The tokens the bucket of fairness key `key` of queue `queue` holds now (NO_BOUND without a rate per key)."""
    q, b = queues.alias("kq"), key_buckets.alias("kb")
    return (
        select(func.coalesce(tokens_now(dialect, q, b), NO_BOUND))
        .select_from(q.outerjoin(b, and_(b.c.queue == q.c.name, b.c.key == key)))
        .where(q.c.name == queue)
        .correlate_except(q, b)
        .scalar_subquery()
    )


def _burst(queue: Any) -> Any:
    """The size of a bucket of queue `queue`'s rate per key (NULL without one)."""
    q = queues.alias("kq")
    return select(q.c.key_burst).where(q.c.name == queue).correlate_except(q).scalar_subquery()


def _fits(used: Any, cost: Any, room: Any, tokens: Any, burst: Any) -> ColumnElement[bool]:
    """`used` units of a key (a job's `cost` the last of them) fit its `room` under the limit per key, and its bucket's
    `tokens`; or, when they are one job alone that costs more than the bucket can hold (`burst`), the bucket is full:
    that job starts and the key pays the debt back before its next start."""
    return and_(used <= room, or_(used <= tokens, and_(used == cost, tokens >= burst)))


def key_room(dialect: str, j: Any) -> ColumnElement[bool]:
    """Job `j` fits its key's limit and rate alone (see _fits), or has no key (they leave it be)."""
    queue, key = j.c.queue, j.c.fair_key
    alone = _fits(units(j), units(j), _room(queue, key), _tokens(dialect, queue, key), _burst(queue))
    return or_(key.is_(None), alone)


def key_columns(dialect: str, j: Any) -> list[Any]:
    """What a claim branch that keeps limits and rates per key picks of job `j` besides the rest: what orders it
    (its tag), whose limit and rate it counts in (its key), how much (its cost), and what they leave its key now
    (see within_key_budgets)."""
    queue, key = j.c.queue, j.c.fair_key
    return [
        *(j.c.vtag, key, j.c.cost),
        _room(queue, key).label("room"),
        _tokens(dialect, queue, key).label("tokens"),
        _burst(queue).label("burst"),
    ]


def within_key_budgets(picked: Any, names: list[str]) -> Any:
    """`picked` (a claim branch's jobs of one queue, in claim order, each fitting alone: see key_room, with what
    `key_columns` adds), cut so that the jobs of each key it takes fit together: a job stays if its key's picked jobs
    up to it, itself included, fit the key's limit and rate (see _fits); its columns `names`."""
    order = (picked.c.priority.desc(), picked.c.vtag, picked.c.run_at, picked.c.id)
    so_far = func.sum(units(picked)).over(partition_by=picked.c.fair_key, order_by=order)
    r = select(*picked.c, so_far.label("so_far")).subquery("ranked")
    fits = or_(r.c.fair_key.is_(None), _fits(r.c.so_far, units(r), r.c.room, r.c.tokens, r.c.burst))
    return select(*(r.c[name] for name in names)).where(fits)


@functools.cache
def retag_statements() -> tuple[Any, ...]:
    """The updates that follow queue `b_queue`'s fair setting (QueueStore.put): made fair, its unfinished jobs
    without a tag get one, the same for all (they keep their age order, behind no one: the queue's virtual time
    starts at the change); made plain, its jobs lose theirs."""
    q = queues.alias("tq")
    fair = exists(select(q.c.name).where(q.c.name == jobs.c.queue, q.c.fair == true()))
    mine = and_(
        jobs.c.queue == bindparam("b_queue", type_=String), jobs.c.state.in_((JobState.QUEUED, JobState.RUNNING))
    )
    return (
        update(jobs).where(mine, jobs.c.vtag.is_(None), fair).values(vtag=db_now()),
        update(jobs).where(mine, jobs.c.vtag.isnot(None), ~fair).values(vtag=None),
    )


@functools.cache
def spend_statement(dialect: str) -> Any:
    """Key `b_key` of queue `b_queue` started `b_n` units: its bucket spends them from what it holds now (see
    key_flow.spend); no row matched if the key has none yet (first_spend_statement)."""
    b, q = key_buckets, queues.alias("sq")
    now = select(tokens_now(dialect, q, b)).where(q.c.name == b.c.queue).scalar_subquery()
    return (
        update(b)
        .where(b.c.queue == bindparam("b_queue", type_=String), b.c.key == bindparam("b_key", type_=String))
        .values(tokens=now - bindparam("b_n", type_=Float), refilled_at=db_now())
    )


@functools.cache
def first_spend_statement() -> Any:
    """The first start of key `b_key` of queue `b_queue` since its bucket was last forgotten: a full bucket spent."""
    q = queues
    spent = select(
        q.c.name,
        bindparam("b_key", type_=String),
        q.c.key_burst - bindparam("b_n", type_=Float),
        db_now(),
    ).where(q.c.name == bindparam("b_queue", type_=String))
    return insert(key_buckets).from_select(["queue", "key", "tokens", "refilled_at"], spent)


def key_use(dialect: str, queue: str, most: int) -> Any:
    """The `most` busiest fairness keys of `queue`: each key, its running jobs' units, its waiting jobs, and its
    bucket's tokens now (NULL without a rate per key); most units running first, then most waiting."""
    running, waiting = jobs.c.state == JobState.RUNNING, jobs.c.state == JobState.QUEUED
    per_key = (
        select(
            jobs.c.fair_key.label("key"),
            func.sum(case((running, units(jobs)), else_=0)).label("running"),
            func.sum(case((waiting, 1), else_=0)).label("waiting"),
        )
        .where(jobs.c.queue == queue, jobs.c.fair_key.isnot(None), or_(running, waiting))
        .group_by(jobs.c.fair_key)
        .subquery("per_key")
    )
    q, b = queues.alias("uq"), key_buckets.alias("ub")
    tokens = (
        select(tokens_now(dialect, q, b))
        .select_from(q.outerjoin(b, and_(b.c.queue == q.c.name, b.c.key == per_key.c.key)))
        .where(q.c.name == queue)
        .scalar_subquery()
    )
    return (
        select(per_key.c.key, per_key.c.running, per_key.c.waiting, tokens)
        .order_by(per_key.c.running.desc(), per_key.c.waiting.desc(), per_key.c.key)
        .limit(most)
    )
