"""Which queued jobs are due: within the horizon, of a queue not paused, and next in line for their order key."""

from typing import Any

from sqlalchemy import Float, and_, bindparam, exists, or_, select

from ...rules.queues import OnFailure
from ...rules.states import JobState
from ..dbtime import db_now
from ..schema import jobs, queues


def in_order(j: Any) -> Any:
    """A job of an order key may start only when no job of its key runs and none enqueued before it is still
    waiting (or, when its queue says OnFailure.BLOCK, failed for good): so the key's jobs run one at a time, in
    the order they were enqueued, whoever claims them."""
    o = jobs.alias("o")
    p = queues.alias("p")
    # o's queue is j's: named through o, the sub-select is correlated with the query it sits in (through j, two
    # levels up, it was not: any BLOCK queue's row then blocked every key).
    blocks = exists(select(p.c.name).where(p.c.name == o.c.queue, p.c.on_failure == OnFailure.BLOCK))
    ahead = exists(
        select(o.c.id).where(
            o.c.queue == j.c.queue,
            o.c.order_key == j.c.order_key,
            o.c.id != j.c.id,
            or_(
                o.c.state == JobState.RUNNING,
                and_(o.c.id < j.c.id, or_(o.c.state == JobState.QUEUED, and_(o.c.state == JobState.FAILED, blocks))),
            ),
        )
    )
    return or_(j.c.order_key.is_(None), ~ahead)


def due(j: Any, horizon: bool = True) -> Any:
    """Job `j` is queued, due (within `b_horizon` seconds from now, or now) and next in line for its key."""
    when = db_now() + bindparam("b_horizon", type_=Float) if horizon else db_now()
    return and_(j.c.state == JobState.QUEUED, j.c.run_at <= when, in_order(j))


def unpaused(j: Any) -> Any:
    """Job `j`'s queue is not paused."""
    q = queues.alias("qp")
    return j.c.queue.notin_(select(q.c.name).where(q.c.paused))
