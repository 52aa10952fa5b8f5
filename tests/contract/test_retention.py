"""Retention: each queue keeps its finished jobs for a time of its own, on each backend; on PostgreSQL the
history and the event log are partitioned by day and pruned by dropping days whole (store/partitions.py)."""

from datetime import UTC, datetime

import pytest
from sqlalchemy import insert, select, text, update

from queueprocessor.rules.errors import BadQueueInput
from queueprocessor.rules.job import JobSpec
from queueprocessor.rules.queues import keep_text
from queueprocessor.store import schema
from queueprocessor.store.events import record_event
from queueprocessor.store.partitions import AHEAD, DAY, upkeep
from queueprocessor.store.stats import MINUTE
from queueprocessor.store.types import ClaimRequest
from tests.support.work import run_cli

HOUR = 3600


def finished(farm, queue: str, ago: float) -> int:
    """A job of `queue` that succeeded `ago` seconds ago, with its run."""
    store = farm._store
    [job_id] = store.jobs.enqueue(JobSpec("http", "/ok", queue=queue))
    me = store.machines.register(name=f"m{job_id}", host="h", instance=f"i{job_id}", pid=1, version="t", capacity=1)
    [claimed] = store.jobs.claim(ClaimRequest(me, 1, 30.0))
    store.runs.finish(claimed, me, "succeeded")
    store.count(
        update(schema.jobs).where(schema.jobs.c.id == job_id).values(finished_at=schema.jobs.c.finished_at - ago)
    )
    return job_id


def test_each_queue_keeps_its_finished_jobs_for_its_own_time_and_the_rest_for_the_farms(farm):
    short = [finished(farm, "short", ago) for ago in (2 * HOUR, 30)]
    long = [finished(farm, "long", ago) for ago in (5 * DAY, 20 * DAY)]
    other = [finished(farm, "default", ago) for ago in (2 * DAY, HOUR)]
    farm.set_queue("short", keep="1h")
    farm.set_queue("long", keep="10d")
    assert farm._store.jobs.prune(keep_seconds=DAY) == 3
    left = {job["id"] for job in farm._store.jobs.newest()}
    assert left == {short[1], long[0], other[1]}, "each past its own queue's time went; the farm's for the rest"
    assert {run["job_id"] for run in farm._store.runs.read()} == left
    farm.set_queue("long", keep=None)  # back to the farm's time
    assert farm._store.jobs.prune(keep_seconds=DAY) == 1
    assert [q.keep for q in farm.queues() if q.name in ("long", "short")] == [None, 3600.0]


def test_a_queues_time_is_logged_and_a_bad_one_changes_nothing(farm):
    finished(farm, "reports", 0)
    farm.set_queue("reports", keep=3 * DAY)
    for bad in ("3x", "0", -5, "4000d", True, "1 day"):
        with pytest.raises(BadQueueInput, match=r"^keep must be a time from 1s to 3650d"):
            farm.set_queue("reports", keep=bad)
    assert farm.queue("reports").keep == 3 * DAY
    kinds = [(e["kind"], e["detail"]) for e in farm.events(kind="queue")]
    assert kinds == [("queue.keep", "finished jobs kept: 3d")]


def test_the_cli_sets_a_queues_time_and_lists_it(farm, db_url, capsys):
    finished(farm, "reports", 0)
    assert run_cli("--db", db_url, "queue", "set", "reports", "--keep", "36h") == 0
    assert capsys.readouterr().out.strip().endswith("finished jobs kept 36h")
    assert farm.queue("reports").keep == 36 * HOUR
    assert run_cli("--db", db_url, "queue", "list") == 0
    [row] = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("reports ")]
    assert "36h" in row
    assert run_cli("--db", db_url, "queue", "set", "reports", "--no-keep") == 0
    assert capsys.readouterr().out.strip().endswith("finished jobs kept farm default")
    assert keep_text(farm.queue("reports").keep) == "farm default"


# PostgreSQL only: the logs' partitions.


def day_of(table: str, at: float) -> str:
    """The name of the partition of `table` that holds time `at`."""
    return f"{table}_{datetime.fromtimestamp(at, UTC):%Y%m%d}"


def partitions(farm, table: str) -> list[str]:
    with farm._engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = CAST(:t AS regclass) ORDER BY c.relname"
            ),
            dict(t=table),
        )
        return [row[0] for row in rows]


def where(farm, table: str) -> list[tuple[str, float]]:
    """Each row's partition and time."""
    with farm._engine.connect() as conn:
        rows = conn.execute(text(f"SELECT tableoid::regclass::text, at FROM {table} ORDER BY at"))
        return [tuple(row) for row in rows]


@pytest.fixture
def pg_farm(pg_url):
    from queueprocessor.farm import Farm

    with Farm(pg_url) as farm:
        yield farm


@pytest.mark.postgres
def test_the_logs_are_partitioned_by_day_with_the_days_ahead_and_a_default(pg_farm):
    now = pg_farm._store.ask_time()
    today = int(now // DAY * DAY)
    for table in ("qp_events", "qp_history"):
        names = partitions(pg_farm, table)
        assert f"{table}_default" in names and len(names) == AHEAD + 2, names
    with pg_farm._engine.begin() as conn:
        record_event(conn, "jobs.bulk", "retry", None, "someone")
    [(part, at)] = where(pg_farm, "qp_events")
    assert part == day_of("qp_events", at) and at >= today


@pytest.mark.postgres
def test_days_past_their_keep_are_dropped_whole_and_a_stray_row_finds_its_day(pg_farm):
    engine, now = pg_farm._engine, pg_farm._store.ask_time()
    zero = {name: 0 for name in schema.HISTORY_COUNTS}
    today = int(now // DAY * DAY)
    with engine.begin() as conn:
        for at in (today - 20 * DAY, today + 1, today + 10 * DAY):  # long gone, today, beyond the days made
            conn.execute(insert(schema.history).values(queue="q", step=MINUTE, at=at, last_job=0, **zero))
    assert [part for part, _ in where(pg_farm, "qp_history")] == [
        "qp_history_default",
        partitions(pg_farm, "qp_history")[0],
        "qp_history_default",
    ]
    later = today + 9 * DAY + HOUR  # nine days on, keeping five: today's partition is past it
    assert upkeep(engine, schema.history, later, keep=5 * DAY) == 2, "the row of 20 days ago, and today's"
    assert where(pg_farm, "qp_history") == [(day_of("qp_history", today + 10 * DAY), today + 10 * DAY)], (
        "the stray row moved into its day's partition when that day was made"
    )
    kept = [day_of("qp_history", later + n * DAY) for n in range(AHEAD + 1)]
    assert partitions(pg_farm, "qp_history") == [*kept, "qp_history_default"]


@pytest.mark.postgres
def test_a_drop_waits_for_a_long_reader_a_moment_then_leaves_it_for_the_next_hour(pg_farm):
    engine, now = pg_farm._engine, pg_farm._store.ask_time()
    before = partitions(pg_farm, "qp_events")
    with engine.connect() as reader:
        reader.execute(select(schema.events)).all()  # holds its lock until the transaction ends
        assert upkeep(engine, schema.events, now + 9 * DAY, keep=DAY) == 0
        reader.rollback()
    assert partitions(pg_farm, "qp_events") == before, "nothing done while the reader held the table"
    assert upkeep(engine, schema.events, now + 9 * DAY, keep=DAY) == 0  # nothing was in the dropped days
    assert len(partitions(pg_farm, "qp_events")) == AHEAD + 2
