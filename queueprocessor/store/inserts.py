"""New jobs' rows: one job or copies of it (an enqueue, a workflow's steps), many at once (a group's members), each
checked for a key kept for the farm's own jobs, gated as its queue says, with its fairness key and, in a fair
queue, its turn (store/key_flow.py). JobStore.enqueue, flows and schedules write them; sqlfunctions generates the
database's own qp_enqueue from the same row."""

import functools
import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Float, String, Table, bindparam, func, insert, literal, null, select
from sqlalchemy.engine import Connection

from ..rules.errors import InvalidJob, echoed
from ..rules.fairness import step
from ..rules.job import JobSpec
from ..rules.schedules import RUN_NOW
from ..rules.states import JobState, Kind
from . import dependencies, key_flow
from .dbtime import db_now
from .schema import jobs
from .sql.gates import gated_now

SINGLETON_PREFIX = "singleton:"  # a singleton's key: singleton:NAME (singletons.py)


def insert_jobs(
    conn: Connection, whole: bool, spec: JobSpec, *, delay: float = 0.0, at: float | None = None, count: int = 1
) -> list[int]:
    """JobStore.enqueue in a transaction of the caller's (a workflow's steps go in together, or none). A job with
    `after` waits for its parents (store/dependencies.py)."""
    check_key(spec)
    row = job_row(spec)
    failed = None
    if spec.after:
        starts, failed = dependencies.start(conn, spec)
        row |= starts
    when = dict(b_queue=spec.queue) | (dict(b_at=at) if at is not None else dict(b_delay=delay))
    if count == 1:
        job_id, gated = conn.execute(_insert_statement(at is not None), row | when).one()
        if gated:  # a held-back queue may be fair or keep flow per key: its job's key and turn, as the queue says
            key_flow.key_and_tag(conn, spec, job_id)
        ids = [job_id]
    elif not whole:  # one statement of many rows (insertmanyvalues): each row's key and tag given, a turn each
        made = _keys_and_tags(conn, [spec] * count)
        rows = [row | dict(fair_key=fair_key, vtag=vtag) for fair_key, vtag in made]
        ids = [r[0] for r in conn.execute(_insert_statement(at is not None), [r | when for r in rows])]
    else:  # the copies made by the database, in one statement: no rows sent, none converted one by one
        run_at = literal(at) if at is not None else db_now() + delay
        series = func.generate_series(0, count - 1).table_valued("n").render_derived()
        [(fair_key, first)] = _keys_and_tags(conn, [spec])  # read once: the database's time moves on
        turns = series.c.n * step(spec.cost, spec.fair_weight)
        row |= dict(fair_key=fair_key)
        copies = select(
            *(literal(value, jobs.c[name].type).label(name) for name, value in row.items()),
            db_now().label("created_at"),
            run_at.label("run_at"),
            gated_now(literal(spec.queue, String)).label("gated"),
            (null() if first is None else literal(first, Float) + turns).label("vtag"),  # a turn each
        ).select_from(series)
        copied = insert(jobs).from_select([*row, "created_at", "run_at", "gated", "vtag"], copies)
        ids = [r[0] for r in conn.execute(copied.returning(jobs.c.id)).all()]
    if spec.after:
        dependencies.linked(conn, ids, spec, failed)
    return ids


def _keys_and_tags(conn: Connection, specs: Sequence[JobSpec]) -> list[tuple[str | None, float | None]]:
    """key_flow.keys_and_tags of `specs` (jobs of one queue) if their queue is held back; else their own keys, and
    no turn: only a held-back queue may be fair or keep flow per key."""
    if conn.execute(select(gated_now(literal(specs[0].queue, String)))).scalar():
        return key_flow.keys_and_tags(conn, specs)
    return [(spec.fair_key, None) for spec in specs]


def insert_plain(conn: Connection, specs: Sequence[JobSpec], *, parents: bool = False) -> list[int]:
    """Jobs without `after`, due now, in a transaction of the caller's (a group's members, thousands in one call):
    the time and each queue's gated flag read once, then the rows sent in one statement (insert_rows). With
    `parents`, flagged has_children already (a group's members, whose callback waits for them). Their ids in the
    order of `specs`."""
    by_queue: dict[str, list[int]] = {}
    for n, spec in enumerate(specs):
        check_key(spec)
        by_queue.setdefault(spec.queue, []).append(n)
    ids = [0] * len(specs)
    for queue, places in by_queue.items():
        now, gated = conn.execute(select(db_now(), gated_now(literal(queue, String)))).one()
        fixed = dict(created_at=now, run_at=now, gated=gated, has_children=parents)
        group = [specs[n] for n in places]
        # Only a held-back queue may be fair or keep flow per key: only its jobs' keys and turns are read.
        keyed = key_flow.keys_and_tags(conn, group) if gated else [(s.fair_key, None) for s in group]
        rows = [job_row(s) | fixed | dict(fair_key=k, vtag=t) for s, (k, t) in zip(group, keyed, strict=True)]
        if len({(s.terms.scope is None, s.traceparent is None) for s in group}) > 1:  # one statement's rows: alike
            names = {name for row in rows for name in row}
            rows = [{name: row.get(name) for name in names} for row in rows]
        made = insert_rows(conn, jobs, rows, ids=True)
        for n, job_id in zip(places, made, strict=True):
            ids[n] = job_id
    return ids


