"""PostgreSQL: finished jobs leave with their day's partition of qp_jobs (store/job_partitions.py, docs/design.md
§11). Days pass by the `now` the prune is given (database time): a day's jobs are written into an older day's
partition by giving them ids of its range."""

import pytest
from sqlalchemy import text, update

from queueprocessor import JobFilter
from queueprocessor.farm import Farm
from queueprocessor.rules.errors import DuplicateKey
from queueprocessor.rules.job import JobSpec
from queueprocessor.store import schema
from queueprocessor.store.job_partitions import DAY, Part, base, parts
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


def old_day(farm) -> Part:
    """A day partition made before today's (a week and more ago), ids drawn from it from now on."""
    [[now]] = sql(farm, "SELECT extract(epoch FROM now())")
    day = int(now // DAY * DAY) - 30 * DAY
    part = Part(day, base(day))
    with farm._engine.connect() as conn:
        [first] = [made for made in parts(conn) if made.lo is None]  # empty on a new farm: every id below today's
    for name in ("qp_jobs", "qp_runs", schema.PAYLOADS):
        sql(farm, f"DROP TABLE {first.name(name)}")
    for name in ("qp_jobs", "qp_runs", schema.PAYLOADS):
        sql(farm, f"CREATE TABLE {part.name(name)} PARTITION OF {name} FOR VALUES FROM ({part.lo}) TO ({part.hi})")
    sql(farm, "SELECT setval('qp_jobs_id_seq', :lo)", lo=part.lo)
    return part


def ran(farm, spec: JobSpec, outcome: str = "succeeded") -> int:
    store = farm._store
    [job_id] = store.jobs.enqueue(spec)
    me = store.machines.register(name=f"m{job_id}", host="h", instance=f"i{job_id}", pid=1, version="t", capacity=1)
    [claimed] = store.jobs.claim(ClaimRequest(me, 1, 30.0))
    store.runs.finish(claimed, me, outcome, error=None if outcome == "succeeded" else "boom")
    return job_id


def names(farm) -> set[str]:
    with farm._engine.connect() as conn:
        return {part.name("qp_jobs") for part in parts(conn)}


def later(farm, days: float) -> float:
    return farm._store.ask_time() + days * DAY


def test_a_day_whose_jobs_all_finished_past_their_keep_is_dropped_and_its_keys_are_free_again(farm):
    day = old_day(farm)
    done = [ran(farm, JobSpec("http", "/ok", key=f"k-{n}", payload='{"n": 1}')) for n in range(3)]
    failed = ran(farm, JobSpec("http", "/bad", max_attempts=1), "failed")
    assert all(day.lo <= job_id < day.hi for job_id in [*done, failed])
    assert farm._store.jobs.prune_days(KEEP, now=later(farm, 8)) == 4
    assert day.name("qp_jobs") not in names(farm)
    assert sql(farm, "SELECT count(*) FROM qp_runs WHERE job_id >= :lo AND job_id < :hi", lo=day.lo, hi=day.hi) == [
        (0,)
    ]
    assert sql(farm, "SELECT count(*) FROM qp_payloads") == [(0,)]
    assert sql(farm, "SELECT count(*) FROM qp_job_keys") == [(0,)]
    farm.enqueue(farm.http_spec("/again", key="k-0"))  # its key is free again


def test_a_day_with_an_unfinished_job_keeps_it_and_loses_the_others(farm):
    day = old_day(farm)
    done = [ran(farm, JobSpec("http", "/ok")) for _ in range(3)]
    [waiting] = farm._store.jobs.enqueue(JobSpec("http", "/later", key="far"), delay=365 * DAY)
    now = later(farm, 8)
    assert farm._store.jobs.prune_days(KEEP, now=now) == 0, "pinned: not dropped"
    assert farm._store.jobs.prune(KEEP, now=now) == 3, "the DELETE path takes the others"
    left = {row[0] for row in sql(farm, "SELECT id FROM qp_jobs WHERE id >= :lo AND id < :hi", lo=day.lo, hi=day.hi)}
    assert left == {waiting} and not set(done) & left
    with pytest.raises(DuplicateKey):
        farm.enqueue(farm.http_spec("/again", key="far"))


def test_a_queue_kept_longer_keeps_its_jobs_while_the_farms_go(farm):
    old_day(farm)
    kept = ran(farm, JobSpec("http", "/ok", queue="audit"))
    farm.set_queue("audit", keep="30d")
    for _ in range(2):
        ran(farm, JobSpec("http", "/ok"))
    now = later(farm, 8)
    assert farm._store.jobs.prune_days(KEEP, now=now) == 0
    assert farm._store.jobs.prune(KEEP, now=now) == 2
    assert {job["id"] for job in farm._store.jobs.newest()} == {kept}
    assert farm._store.jobs.prune_days(KEEP, now=later(farm, 31)) == 1


def test_a_key_is_unique_across_days_and_an_order_key_runs_once_across_days(farm):
    day = old_day(farm)
    [first] = farm._store.jobs.enqueue(JobSpec("http", "/a", key="same", queue="q", order_key="o"))
    [[now]] = sql(farm, "SELECT extract(epoch FROM now())")
    sql(farm, "SELECT setval('qp_jobs_id_seq', :lo)", lo=base(int(now // DAY * DAY)))  # today's range again
    with pytest.raises(DuplicateKey):
        farm._store.jobs.enqueue(JobSpec("http", "/b", key="same"))
    [second] = farm._store.jobs.enqueue(JobSpec("http", "/b", queue="q", order_key="o"))
    assert first < day.hi <= second
    farm._store.count(update(schema.jobs).where(schema.jobs.c.id == first).values(state="running", owner=1))
    with pytest.raises(Exception, match="ux_qp_jobs_order_running"):
        farm._store.count(update(schema.jobs).where(schema.jobs.c.id == second).values(state="running", owner=1))


def test_jobs_in_old_days_are_found_retried_cancelled_and_searched(farm):
    old_day(farm)
    failed = ran(farm, JobSpec("http", "/bad", max_attempts=1, payload='{"team": "x"}'), "failed")
    [queued] = farm._store.jobs.enqueue(JobSpec("http", "/q"), delay=DAY)
    assert farm.job(failed)["state"] == "failed"
    assert [run["outcome"] for run in farm._store.runs.read(job_id=failed)] == ["failed"]
    farm.cancel(queued)
    assert farm.job(queued)["state"] == "cancelled"
    farm.retry(failed)
    assert farm.job(failed)["state"] == "queued"
    assert [job["id"] for job in farm.find_jobs(JobFilter(search="team=x"))] == [failed]
