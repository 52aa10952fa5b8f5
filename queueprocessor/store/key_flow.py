"""Fair shares, limits and rates per key, where the store writes for them (docs/design.md §9): the tags of jobs
enqueued together in a fair queue, and the buckets of rates per key, spent by the claims that start their jobs and
forgotten once full. The SQL is in sql/fair.py."""

from collections.abc import Sequence
from typing import Any

from sqlalchemy import String, Text, and_, bindparam, delete, func, literal, select, update
from sqlalchemy.engine import Connection

from ..rules.fairness import step
from ..rules.job import JobSpec
from ..rules.queues import MAX_RATE_PERIOD
from .dbtime import db_now
from .schema import jobs, key_buckets, queues
from .sql.fair import first_spend_statement, key_of, spend_statement, tag, units

IDS_AT_ONCE = 1000  # ids named in one statement (SQL Server takes at most 2,100 parameters)


def key(fair_key: str | None) -> Any:
    """A fairness key as sql.fair.tag takes it: a bound value, or None for a job without one (its SQL: IS NULL)."""
    return None if fair_key is None else literal(fair_key, String)


def key_for(dialect: str, spec: JobSpec) -> Any:
    """The fairness key of a job of `spec` as SQL: its own, or, without one, what its queue takes it from
    (sql.fair.key_of: NULL if nothing)."""
    if spec.fair_key is not None:
        return literal(spec.fair_key, String)
    order_key, payload = literal(spec.order_key, String), literal(spec.payload, Text)
    return key_of(dialect, literal(spec.queue, String), order_key, payload)


def keyed_statement(dialect: str, spec: JobSpec) -> Any:
    """The update that gives job `b_id`, just enqueued from `spec` into a held-back queue, its fairness key (key_for)
    and, if its queue is fair, its turn (sql.fair.tag): in the enqueue's transaction, before anyone sees it."""
    fair_key = key_for(dialect, spec)
    queue = literal(spec.queue, String)
    return (
        update(jobs)
        .where(jobs.c.id == bindparam("b_id"))
        .values(fair_key=fair_key, vtag=tag(queue, fair_key, maybe_null=spec.fair_key is None))
    )


def keys_and_tags(conn: Connection, specs: Sequence[JobSpec]) -> list[tuple[str | None, float | None]]:
    """The fairness keys (key_for) and virtual start tags (sql.fair.tag; None if their queue is not fair) of `specs`,
    jobs of one queue enqueued together, in order: each key's jobs take their turns one after another from where
    tag starts its next one. Read once for each key, or for each order key and payload of the jobs without one."""
    queue = literal(specs[0].queue, String)
    read: dict[tuple[str | None, ...], tuple[str | None, float | None]] = {}
    for spec in specs:
        if (source := _source(spec)) not in read:
            of = key_for(conn.dialect.name, spec)
            found = conn.execute(select(of, tag(queue, of, maybe_null=spec.fair_key is None))).one()
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
