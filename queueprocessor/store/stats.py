"""The farm's history per queue (docs/design.md §11): what each minute saw, written once a minute by the machine that
holds that minute's first turn, rolled up to hours past a day, and kept `keep_history` seconds (on PostgreSQL, in
partitions of a day, dropped whole: store/partitions.py).

Each statement is set-based: a minute's rows are one INSERT ... SELECT over qp_jobs and the runs that ended
(history.ended_runs: qp_runs and the successes kept on their jobs' rows, read by their end, in database time),
which inserts only the queues that minute has no row for yet, so a minute written twice is counted once. The run
durations' percentiles are nearest-rank, with window functions every backend has.
"""

import functools
from typing import Any

from sqlalchemy import (
    BigInteger,
    Float,
    Integer,
    and_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    func,
    insert,
    literal_column,
    null,
    select,
    union_all,
)
from sqlalchemy.exc import IntegrityError

from ..rules.states import ENDINGS, HISTORY_COUNTS, JobState
from .base import StoreBase
from .dbtime import db_now
from .history import ended_runs
from .matching import LET_BITMAPS
from .partitions import upkeep
from .schema import history, jobs

MINUTE, HOUR = 60, 3600
ROLL_UP_AFTER = 86400.0  # minutes older than this become hours
WRITE_LAG = 2.0  # a minute is written this long after its end, when the runs that ended in it are surely in
OUTCOMES, COUNTS = ENDINGS, HISTORY_COUNTS
GAUGES = ("waiting", "running")  # jobs in that state as the minute was written; an hour's peak
MEASURES = (*COUNTS, *GAUGES, "p50", "p95")
COLUMNS = ("queue", "step", "at", *MEASURES, "last_job")


