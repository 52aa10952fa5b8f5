"""The farm's history per queue (docs/design.md §11), on each backend: a minute's row counts what the minute saw,
a minute written twice is counted once, minutes past a day become hours, and rows past their keep are gone."""

import pytest
from sqlalchemy import insert, select, update

from queueprocessor.farm import Farm
from queueprocessor.rules.job import JobSpec
from queueprocessor.rules.states import JobState
from queueprocessor.store.schema import history, jobs, runs
from queueprocessor.store.stats import COUNTS, HOUR, MEASURES, MINUTE

REPORTS = JobSpec("python", "bench.jobs:noop", queue="reports")
DEFAULT = JobSpec("python", "bench.jobs:noop")


@pytest.fixture
def farm(db_url):
    with Farm(db_url) as the_farm:
        yield the_farm


def minute_start(farm, back: int) -> int:
    """The start of the whole minute `back` minutes before the database's now."""
    return int(farm._store.ask_time() // MINUTE * MINUTE) - back * MINUTE


def created(farm, ids: list[int], at: float) -> None:
    farm._store.count(update(jobs).where(jobs.c.id.in_(ids)).values(created_at=at))


def ran(farm, job_id: int, started: float, finished: float, outcome: str, older: bool = False) -> None:
    """The job's one attempt ran from `started` to `finished` (database time) and ended so: a success on the job's
    row only, as a finish keeps it, unless an `older` node (schema 12) ended it, which wrote its run's row too."""
    state = JobState.SUCCEEDED if outcome == "succeeded" else JobState.FAILED
    farm._store.count(
        update(jobs)
        .where(jobs.c.id == job_id)
        .values(state=state, attempts=1, owner=1, fence=1, started_at=started, finished_at=finished)
    )
    if state != JobState.SUCCEEDED or older:
        farm._store.count(
            insert(runs).values(
                job_id=job_id,
                attempt=1,
                machine_id=1,
                fence=1,
                started_at=started,
                finished_at=finished,
                outcome=outcome,
            )
        )


def rows(farm, step: int = MINUTE) -> dict[tuple[str, int], dict]:
    found = farm._store.rows(select(history).where(history.c.step == step))
    return {(row.queue, row.at): dict(row._mapping) for row in found}


def counts(row: dict) -> dict:
    return {name: row[name] for name in MEASURES if row[name]}


def test_a_minute_counts_what_was_enqueued_started_and_finished_in_it_and_what_waits(farm):
    m = minute_start(farm, 3)
    a, b, c, d, e = farm._store.jobs.enqueue(REPORTS, count=5)
    created(farm, [a, b, c, d, e], m + 10)
    [before] = farm._store.jobs.enqueue(DEFAULT)
    created(farm, [before], m - 30)  # the minute before: waiting, not enqueued in this one
    ran(farm, a, m + 1, m + 3, "succeeded", older=True)  # took 2 s; counted once
    ran(farm, b, m + 2, m + 12, "failed")  # 10 s
    ran(farm, c, m - 50, m + 20, "timeout")  # 70 s, started the minute before
    farm._store.count(update(jobs).where(jobs.c.id == d).values(state=JobState.RUNNING, started_at=m + 30, owner=1))
    ran(farm, e, m + 70, m + 75, "succeeded")  # the next minute's
    farm._store.count(update(jobs).where(jobs.c.id == e).values(state=JobState.QUEUED))  # retried: waits

    assert farm._store.stats.write_minute(m) == 2
    written = rows(farm)
    assert counts(written["reports", m]) == dict(
        enqueued=5, started=3, succeeded=1, failed=1, timeout=1, waiting=1, running=1, p50=10.0, p95=70.0
    )
    assert counts(written["default", m]) == dict(waiting=1)


def test_a_minute_written_twice_is_counted_once_and_the_next_counts_only_its_own(farm):
    m = minute_start(farm, 3)
    first = farm._store.jobs.enqueue(REPORTS, count=2)
    created(farm, first, m + 5)
    ran(farm, first[0], m + 6, m + 7, "succeeded")
    assert farm._store.stats.write_minute(m) == 1
    ran(farm, first[1], m + 8, m + 9, "succeeded")  # seen late: the minute is written already
    assert farm._store.stats.write_minute(m) == 0
    assert counts(rows(farm)["reports", m]) == dict(enqueued=2, started=1, succeeded=1, waiting=1, p50=1.0, p95=1.0)
    later = farm._store.jobs.enqueue(REPORTS)
    created(farm, later, m + MINUTE + 1)
    farm._store.stats.write_minute(m + MINUTE)
    assert rows(farm)["reports", m + MINUTE]["enqueued"] == 1


def test_an_idle_minute_writes_nothing(farm):
    assert farm._store.stats.write_minute(minute_start(farm, 1)) == 0
    assert rows(farm) == {}


def put(farm, at: int, **values) -> None:
    zero = {name: 0 for name in COUNTS}
    farm._store.count(insert(history).values(queue="reports", step=MINUTE, at=at, last_job=0, **(zero | values)))


def test_minutes_past_a_day_become_hours_once_and_rows_past_their_keep_are_deleted(farm):
    now = farm._store.ask_time()
    hour = int((now - 2 * 86400) // HOUR * HOUR)  # two days ago
    put(farm, hour, enqueued=3, succeeded=1, waiting=4, p50=1.0, p95=2.0)
    put(farm, hour + 60, enqueued=2, succeeded=3, waiting=9, p50=3.0, p95=5.0)
    put(farm, hour + 120, enqueued=1, waiting=2)  # nothing ended: no durations
    recent = minute_start(farm, 5)
    put(farm, recent, enqueued=7)
    gone = int((now - 20 * 86400) // HOUR * HOUR)
    put(farm, gone, enqueued=1)
    for _ in range(2):  # a second pass changes nothing
        farm._store.stats.roll_up(now, keep=14 * 86400)
        assert counts(rows(farm, HOUR)["reports", hour]) == dict(
            enqueued=6, succeeded=4, waiting=9, p50=2.5, p95=5.0
        ), "counts added, the peak waiting, the median weighted by the runs that ended, the worst 95th"
        assert set(rows(farm, HOUR)) == {("reports", hour)}, "the row past its keep is gone"
        assert set(rows(farm)) == {("reports", recent)}, "the day's minutes stay"


def test_the_read_merges_buckets_by_step_and_queue(farm):
    m = minute_start(farm, 4) // 300 * 300
    put(farm, m, enqueued=1, waiting=3)
    put(farm, m + 60, enqueued=2, waiting=1)
    minutes = farm._store.stats.read(3600, queue="reports")
    assert [(r["at"], r["enqueued"]) for r in minutes] == [(m, 1), (m + 60, 2)]
    [five] = farm._store.stats.read(3600, step=300)
    assert (five["at"], five["enqueued"], five["waiting"]) == (m, 3, 3)
    assert farm._store.stats.read(3600, queue="mail") == []