def insert_rows(conn: Connection, table: Table, rows: list[dict[str, Any]], *, ids: bool = False) -> list[int]:
    """Many rows of `table` in the caller's transaction; with `ids`, their new ids in the order of `rows`. On
    PostgreSQL one statement whatever their number, each column sent as one array and unnested, or once if it is
    the same in every row (psycopg binds 10,000 rows of plain values in seconds, a few arrays in milliseconds),
    the ids drawn from the table's sequence first; elsewhere plain values, many to a statement."""
    if not rows:
        return []
    if conn.dialect.name != "postgresql":
        if not ids:
            conn.execute(insert(table), rows)
            return []
        made = conn.execute(insert(table).returning(table.c.id, sort_by_parameter_order=True), rows).all()
        return [row[0] for row in made]
    from sqlalchemy.dialects.postgresql import ARRAY  # PostgreSQL's own: loaded only by a farm on it

    new: list[int] = []
    if ids:
        sequence = func.pg_get_serial_sequence(table.name, "id")
        new = sorted(
            r[0] for r in conn.execute(select(func.nextval(sequence)).select_from(func.generate_series(1, len(rows))))
        )
        rows = [row | dict(id=job_id) for row, job_id in zip(rows, new, strict=True)]
    first = rows[0]
    varying = [name for name in first if any(row[name] != first[name] for row in rows)] or list(first)[:1]
    same = [name for name in first if name not in varying]  # a group's members: all but a few columns
    arrays = [bindparam(f"u_{name}", [row[name] for row in rows], ARRAY(table.c[name].type)) for name in varying]
    source = func.unnest(*arrays).table_valued(*varying).render_derived()
    values = [*source.c, *(bindparam(f"s_{name}", first[name], table.c[name].type) for name in same)]
    conn.execute(insert(table).from_select([*varying, *same], select(*values)))
    return new


@functools.cache
def _insert_statement(at: bool) -> Any:
    """The insert of jobs of queue `b_queue` due at `b_at` (with `at`) or `b_delay` seconds from now, made now in
    database time and gated as the queue says, returning their ids and that flag; built once (an alias of the queue
    rows in it makes a proxy of each of their columns). Their fairness key and turn are not its work: a queue that
    is not held back (most) needs none, and the statement that works them out reads qp_jobs, whose partitions each
    of its plans would weigh (a single enqueue took twice as long with them in it)."""
    when = bindparam("b_at", type_=Float) if at else db_now() + bindparam("b_delay", type_=Float)
    gated = gated_now(bindparam("b_queue", type_=String))
    return insert(jobs).values(created_at=db_now(), run_at=when, gated=gated).returning(jobs.c.id, jobs.c.gated)


# The keys the farm makes for its own jobs, in one namespace with the keys users give (a grab's `key@instance`, a
# raw key): a schedule's occurrence `NAME@TIME` (Recurrence.label: its local time to the millisecond, with its UTC
# offset) or run-now `NAME@run now REQUEST`, and a singleton's `singleton:NAME`. A user's key of those forms would
# take an occurrence's or a singleton's place and silently suppress it, so it is refused (check_key).
OCCURRENCE_KEY = re.compile(
    rf"[^@]+@(\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{{3}}[+-]\d\d:\d\d(:\d\d(\.\d+)?)?|{RUN_NOW} .*)", re.DOTALL
)


def check_key(spec: JobSpec) -> None:
    """Refuse a key of a job not made by a schedule or as a singleton that has the form of theirs (see
    OCCURRENCE_KEY), in one line that says what to do."""
    key = spec.key
    if key is None:
        return
    if key.startswith(SINGLETON_PREFIX) and spec.kind != Kind.SINGLETON:
        raise InvalidJob(f"key {echoed(key)} begins with {SINGLETON_PREFIX!r}, kept for singletons: use another key")
    if OCCURRENCE_KEY.fullmatch(key):
        raise InvalidJob(
            f"key {echoed(key)} has the form of a schedule's occurrence (NAME@TIME), kept for schedules: "
            "use another key or instance"
        )


def job_row(spec: JobSpec) -> dict[str, Any]:
    """A new job's columns as `spec` gives them, queued, never run, beside its times and gate: the database's own
    qp_enqueue fills the same, generated from here (sqlfunctions). Its key's terms and its traceparent only if it has
    any: a job without them sends what it always did."""
    row = dict(
        executor=spec.executor,
        target=spec.target,
        method=spec.method,
        payload=spec.payload,
        priority=spec.priority,
        max_attempts=spec.max_attempts,
        timeout=spec.timeout,
        key=spec.key,
        kind=spec.kind,
        origin=spec.origin,
        queue=spec.queue,
        order_key=spec.order_key,
        fair_key=spec.fair_key,
        fair_weight=spec.fair_weight,
        cost=spec.cost,
        state=JobState.QUEUED,
        attempts=0,
        fence=0,
        cancel_requested=False,
    ) | ({} if spec.terms.scope is None else dict(key_scope=spec.terms.scope, key_hold=spec.terms.hold))
    return row if spec.traceparent is None else row | dict(traceparent=spec.traceparent)
