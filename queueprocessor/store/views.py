"""The dashboards' read statements: what the farm did in a window of database time, read-only, one statement
each (views composes them into what one poll needs). Rows come back as plain dicts (see plain_dicts).
"""

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Float, and_, func, or_, select
from sqlalchemy.engine import Row
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from ..rules.search import JobFilter
from .base import StoreBase
from .history import ended_runs, run_history, with_owner_name
from .matching import matching, picked_rows
from .schema import jobs, schedules, turns

KEYS_PER_STATEMENT = 500  # well under every backend's limit of bound parameters (SQL Server's is 2,100)


class bucket_of(FunctionElement[float]):
    """floor(time / width) as an integer, portably (SQLite has no floor() without its math extension)."""

    type = Float()
    inherit_cache = True
    name = "bucket_of"


@compiles(bucket_of)
def _floor(element: bucket_of, compiler: SQLCompiler, **kw: Any) -> str:
    time, width = list(element.clauses)
    return f"FLOOR({compiler.process(time, **kw)} / {compiler.process(width, **kw)})"


@compiles(bucket_of, "sqlite")
def _floor_sqlite(element: bucket_of, compiler: SQLCompiler, **kw: Any) -> str:
    # Database times are positive, so truncation is floor.
    time, width = list(element.clauses)
    return f"CAST({compiler.process(time, **kw)} / {compiler.process(width, **kw)} AS INTEGER)"


def plain_dicts(rows: Sequence[Row[Any]]) -> list[dict[str, Any]]:
    """Result rows as dicts keyed by plain strings.

    SQLAlchemy names columns with `quoted_name` strings, which the garbage collector tracks, so a dict
    keyed by them is tracked too (`dict(row._mapping)`). A dashboard holds 10,000 such rows from each of its
    last polls, and that many tracked survivors a poll make Python run full collections every few polls,
    each a pause of 100 ms or more with the interpreter lock held. Dicts of plain strings and numbers are
    not tracked at all.
    """
    if not rows:
        return []
    names = [str(name) for name in rows[0]._fields]
    return [dict(zip(names, row)) for row in rows]


SCHEDULE_COLUMNS = (
    "name",
    "cron",
    "tz",
    "every",
    "executor",
    "target",
    "method",
    "misfire",
    "grace",
    "paused",
    "next_run",
    "created_at",
    # Its policies (schema 16): what the app's Schedules tab shows beside each schedule.
    "overlap",
    "jitter",
    "pause_on_failure",
    "failures",
    "paused_until",
    "paused_why",
)


class ViewStore:
    """The dashboards' reads (Store.views)."""

    def __init__(self, store: StoreBase):
        self.store = store

    def turns_between(self, since: float, until: float, limit: int = 100_000) -> list[dict[str, Any]]:
        """Turns taken in [since, until] of database time, by slot (the turn log, the truth)."""
        rows = self.store.rows(
            select(turns)
            .where(turns.c.taken_at >= since, turns.c.taken_at <= until)
            .order_by(turns.c.slot)
            .limit(limit)
        )
        return plain_dicts(rows)

    def runs_between(self, since: float, until: float, limit: int = 20_000) -> list[dict[str, Any]]:
        """Runs that overlap [since, until] (still running ones included), newest first, with their job's target."""
        history = run_history()
        overlap = and_(
            history.c.started_at <= until, or_(history.c.finished_at.is_(None), history.c.finished_at >= since)
        )
        statement = (
            select(history, jobs.c.target, jobs.c.method)
            .join(jobs, jobs.c.id == history.c.job_id)
            .where(overlap)
            .order_by(history.c.started_at.desc())
            .limit(limit)
        )
        return plain_dicts(self.store.rows(statement))

    def throughput(self, since: float, until: float, bucket: float) -> list[dict[str, Any]]:
        """Finished runs per `bucket` seconds and outcome: [{start, outcome, count}], oldest first."""
        runs = ended_runs()
        slot = bucket_of(runs.c.finished_at, bucket)
        statement = (
            select(slot, runs.c.outcome, func.count())
            .where(runs.c.finished_at >= since, runs.c.finished_at <= until)
            .group_by(slot, runs.c.outcome)
            .order_by(slot)
        )
        return [
            {"start": int(n) * bucket, "outcome": outcome, "count": count}
            for n, outcome, count in self.store.rows(statement)
        ]

    def machine_throughput(self, since: float, until: float) -> dict[int, dict[str, int]]:
        """Finished runs per machine and outcome in [since, until]: {machine id: {outcome: count}}."""
        runs = ended_runs()
        statement = (
            select(runs.c.machine_id, runs.c.outcome, func.count())
            .where(runs.c.finished_at >= since, runs.c.finished_at <= until)
            .group_by(runs.c.machine_id, runs.c.outcome)
        )
        counts: dict[int, dict[str, int]] = {}
        for machine_id, outcome, count in self.store.rows(statement):
            counts.setdefault(machine_id, {})[outcome] = count
        return counts

    def find_jobs(
        self, text: str, state: str | None = None, limit: int = 500, *, queue: str | None = None
    ) -> list[dict[str, Any]]:
        """The newest `limit` jobs (in `state`, of `queue`, if given) that the search expression `text` matches
        (rules/search.py: payload fields, queue:, key:, and words an id, target, machine name or last error contains,
        ignoring case, with % and _ matching only themselves); newest first."""
        return self.filtered_jobs(JobFilter(state=state, queue=queue, search=text), limit)

    def filtered_jobs(self, where: JobFilter, limit: int = 500) -> list[dict[str, Any]]:
        """The newest `limit` jobs that `where` picks, newest first, each with `owner_name` (its machine's name)."""
        statement = with_owner_name(select(jobs)).where(*matching(where)).order_by(jobs.c.id.desc()).limit(limit)
        return plain_dicts(picked_rows(self.store, statement, where))

    def schedule_rows(self) -> list[dict[str, Any]]:
        """Every schedule's SCHEDULE_COLUMNS, by name."""
        return plain_dicts(
            self.store.rows(select(*(schedules.c[c] for c in SCHEDULE_COLUMNS)).order_by(schedules.c.name))
        )

    def jobs_by_key(self, keys: list[str]) -> list[tuple[Any, ...]]:
        """(key, id, state, owner, finished_at, last_error) of the jobs holding `keys`, found by their unique key."""
        found = select(jobs.c.key, jobs.c.id, jobs.c.state, jobs.c.owner, jobs.c.finished_at, jobs.c.last_error)
        return [
            tuple(row)
            for start in range(0, len(keys), KEYS_PER_STATEMENT)
            for row in self.store.rows(found.where(jobs.c.key.in_(keys[start : start + KEYS_PER_STATEMENT])))
        ]
