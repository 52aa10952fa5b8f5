"""Fair shares and limits per key in SQL (docs/design.md §9, "Fair shares"; rules/fairness.py says what they are).

A fair queue's job gets its virtual start tag as it is enqueued (`tag`), so its claims read the queue's jobs in tag
order off an index, as any held-back queue's are read in age order: fairness costs the claim nothing. A limit per
key is kept by the claim, under the queue row's lock: a job is picked only while its key's running units leave room
for it (`key_room`), and the picked jobs are cut to that room key by key (`within_key_limits`).
"""

from typing import Any

from sqlalchemy import Float, String, and_, bindparam, case, exists, func, literal, or_, select, true, update
from sqlalchemy.sql import ColumnElement

from ...rules.fairness import STEP
from ...rules.states import JobState
from ..dbtime import db_now
from ..schema import jobs, queues


def units(j: Any) -> ColumnElement[float]:
    """What job `j` holds of its key's limit while it runs: its cost (NULL: 1)."""
    return func.coalesce(j.c.cost, 1)


def _finish(t: Any) -> Any:
    """Where job `t`'s turn ends in its key's virtual time: its tag plus its cost over its weight."""
    return t.c.vtag + literal(STEP, Float) * func.coalesce(t.c.cost, 1) / func.coalesce(t.c.fair_weight, 1.0)


def tag(queue: Any, key: Any) -> Any:
    """The virtual start tag of a job of `queue` and fairness key `key` (values or SQL) enqueued now, or NULL when the
    queue is not fair: the later of the queue's virtual time (the least tag waiting in it, or database time when none
    does) and the end of its key's last waiting job's turn. A key with nothing waiting starts at the queue's virtual
    time, so it is next in line whatever the others have waiting; a key with a backlog extends its own line."""
    t = jobs.alias("ft")
    waiting = and_(t.c.queue == queue, t.c.state == JobState.QUEUED, t.c.vtag.isnot(None))
    now = select(func.min(t.c.vtag)).where(waiting).scalar_subquery()
    same_key = t.c.fair_key.is_(None) if key is None else t.c.fair_key == key
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
        .scalar_subquery()
    )


def key_limit(queue: Any) -> Any:
    """Queue `queue`'s limit per key (NULL: none)."""
    q = queues.alias("kq")
    return select(q.c.key_limit).where(q.c.name == queue).scalar_subquery()


def key_room(j: Any, limit: Any) -> ColumnElement[bool]:
    """Job `j` fits under its key's `limit` with its key's running jobs: it has no key, its queue no limit per key,
    or its key's running units and its own stay within the limit."""
    return or_(j.c.fair_key.is_(None), limit.is_(None), running_units(j.c.queue, j.c.fair_key) + units(j) <= limit)


def within_key_limits(picked: Any, limit: Any, names: list[str]) -> Any:
    """`picked` (a claim branch's jobs of one queue, in claim order, each fitting alone: see key_room), cut so that
    the jobs of each key it takes together fit: a job stays if its key's running units and those of its key's
    picked jobs up to it, itself included, stay within `limit`; its columns `names`."""
    order = (picked.c.priority.desc(), picked.c.vtag, picked.c.run_at, picked.c.id)
    so_far = func.sum(units(picked)).over(partition_by=picked.c.fair_key, order_by=order)
    ranked = select(*picked.c, so_far.label("so_far")).subquery("ranked")
    fits = or_(
        ranked.c.fair_key.is_(None),
        limit.is_(None),
        running_units(ranked.c.queue, ranked.c.fair_key) + ranked.c.so_far <= limit,
    )
    return select(*(ranked.c[name] for name in names)).where(fits)


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
