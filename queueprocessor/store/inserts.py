"""New jobs' rows: one job or copies of it (an enqueue, a workflow's steps), many at once (a group's members), each
checked for a key kept for the farm's own jobs, gated as its queue says, with its fairness key and, in a fair
queue, its turn (store/key_flow.py). JobStore.enqueue, flows and schedules write them; sqlfunctions generates the
database's own qp_enqueue from the same row."""

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
from .schema import jobs, queues
from .sql.fair import tag
from .sql.gates import gated_now

SINGLETON_PREFIX = "singleton:"  # a singleton's key: singleton:NAME (singletons.py)


def insert_jobs(
    conn: Connection, whole: bool, spec: JobSpec, *, delay: float = 0.0, at: float | None = None, count: int = 1
) -> list[int]:
    """JobStore.enqueue in a transaction of the caller's (a workflow's steps go in together, or none). A job with
    `after` waits for its parents (store/dependencies.py)."""
    run_at = literal(at) if at is not None else db_now() + delay
    check_key(spec)
    row = job_row(spec)
    del row["fair_key"]  # given, or taken where its queue says (key_flow.key_for), by the statement or a read first
    failed = None
    if spec.after:
        starts, failed = dependencies.start(conn, spec)
        row |= starts
    if count == 1:
        statement, _gated = _insert_statement(conn.dialect.name, spec, run_at)
        ids = [conn.execute(statement, row).scalar_one()]
    elif not whole:  # one statement of many rows (insertmanyvalues): each row's key and tag given, a turn each
        made = key_flow.keys_and_tags(conn, [spec] * count)
        rows = [row | dict(fair_key=fair_key, vtag=vtag) for fair_key, vtag in made]
        ids = [r[0] for r in conn.execute(_insert_statement(conn.dialect.name, spec, run_at, given=True)[0], rows)]
    else:  # the copies made by the database, in one statement: no rows sent, none converted one by one
        series = func.generate_series(0, count - 1).table_valued("n").render_derived()
        [(fair_key, first)] = key_flow.keys_and_tags(conn, [spec])  # read once: the database's time moves on
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
        named = literal(queue, String)
        taken = select(queues.c.fair_from).where(queues.c.name == named).scalar_subquery()
        now, gated, fair_from = conn.execute(select(db_now(), gated_now(named), taken)).one()
        fixed = dict(created_at=now, run_at=now, gated=gated, has_children=parents)
        group = [specs[n] for n in places]
        # Only a queue that is held back (fair, or limited or rated per key) or takes keys needs them read.
        keyed = key_flow.keys_and_tags(conn, group) if gated or fair_from else [(s.fair_key, None) for s in group]
        rows = [job_row(s) | fixed | dict(fair_key=k, vtag=t) for s, (k, t) in zip(group, keyed, strict=True)]
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


def _insert_statement(dialect: str, spec: JobSpec, run_at: Any, given: bool = False) -> tuple[Any, Any]:
    """The insert of jobs of `spec`'s queue due at `run_at`, made now in database time, gated as the queue says, with
    their fairness key (key_flow.key_for) and, if the queue is fair, tagged for their turn (sql.fair.tag); with
    `given`, each row gives its key and tag instead. And that gated flag, as SQL."""
    queue = literal(spec.queue, String)
    gated = gated_now(queue)
    made = dict(created_at=db_now(), run_at=run_at, gated=gated)
    if not given:
        made["fair_key"] = fair_key = key_flow.key_for(dialect, spec)
        made["vtag"] = tag(queue, fair_key, maybe_null=spec.fair_key is None)
    return insert(jobs).values(**made).returning(jobs.c.id), gated


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
    qp_enqueue fills the same, generated from here (sqlfunctions)."""
    return dict(
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
    )