def minute_to_write(slot: int, period: float) -> int | None:
    """The minute (its start, database time) whose rows the holder of turn slot `slot` writes: the one that
    ended WRITE_LAG before the slot began, if the slot before began earlier than that; else None."""
    began = slot * period - WRITE_LAG
    if began // MINUTE == (began - period) // MINUTE:
        return None
    return int(began // MINUTE * MINUTE) - MINUTE


def _part(queue: Any, **given: Any) -> Any:
    """One branch of a minute's union: the columns it counts, zero or NULL for the others."""
    zero = {name: literal_column("0", Integer) for name in COUNTS}
    empty = {name: cast(null(), Float) for name in ("p50", "p95")} | {name: cast(null(), Integer) for name in GAUGES}
    values = zero | empty | given
    return select(queue.label("queue"), *(values[name].label(name) for name in MEASURES))


def _rank(ranked: Any, percent: int) -> Any:
    """The nearest-rank percentile of the ranked durations: the smallest at or past `percent` of them."""
    return func.min(case((ranked.c.rank * 100 >= ranked.c.n * percent, ranked.c.took)))


@functools.cache
def minute_statement() -> Any:
    """Insert the rows of the minute [b_from, b_to) for each queue that had work in it or has jobs waiting or
    running, and no row for it yet."""
    start, end = bindparam("b_from", type_=Float), bindparam("b_to", type_=Float)
    seen = select(func.coalesce(func.max(history.c.last_job), 0)).scalar_subquery()
    last = select(func.coalesce(func.max(jobs.c.id), seen)).where(jobs.c.id > seen, jobs.c.created_at < end)
    enqueued = _part(jobs.c.queue, enqueued=func.count()).where(
        jobs.c.id > seen, jobs.c.created_at >= start, jobs.c.created_at < end
    )
    runs = ended_runs()  # a run that ended started before its end: a bound that each part's index of ends answers
    of_job = runs.join(jobs, jobs.c.id == runs.c.job_id)
    started_ended = (
        select(jobs.c.queue)
        .select_from(of_job)
        .where(runs.c.started_at >= start, runs.c.started_at < end, runs.c.finished_at >= start)
    )
    started_running = select(jobs.c.queue).where(
        jobs.c.state == JobState.RUNNING, jobs.c.started_at >= start, jobs.c.started_at < end
    )
    started_all = union_all(started_ended, started_running).subquery("started_runs")
    started = _part(started_all.c.queue, started=func.count())
    took = runs.c.finished_at - runs.c.started_at
    ranked = (
        select(
            jobs.c.queue,
            runs.c.outcome,
            took.label("took"),
            func.row_number().over(partition_by=jobs.c.queue, order_by=took).label("rank"),
            func.count().over(partition_by=jobs.c.queue).label("n"),
        )
        .select_from(of_job)
        .where(runs.c.finished_at >= start, runs.c.finished_at < end)
        .subquery("ended_runs")
    )
    ended = _part(
        ranked.c.queue,
        **{name: func.sum(case((ranked.c.outcome == name, 1), else_=0)) for name in OUTCOMES},
        p50=_rank(ranked, 50),
        p95=_rank(ranked, 95),
    )
    waiting = _part(jobs.c.queue, waiting=func.count()).where(jobs.c.state == JobState.QUEUED)
    running = _part(jobs.c.queue, running=func.count()).where(jobs.c.state == JobState.RUNNING)
    parts = union_all(
        enqueued.group_by(jobs.c.queue),
        started.group_by(started_all.c.queue),
        ended.group_by(ranked.c.queue),
        waiting.group_by(jobs.c.queue),
        running.group_by(jobs.c.queue),
    ).subquery("parts")
    written = exists().where(history.c.queue == parts.c.queue, history.c.step == MINUTE, history.c.at == start)
    rows = (
        select(
            parts.c.queue,
            literal_column(str(MINUTE), Integer),
            cast(start, BigInteger),
            *(func.sum(parts.c[name]) for name in COUNTS),
            *(func.max(parts.c[name]) for name in GAUGES),
            func.max(parts.c.p50),
            func.max(parts.c.p95),
            last.scalar_subquery(),
        )
        .where(~written)
        .group_by(parts.c.queue)
    )
    return insert(history).from_select(list(COLUMNS), rows).returning(history.c.queue)


def _merged(rows: Any, bucket: Any) -> list[Any]:
    """Rows of `rows` (qp_history or a subquery of it) merged into buckets: counts added, gauges' peaks, the
    median as the finished-weighted mean of the medians, the worst 95th percentile."""
    finished = sum((rows.c[name] for name in OUTCOMES[1:]), rows.c[OUTCOMES[0]])
    weighted = func.sum(rows.c.p50 * finished) / func.nullif(func.sum(case((rows.c.p50.isnot(None), finished))), 0)
    return [
        rows.c.queue,
        bucket.label("at"),
        *(func.sum(rows.c[name]).label(name) for name in COUNTS),
        *(func.max(rows.c[name]).label(name) for name in GAUGES),
        weighted.label("p50"),
        func.max(rows.c.p95).label("p95"),
    ]


@functools.cache
def roll_up_statement() -> Any:
    """Insert an hour's row for each queue's minutes before b_before (a whole hour), unless it has one."""
    before = bindparam("b_before", type_=BigInteger)
    hour = history.c.at // HOUR * HOUR
    merged = (
        select(*_merged(history, hour), func.max(history.c.last_job).label("last_job"))
        .where(history.c.step == MINUTE, history.c.at < before)
        .group_by(history.c.queue, hour)
        .subquery("hours")
    )
    kept = history.alias("kept")
    there = exists().where(kept.c.queue == merged.c.queue, kept.c.step == HOUR, kept.c.at == merged.c.at)
    rows = select(
        merged.c.queue,
        literal_column(str(HOUR), Integer),
        merged.c.at,
        *(merged.c[name] for name in (*MEASURES, "last_job")),
    ).where(~there)
    return insert(history).from_select(list(COLUMNS), rows)


class StatsStore:
    """Writes and reads qp_history."""

    def __init__(self, store: StoreBase):
        self.store = store

    def write_minute(self, at: float) -> int:
        """Write the minute that starts at `at` (database time, a multiple of MINUTE), for every queue that has
        none yet; how many rows. Minutes are written in order: each counts the jobs enqueued above the last
        one's highest job id. Two writers of one minute at once: the second's insert is refused, and nothing
        is lost (its rows are the first's)."""
        if at % MINUTE:
            raise ValueError(f"a minute starts at a multiple of {MINUTE} seconds, not {at}")
        try:
            with self.store.engine.begin() as conn:
                if self.store.whole:  # the successes' ends are a BRIN index, read by bitmap scans only
                    conn.execute(LET_BITMAPS)
                return len(conn.execute(minute_statement(), dict(b_from=float(at), b_to=float(at + MINUTE))).all())
        except IntegrityError:
            return 0

    def roll_up(self, now: float, keep: float) -> None:
        """Housekeeping at `now` (database time): make the minutes older than ROLL_UP_AFTER hours, and delete every
        row older than `keep` seconds, in one transaction; on PostgreSQL the days past `keep` are dropped whole
        instead, and the days ahead made (store/partitions.py)."""
        before = int((now - ROLL_UP_AFTER) // HOUR * HOUR)
        with self.store.engine.begin() as conn:
            conn.execute(roll_up_statement(), dict(b_before=before))
            conn.execute(delete(history).where(history.c.step == MINUTE, history.c.at < before))
            if not self.store.whole:
                conn.execute(delete(history).where(history.c.at < now - keep))
        if self.store.whole:
            upkeep(self.store.engine, history, now, keep)

    def read(self, since: float, step: int = MINUTE, queue: str | None = None) -> list[dict[str, Any]]:
        """The rows of the last `since` seconds, merged into buckets of `step` seconds (a multiple of MINUTE; an
        hour's row stays whole under a smaller step), oldest first, by queue."""
        bucket = history.c.at // step * step
        where = [history.c.at >= db_now() - since]
        if queue is not None:
            where.append(history.c.queue == queue)
        statement = (
            select(*_merged(history, bucket), func.max(history.c.step).label("step"))
            .where(and_(*where))
            .group_by(history.c.queue, bucket)
            .order_by(bucket, history.c.queue)
        )
        return [dict(row._mapping) for row in self.store.rows(statement)]
