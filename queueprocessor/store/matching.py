"""A JobFilter as SQL: the conditions a jobs list and a bulk action pick their jobs by (rules/search.py says
what a filter and a search mean).

A payload field is matched per dialect: on PostgreSQL by containment over the payload as jsonb in its table of its
own (schema.payloads_ddl: qp_payloads, kept apart from the job rows that claims and finishes update), which its GIN
index answers; on SQLite with json_extract; on SQL Server with JSON_VALUE. Text that is not JSON matches no field,
and never fails the search.
"""

import json
from typing import Any

from sqlalchemy import Boolean, String, and_, cast, func, literal, or_, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from ..rules.search import JobFilter, JsonScalar, Terms
from .base import StoreBase
from .dbtime import db_now
from .schema import PAYLOADS, jobs, machines


class payload_holds(FunctionElement[bool]):
    """The job's JSON payload holds one of `values` at `path` (see the module's docstring)."""

    type = Boolean()
    inherit_cache = False  # each search is built once and run once: not worth a cache key of its own
    name = "payload_holds"

    def __init__(self, path: tuple[str, ...], values: tuple[JsonScalar, ...]):
        self.path, self.values = path, values
        super().__init__(jobs.c.payload)


def _nested(path: tuple[str, ...], value: JsonScalar) -> str:
    doc: Any = value
    for part in reversed(path):
        doc = {part: doc}
    return json.dumps(doc)


def _json_path(path: tuple[str, ...]) -> str:
    return "$" + "".join(f'."{part}"' for part in path)  # parts are letters, digits, _ and - (rules/search.py)


@compiles(payload_holds, "postgresql")
def _pg(element: payload_holds, compiler: SQLCompiler, **kw: Any) -> str:
    held = " OR ".join(
        f"doc @> CAST({compiler.process(literal(_nested(element.path, v)), **kw)} AS jsonb)" for v in element.values
    )
    return f"({compiler.process(jobs.c.id, **kw)} IN (SELECT job_id FROM {PAYLOADS} WHERE {held}))"


@compiles(payload_holds, "sqlite")
def _sqlite(element: payload_holds, compiler: SQLCompiler, **kw: Any) -> str:
    payload = compiler.process(jobs.c.payload, **kw)
    path = compiler.process(literal(_json_path(element.path)), **kw)
    kind, value = f"json_type({payload}, {path})", f"json_extract({payload}, {path})"
    tests = []
    for v in element.values:
        if v is None or isinstance(v, bool):
            tests.append(f"{kind} = '{json.dumps(v)}'")
        else:
            word = "'text'" if isinstance(v, str) else "'integer', 'real'"
            tests.append(f"({kind} IN ({word}) AND {value} = {compiler.process(literal(v), **kw)})")
    # CASE, so json_extract never reads a payload that is not JSON (it would fail the whole search).
    return f"(CASE WHEN json_valid({payload}) THEN ({' OR '.join(tests)}) END = 1)"


@compiles(payload_holds, "mssql")
def _mssql(element: payload_holds, compiler: SQLCompiler, **kw: Any) -> str:
    payload = compiler.process(jobs.c.payload, **kw)
    path = compiler.process(literal(_json_path(element.path)), **kw)
    texts = {v if isinstance(v, str) else json.dumps(v) for v in element.values if v is not None}
    among = ", ".join(compiler.process(literal(t), **kw) for t in sorted(texts))
    return f"(CASE WHEN ISJSON({payload}) = 1 THEN JSON_VALUE({payload}, {path}) END IN ({among}))"


def _text(word: str) -> ColumnElement[bool]:
    """The job's id, target, last error or machine's name contains `word`, ignoring case; % and _ are characters."""
    named = select(machines.c.id).where(machines.c.name.icontains(word, autoescape=True))
    return or_(
        cast(jobs.c.id, String).icontains(word, autoescape=True),
        jobs.c.target.icontains(word, autoescape=True),
        jobs.c.last_error.icontains(word, autoescape=True),
        jobs.c.owner.in_(named),
    )


def search_conditions(terms: Terms) -> list[ColumnElement[bool]]:
    return [
        *(_text(word) for word in terms.text),
        *(jobs.c.queue == name for name in terms.queues),
        *(or_(jobs.c.order_key == key, jobs.c.key == key) for key in terms.keys),
        *(payload_holds(path, values) for path, values in terms.fields),
    ]


def matching(where: JobFilter) -> list[ColumnElement[bool]]:
    """The conditions of `where` on qp_jobs (checked first: a bad filter raises before any SQL runs)."""
    terms = where.terms()
    said: list[ColumnElement[bool]] = []
    if where.state is not None:
        said.append(jobs.c.state == where.state)
    if where.queue is not None:
        said.append(jobs.c.queue == where.queue)
    if where.target is not None:
        said.append(jobs.c.target == where.target)
    if where.older_than is not None:
        said.append(func.coalesce(jobs.c.finished_at, jobs.c.created_at) < db_now() - where.older_than)
    if where.ids:
        said.append(jobs.c.id.in_(list(where.ids)))
    return said + search_conditions(terms)


def all_of(conditions: list[ColumnElement[bool]]) -> ColumnElement[bool]:
    return and_(True, *conditions)


# A GIN index is read by bitmap scans only, which a node's connections are told not to plan
# (connections.PLANNER_HINT): a statement that picks jobs by payload fields allows them again in its own transaction.
LET_BITMAPS = text("SET LOCAL enable_bitmapscan = on")


def let_bitmaps(store: StoreBase, conn: Connection, where: JobFilter) -> None:
    if store.whole and where.terms().fields:
        conn.execute(LET_BITMAPS)


def picked_rows(store: StoreBase, statement: Any, where: JobFilter) -> list[Any]:
    """The rows of a read that picks jobs by `where` (see LET_BITMAPS)."""
    if not (store.whole and where.terms().fields):
        return store.rows(statement)
    with store.engine.begin() as conn:
        let_bitmaps(store, conn, where)
        return list(conn.execute(statement).all())
