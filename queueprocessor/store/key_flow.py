"""Fair shares, limits and rates per key, where the store writes for them (docs/design.md §9): the fairness keys and
turns of jobs enqueued into a held-back queue, and the buckets of rates per key, spent by the claims that start
their jobs and forgotten once full. The SQL is in sql/fair.py."""

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import String, Text, and_, bindparam, delete, func, select, update
from sqlalchemy.engine import Connection

from ..rules.fairness import step
from ..rules.job import JobSpec
from ..rules.queues import MAX_RATE_PERIOD
from .dbtime import db_now
from .schema import jobs, key_buckets, queues
from .sql.fair import first_spend_statement, key_of, spend_statement, tag, units

IDS_AT_ONCE = 1000  # ids named in one statement (SQL Server takes at most 2,100 parameters)


def key_and_tag(conn: Connection, spec: JobSpec, job_id: int) -> None:
    """Give job `job_id`, just enqueued from `spec` into a held-back queue, its fairness key (its own, or what its
    queue takes it from: sql.fair.key_of) and, if its queue is fair, its turn (sql.fair.tag): in the enqueue's
    transaction, before anyone sees it."""
    conn.execute(_keyed_statement(conn.dialect.name, spec.fair_key is not None), _params(spec) | dict(b_id=job_id))


def keys_and_tags(conn: Connection, specs: Sequence[JobSpec]) -> list[tuple[str | None, float | None]]:
    """The fairness keys (see key_and_tag) and virtual start tags (None if their queue is not fair) of `specs`, jobs
    of one queue enqueued together, in order: each key's jobs take their turns one after another from where the
    tag starts its next one. Read once for each key, or for each order key and payload of the jobs without one."""
    read: dict[tuple[str | None, ...], tuple[str | None, float | None]] = {}
    for spec in specs:
        if (source := _source(spec)) not in read:
            found = conn.execute(_read_statement(conn.dialect.name, spec.fair_key is not None), _params(spec)).one()
            read[source] = (found[0], found[1])
    turns: dict[str | None, float | None] = {}
    made: list[tuple[str | None, float | None]] = []
    for spec in specs:
        fair_key, start = read[_source(spec)]
        at = turns.get(fair_key, start)
        made.append((fair_key, at))
        if at is not None:
            turns[fair_key] = at + step(spec.cost, spec.fair_weight)
    return made


def _key(dialect: str, own: bool) -> Any:
    """A job's fairness key as SQL: its own (`b_key`), or what its queue `b_queue` takes from its order key and
    payload (`b_order_key`, `b_payload`; sql.fair.key_of, NULL if nothing)."""
    if own:
        return bindparam("b_key", type_=String)
    queue, order_key = bindparam("b_queue", type_=String), bindparam("b_order_key", type_=String)
    return key_of(dialect, queue, order_key, bindparam("b_payload", type_=Text))


# Built once each, so their text stays the same and PostgreSQL plans each once per connection (prepared): planned
# afresh, their reads of qp_jobs weighed its partitions at every enqueue.
@functools.cache
def _keyed_statement(dialect: str, own: bool) -> Any:
    fair_key = _key(dialect, own)
    turn = tag(bindparam("b_queue", type_=String), fair_key, maybe_null=not own)
    return update(jobs).where(jobs.c.id == bindparam("b_id")).values(fair_key=fair_key, vtag=turn)


@functools.cache
def _read_statement(dialect: str, own: bool) -> Any:
    fair_key = _key(dialect, own)
    return select(fair_key, tag(bindparam("b_queue", type_=String), fair_key, maybe_null=not own))


def _params(spec: JobSpec) -> dict[str, Any]:
    """The values _key and the tag read of a job of `spec`."""
    if spec.fair_key is not None:
        return dict(b_queue=spec.queue, b_key=spec.fair_key)
    return dict(b_queue=spec.queue, b_order_key=spec.order_key, b_payload=spec.payload)


def _source(spec: JobSpec) -> tuple[str | None, ...]:
    """What a job's fairness key comes from: its own, or its order key and payload."""
    return (spec.fair_key,) if spec.fair_key is not None else (None, spec.order_key, spec.payload)


def spend(conn: Connection, dialect: str, started: Sequence[int]) -> None:
    """A claim, in its transaction under the queue rows' lock, started the jobs `started` (ids): the keys of those
    of queues with a rate per key spend their units from their buckets (a key's first start makes its row)."""
    rated = select(queues.c.name).where(queues.c.key_rate_count.isnot(None))
    for at in range(0, len(started), IDS_AT_ONCE):
        spent = conn.execute(
            select(jobs.c.queue, jobs.c.fair_key, func.sum(units(jobs)))
            .where(
                jobs.c.id.in_(started[at : at + IDS_AT_ONCE]),
                jobs.c.fair_key.isnot(None),
                jobs.c.queue.in_(rated),
            )
            .group_by(jobs.c.queue, jobs.c.fair_key)
        ).all()
        for queue, fair_key, n in spent:
            params = dict(b_queue=queue, b_key=fair_key, b_n=n)
            if not conn.execute(spend_statement(dialect), params).rowcount:
                conn.execute(first_spend_statement(), params)


def forget_full(conn: Connection) -> int:
    """Delete the buckets that have refilled for longer than any rate's period from no debt (see spend_statement):
    full, they say what no row says."""
    full = and_(key_buckets.c.refilled_at < db_now() - MAX_RATE_PERIOD, key_buckets.c.tokens >= 0)  # no debt left
    return conn.execute(delete(key_buckets).where(full)).rowcount
