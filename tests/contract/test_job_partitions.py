"""PostgreSQL: finished jobs leave with their range's partition of qp_jobs (store/job_partitions.py,
docs/design.md §11). Time passes by the `now` the prune is given (database time); traffic by moving the sequence
forward (ids given and not used), as a burst of enqueues would."""

import pytest
from sqlalchemy import text, update

from queueprocessor import JobFilter
from queueprocessor.farm import Farm
from queueprocessor.rules.errors import DuplicateKey
from queueprocessor.rules.job import JobSpec
from queueprocessor.store import schema
from queueprocessor.store.job_partitions import AHEAD, DAY, GRACE, MIN_SPAN, Part, next_id, parts
from queueprocessor.store.types import ClaimRequest

pytestmark = pytest.mark.postgres
KEEP = 7 * DAY


@pytest.fixture
def farm(pg_url):
    with Farm(pg_url) as the_farm:
        yield the_farm


def sql(farm, statement: str, **params):
    with farm._engine.begin() as conn:
        result = conn.execute(text(statement), params)
        return result.all() if result.returns_rows else []


def made(farm) -> list[Part]:
    with farm._engine.connect() as conn:
        return [part for part in parts(conn) if part.lo is not None]


def current(farm) -> Part:
    """The range the sequence gives ids in now."""
    with farm._engine.connect() as conn:
        at = next_id(conn)
    [part] = [part for part in made(farm) if part.lo <= at < part.hi]
    return part


def close(farm, part: Part) -> None:
    """The sequence past `part`'s end: its next id is the next range's first."""
    sql(farm, "SELECT setval('qp_jobs_id_seq', :last)", last=part.hi - 1)


def ran(farm, spec: JobSpec, outcome: str = "succeeded") -> int:
    store = farm._store
    [job_id] = store.jobs.enqueue(spec)
    me = store.machines.register(name=f"m{job_id}", host="h", instance=f"i{job_id}", pid=1, version="t", capacity=1)
    [claimed] = store.jobs.claim(ClaimRequest(me, 1, 30.0))
    store.runs.finish(claimed, me, outcome, error=None if outcome == "succeeded" else "boom")
    return job_id


def later(farm, days: float) -> float:
    return farm._store.ask_time() + days * DAY


def test_ids_stay_dense_and_ranges_ahead_are_as_wide_as_a_day_of_ids(farm):
    first = ran(farm, JobSpec("http", "/ok"))
    assert first == 1, "the sequence is never moved"
    ranges = made(farm)
    assert [(part.lo, part.hi) for part in ranges] == [(1 + n * MIN_SPAN, 1 + (n + 1) * MIN_SPAN) for n in range(3)]
    sql(farm, "UPDATE qp_jobs SET created_at = created_at - 0.5 * :day", day=DAY)  # within the last day
    sql(farm, "SELECT setval('qp_jobs_id_seq', :last)", last=2 * MIN_SPAN + 5)  # 2 million ids given today
    [busy] = farm._store.jobs.enqueue(JobSpec("http", "/ok"))
    assert farm._store.jobs.prune_ranges(KEEP) == 0
    with farm._engine.connect() as conn:
        given = next_id(conn) - first
    beyond = [part for part in made(farm) if part.lo > busy]
    assert len(beyond) == AHEAD and all(part.hi - part.lo == given for part in beyond), "a day's ids each"
    assert beyond[0].lo == ranges[-1].hi, "contiguous"
    assert farm._store.jobs.prune_ranges(KEEP) == 0
    assert [part for part in made(farm) if part.lo > busy] == beyond, "none more while AHEAD are made"
    assert (ranges[1].lo, ranges[1].hi) not in {(part.lo, part.hi) for part in made(farm)}, "closed and empty: gone"


def test_a_burst_past_the_ranges_lands_in_the_default_and_the_next_ranges_start_above_it(farm):
    top = made(farm)[-1].hi
    sql(farm, "SELECT setval('qp_jobs_id_seq', :last)", last=top + 10)
    burst = ran(farm, JobSpec("http", "/ok", key="burst"))
    assert sql(farm, "SELECT tableoid::regclass::text FROM qp_jobs WHERE id = :id", id=burst) == [("qp_jobs_default",)]
    with pytest.raises(DuplicateKey):
        farm.enqueue(farm.http_spec("/again", key="burst"))
    with farm._engine.connect() as conn:
        start = next_id(conn)  # above the burst's job (the refused enqueue took an id too)
    farm._store.jobs.prune_ranges(KEEP)
    assert [part.lo for part in made(farm)] == [start, start + MIN_SPAN, start + 2 * MIN_SPAN], "the old: empty"
    [after] = farm._store.jobs.enqueue(JobSpec("http", "/ok"))
    assert sql(farm, "SELECT tableoid::regclass::text FROM qp_jobs WHERE id = :id", id=after) == [
        (f"qp_jobs_from_{start}",)
    ]
    assert farm._store.jobs.prune(KEEP, now=later(farm, 8)) == 1, "the default's finished jobs go at their keep"


def test_a_range_whose_jobs_all_finished_past_their_keep_is_dropped_and_its_keys_are_free_again(farm):
    part = current(farm)
    done = [ran(farm, JobSpec("http", "/ok", key=f"k-{n}", payload='{"n": 1}')) for n in range(3)]
    failed = ran(farm, JobSpec("http", "/bad", max_attempts=1), "failed")
    assert farm._store.jobs.prune_ranges(KEEP, now=later(farm, 8)) == 0, "open: ids are still given in it"
    close(farm, part)
    assert farm._store.jobs.prune_ranges(KEEP, now=later(farm, 6)) == 0, "not past their keep"
    assert farm._store.jobs.prune_ranges(KEEP, now=later(farm, 8)) == 4
    assert part not in made(farm) and {job["id"] for job in farm._store.jobs.newest()}.isdisjoint([*done, failed])
    assert sql(farm, "SELECT count(*) FROM qp_runs WHERE job_id < :hi", hi=part.hi) == [(0,)]
    assert sql(farm, "SELECT count(*) FROM qp_payloads") == [(0,)]
    assert sql(farm, "SELECT count(*) FROM qp_job_keys") == [(0,)]
    farm.enqueue(farm.http_spec("/again", key="k-0"))  # its key is free again


def test_a_closed_range_held_by_an_unfinished_job_loses_its_others_by_delete_after_the_grace(farm):
    part = current(farm)
    done = [ran(farm, JobSpec("http", "/ok")) for _ in range(3)]
    [waiting] = farm._store.jobs.enqueue(JobSpec("http", "/later", key="far"), delay=365 * DAY)
    close(farm, part)
    assert farm._store.jobs.prune_ranges(KEEP, now=later(farm, 8)) == 0, "held: not dropped"
    assert farm._store.jobs.prune(KEEP, now=later(farm, 8)) == 0, "closed: they wait for their range to go whole"
    now = later(farm, (KEEP + GRACE) / DAY + 1)
    assert farm._store.jobs.prune(KEEP, now=now) == 3, "past the grace: the DELETE path takes them"
    left = {row[0] for row in sql(farm, "SELECT id FROM qp_jobs WHERE id < :hi", hi=part.hi)}
    assert left == {waiting} and not set(done) & left
    with pytest.raises(DuplicateKey):
        farm.enqueue(farm.http_spec("/again", key="far"))


def test_the_open_ranges_jobs_go_at_their_keep_by_delete(farm):
    done = [ran(farm, JobSpec("http", "/ok")) for _ in range(2)]
    assert farm._store.jobs.prune(KEEP, now=later(farm, 6)) == 0
    assert farm._store.jobs.prune(KEEP, now=later(farm, 8)) == 2
    assert {job["id"] for job in farm._store.jobs.newest()}.isdisjoint(done)


def test_a_queue_kept_longer_keeps_its_jobs_while_the_farms_go(farm):
    part = current(farm)
    kept = ran(farm, JobSpec("http", "/ok", queue="audit"))
    farm.set_queue("audit", keep="30d")
    for _ in range(2):
        ran(farm, JobSpec("http", "/ok"))
    close(farm, part)
    now = later(farm, 10)
    assert farm._store.jobs.prune_ranges(KEEP, now=now) == 0
    assert farm._store.jobs.prune(KEEP, now=now) == 2
    assert {job["id"] for job in farm._store.jobs.newest()} == {kept}
    assert farm._store.jobs.prune_ranges(KEEP, now=later(farm, 31)) == 1


def test_a_key_is_unique_across_ranges_and_an_order_key_runs_once_across_ranges(farm):
    part = current(farm)
    [first] = farm._store.jobs.enqueue(JobSpec("http", "/a", key="same", queue="q", order_key="o"))
    close(farm, part)
    with pytest.raises(DuplicateKey):
        farm._store.jobs.enqueue(JobSpec("http", "/b", key="same"))
    [second] = farm._store.jobs.enqueue(JobSpec("http", "/b", queue="q", order_key="o"))
    assert first < part.hi <= second
    farm._store.count(update(schema.jobs).where(schema.jobs.c.id == first).values(state="running", owner=1))
    with pytest.raises(Exception, match="ux_qp_jobs_order_running"):
        farm._store.count(update(schema.jobs).where(schema.jobs.c.id == second).values(state="running", owner=1))


def test_jobs_in_closed_ranges_are_found_retried_cancelled_and_searched(farm):
    part = current(farm)
    failed = ran(farm, JobSpec("http", "/bad", max_attempts=1, payload='{"team": "x"}'), "failed")
    [queued] = farm._store.jobs.enqueue(JobSpec("http", "/q"), delay=DAY)
    close(farm, part)
    farm._store.jobs.enqueue(JobSpec("http", "/next"))
    assert farm.job(failed)["state"] == "failed"
    assert [run["outcome"] for run in farm._store.runs.read(job_id=failed)] == ["failed"]
    farm.cancel(queued)
    assert farm.job(queued)["state"] == "cancelled"
    farm.retry(failed)
    assert farm.job(failed)["state"] == "queued"
    assert [job["id"] for job in farm.find_jobs(JobFilter(search="team=x"))] == [failed]


def test_a_range_detached_by_a_drop_cut_short_is_dropped_at_the_next_pass_and_its_keys_freed(farm):
    part = current(farm)
    done = ran(farm, JobSpec("http", "/ok", key="cut"))
    close(farm, part)
    for name in ("qp_jobs", "qp_runs", schema.PAYLOADS):  # what a drop does under its lock, then its process ends
        sql(farm, f"ALTER TABLE {name} DETACH PARTITION {part.name(name)}")
    with pytest.raises(DuplicateKey):
        farm.enqueue(farm.http_spec("/again", key="cut"))  # its key still held, as before the drop
    assert farm._store.jobs.prune_ranges(KEEP) == 1
    assert sql(farm, "SELECT to_regclass(:t)", t=part.name("qp_jobs")) == [(None,)]
    assert sql(farm, "SELECT count(*) FROM qp_job_keys") == [(0,)]
    assert done not in {job["id"] for job in farm._store.jobs.newest()}
    farm.enqueue(farm.http_spec("/again", key="cut"))
