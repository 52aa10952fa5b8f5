"""Bulk actions and job filters, on every backend: which jobs a filter picks, and that a bulk retry, cancel or
delete changes exactly those its action may change, as the single action would, in batches that can be stopped."""

import pytest
from sqlalchemy import select, text, update

from queueprocessor import JobFilter
from queueprocessor.farm import Farm
from queueprocessor.rules.errors import QPError
from queueprocessor.rules.job import JobSpec
from queueprocessor.rules.search import BadSearch, BulkAction
from queueprocessor.store.matching import let_bitmaps, matching
from queueprocessor.store.schema import jobs
from queueprocessor.store.types import ClaimRequest
from tests.support.work import PYJOBS, Nodes, run_cli, wait_for


def _machine(store, name="m"):
    return store.machines.register(name=name, host="h", instance=f"i-{name}", pid=1, version="t", capacity=100)


def _finished(store, machine, count, outcome, target="/t", queue="default"):
    """`count` jobs run once and ended with `outcome` (max_attempts 1: a failure is final), through the claim and
    finish a node makes."""
    ids = store.jobs.enqueue(JobSpec(executor="http", target=target, queue=queue, max_attempts=1), count=count)
    for claimed in store.jobs.claim(ClaimRequest(machine, count, lease=30)):
        store.runs.finish(claimed, machine, outcome, error=None if outcome == "succeeded" else "boom")
    return ids


def _states(store, ids):
    return {job_id: store.jobs.get(job_id)["state"] for job_id in ids}


def test_a_filter_picks_by_state_queue_target_age_and_search(farm):
    store = farm._store
    m = _machine(store)
    failed = _finished(store, m, 2, "failed", target="/a")
    done = _finished(store, m, 1, "succeeded", target="/a")
    [reports] = store.jobs.enqueue(JobSpec(executor="http", target="/b", queue="reports"))

    def picked(**f):
        return sorted(j["id"] for j in farm.find_jobs(JobFilter(**f)))

    assert picked(state="failed") == sorted(failed)
    assert picked(target="/a") == sorted(failed + done)
    assert picked(queue="reports") == [reports]
    assert picked(search="queue:reports") == [reports]
    assert picked(state="failed", target="/b") == []
    assert picked(older_than=3600) == []  # everything here finished or was enqueued a moment ago
    assert picked(older_than=0, state="succeeded") == done
    assert picked(ids=(failed[0], reports)) == sorted([failed[0], reports])
    assert farm.count_jobs("retry", JobFilter(target="/a")) == 2  # a succeeded job is not retried
    assert farm.count_jobs("delete", JobFilter(target="/a")) == 3
    assert farm.count_jobs("cancel", JobFilter()) == 1
    with pytest.raises(QPError, match="unknown job state"):
        farm.find_jobs(JobFilter(state="nosuch"))


def test_bulk_retry_queues_exactly_the_failed_and_cancelled_jobs_picked_as_a_retry_does(farm):
    store = farm._store
    m = _machine(store)
    failed = _finished(store, m, 3, "failed", queue="reports")
    other_queue = _finished(store, m, 2, "failed")
    succeeded = _finished(store, m, 1, "succeeded", queue="reports")
    [cancelled] = store.jobs.enqueue(JobSpec(executor="http", target="/t", queue="reports"))
    store.jobs.cancel(cancelled)
    farm.pause_queue("reports")

    assert farm.retry_jobs(JobFilter(queue="reports")) == 4
    for job_id in [*failed, cancelled]:
        job = store.jobs.get(job_id)
        assert job["state"] == "queued" and job["finished_at"] is None and not job["cancel_requested"]
        assert job["max_attempts"] == job["attempts"] + 1
        assert job["gated"]  # its queue is paused: the retry gates it as a single retry does
    assert set(_states(store, other_queue).values()) == {"failed"}
    assert _states(store, succeeded) == {succeeded[0]: "succeeded"}
    assert farm.retry_jobs(JobFilter(queue="reports")) == 0  # nothing left that a retry may change

    farm.resume_queue("reports")
    claimed = store.jobs.claim(ClaimRequest(m, 10, lease=30))
    assert sorted(c.id for c in claimed) == sorted([*failed, cancelled])


def test_bulk_cancel_cancels_queued_jobs_and_asks_owners_to_stop_running_ones(farm):
    store = farm._store
    m = _machine(store)
    running = store.jobs.enqueue(JobSpec(executor="http", target="/t", order_key="k"))
    assert [c.id for c in store.jobs.claim(ClaimRequest(m, 1, lease=30))] == running
    queued = store.jobs.enqueue(JobSpec(executor="http", target="/t", order_key="k"), count=3)
    done = _finished(store, m, 1, "succeeded", target="/other")

    assert farm.count_jobs("cancel", JobFilter(target="/t")) == 4
    assert farm.cancel_jobs(JobFilter(target="/t")) == 4
    job = store.jobs.get(running[0])
    assert job["state"] == "running" and job["cancel_requested"]  # its owner stops it, under its fence
    assert set(_states(store, queued).values()) == {"cancelled"}
    assert _states(store, done) == {done[0]: "succeeded"}
    assert farm.cancel_jobs(JobFilter(target="/t")) == 0  # asked once is enough


def test_bulk_delete_removes_finished_jobs_with_their_runs_and_refuses_an_empty_filter(farm):
    store = farm._store
    m = _machine(store)
    failed = _finished(store, m, 2, "failed")
    succeeded = _finished(store, m, 2, "succeeded")
    [queued] = store.jobs.enqueue(JobSpec(executor="http", target="/t"))

    with pytest.raises(QPError, match="empty filter would delete every job"):
        farm.delete_jobs(JobFilter())
    assert farm.delete_jobs(JobFilter(state="failed")) == 2
    assert [j["id"] for j in farm.find_jobs(JobFilter(ids=tuple(failed)))] == []
    assert store.runs.read(job_id=failed[0]) == []
    assert farm.delete_jobs(JobFilter(), everything=True) == 2  # the succeeded ones; the queued job stays
    assert [j["id"] for j in farm.find_jobs(JobFilter())] == [queued]
    assert all(store.runs.read(job_id=j) == [] for j in succeeded)


def test_a_bulk_action_stopped_between_batches_leaves_every_job_changed_whole_or_untouched(farm):
    store = farm._store
    m = _machine(store)
    failed = _finished(store, m, 25, "failed")
    told = []

    def stop():
        return len(told) == 2

    changed = store.bulk.run(BulkAction.RETRY, JobFilter(state="failed"), batch=10, stop=stop, progress=told.append)
    assert changed == 20 and told == [10, 20]
    jobs_now = [store.jobs.get(j) for j in failed]
    retried = [j for j in jobs_now if j["state"] == "queued"]
    assert len(retried) == 20 and all(j["finished_at"] is None and j["max_attempts"] == 2 for j in retried)
    untouched = [j for j in jobs_now if j["state"] == "failed"]
    assert len(untouched) == 5 and all(j["finished_at"] is not None and j["max_attempts"] == 1 for j in untouched)
    assert store.bulk.run(BulkAction.RETRY, JobFilter(state="failed"), batch=10) == 5


def test_a_selection_of_many_ids_is_acted_on_in_pieces(farm):
    store = farm._store
    ids = store.jobs.enqueue(JobSpec(executor="http", target="/t"), count=1_200)
    # As a finish leaves them (the claim and finish of 1,200 jobs would only slow the test).
    store.count(update(jobs).values(state="failed", finished_at=1.0))
    assert farm.retry_jobs(JobFilter(ids=tuple(ids[:1_100]))) == 1_100
    assert farm.count_jobs("retry", JobFilter()) == 100


def test_a_running_job_in_a_limited_queue_cancelled_in_bulk_frees_its_place_as_a_single_cancel_does(farm):
    ids = farm.enqueue_python(f"{PYJOBS}:wait_for_cancel", queue="slow", count=4)
    farm.set_queue("slow", limit=2)
    nodes = Nodes(farm)
    try:
        nodes("a", capacity=4)
        wait_for(lambda: farm.queue("slow").running == 2)
        assert farm.cancel_jobs(JobFilter(queue="slow")) == 4
        wait_for(lambda: all(farm.job(j)["state"] == "cancelled" for j in ids))
        assert farm.queue("slow").running == 0 and farm.queue("slow").waiting == 0
    finally:
        nodes.stop_all()


@pytest.mark.parametrize(
    "search, expected",
    [
        ("n=12", {"number", "string"}),  # a value matches the field as a number and as a string
        ('n="12"', {"number", "string"}),
        ("customer.id=c-7", {"nested"}),
        ("customer.id=c-8", set()),
        ("flag=true", {"number"}),
        ("flag=false", set()),
        ("none=null", {"string"}),
        ("key:order-1", {"number"}),  # the order key
        ("key:unique-1", {"string"}),  # the unique key
        ("queue:reports n=12", {"string"}),
        ("n=12 /special", {"string"}),  # plain words match the target
        ("/special queue:default", set()),
        ("missing=1", set()),
        ('say "hi" there', {"quoted"}),  # plain text, with no term of the grammar: searched as typed
    ],
)
def test_search_expressions_match_payload_fields_keys_and_queues(farm, search, expected):
    store = farm._store
    made = {
        "number": JobSpec(executor="http", target="/plain", payload='{"n": 12, "flag": true}', order_key="order-1"),
        "string": JobSpec(
            executor="http",
            target="/special",
            payload='{"n": "12", "none": null}',
            queue="reports",
            key="unique-1",
        ),
        "nested": JobSpec(executor="http", target="/plain", payload='{"customer": {"id": "c-7"}}'),
        "not json": JobSpec(executor="http", target="/plain", payload="n=12 is not JSON"),
        "no payload": JobSpec(executor="http", target="/plain"),
        "quoted": JobSpec(executor="http", target='/say "hi" there'),
    }
    names = {store.jobs.enqueue(spec)[0]: name for name, spec in made.items()}
    assert {names[j["id"]] for j in farm.find_jobs(JobFilter(search=search))} == expected


@pytest.mark.parametrize(
    "search, said",
    [
        ('error="no route', "a double quote is not closed"),
        ("a..b=1", "a field is letters, digits"),
        ("a=", "give a value after a="),
        ("queue:", "give a name after queue:"),
        ("queue:no/such", "is not a queue name"),
    ],
)
def test_a_bad_search_is_one_line_saying_what_to_write(farm, search, said):
    with pytest.raises(BadSearch) as raised:
        farm.find_jobs(JobFilter(search=search))
    message = str(raised.value)
    assert said in message and "\n" not in message


@pytest.mark.postgres
def test_on_postgresql_a_rare_payload_value_is_found_through_the_index_and_a_common_one_by_the_newest_jobs(pg_url):
    """The farm's connections plan no bitmap scans (connections.PLANNER_HINT), the only scans a GIN index has: a
    search allows them in its own transaction, and the payloads' statistics tell the planner which values are rare."""
    with Farm(pg_url) as farm:
        engine = farm._engine
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO qp_jobs (executor, target, method, payload, state, priority, run_at, created_at, "
                    "attempts, max_attempts, fence, cancel_requested, kind, queue, gated) "
                    "SELECT 'http', '/t', 'GET', json_build_object('id', i, 'day', 'd' || (i % 2))::text, 'succeeded', "
                    "0, 0, 0, 1, 1, 1, false, 'job', 'default', false FROM generate_series(1, 50000) AS i"
                )
            )
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE qp_jobs, qp_payloads"))  # as autovacuum leaves them (no pending list)

        def plan(search):
            statement = (
                select(jobs.c.id).where(*matching(JobFilter(search=search))).order_by(jobs.c.id.desc()).limit(500)
            )
            with engine.begin() as conn:
                let_bitmaps(farm._store, conn, JobFilter(search=search))
                sql = str(statement.compile(conn, compile_kwargs={"literal_binds": True}))
                return "\n".join(row[0] for row in conn.execute(text(f"EXPLAIN {sql}")))

        with engine.connect() as conn:  # the GIN index, on each partition of qp_payloads since schema 14
            gin = "SELECT indexname FROM pg_indexes WHERE tablename LIKE 'qp\\_payloads%' AND indexdef LIKE '%gin%'"
            names = conn.execute(text(gin)).scalars().all()
        assert any(f"Bitmap Index Scan on {name}" in plan("id=4242") for name in names), names
        assert not any(name in plan("day=d1") for name in names)  # half the jobs: the newest 500 are found at once
        assert [j["id"] for j in farm.find_jobs(JobFilter(search="id=4242"))] == [4242]


@pytest.mark.postgres
def test_a_bulk_action_says_how_many_jobs_it_found_busy_and_left_unchanged(pg_url, capsys):
    """A job another transaction holds (a claim, a finish) is skipped by the bulk action's SKIP LOCKED: the result,
    the CLI and the event say how many, so the operator runs it again; the second run takes it."""
    with Farm(pg_url) as farm:
        ids = farm._store.jobs.enqueue(JobSpec(executor="http", target="/t", queue="busy"), count=4)
        holder = farm._engine.connect()
        try:
            holder.begin()
            holder.execute(select(jobs.c.id).where(jobs.c.id == ids[1]).with_for_update())
            changed = farm.cancel_jobs(JobFilter(queue="busy"))
            assert (changed, changed.busy) == (3, 1)
            [event] = [e for e in farm.events(3600) if e["kind"] == "jobs.bulk"]
            assert event["detail"].endswith("3 jobs; 1 was busy and left unchanged: run it again")
            farm._store.jobs.enqueue(JobSpec(executor="http", target="/t", queue="busy"))
            assert run_cli("--db", pg_url, "cancel", "--queue", "busy") == 0
            said = capsys.readouterr().out
            assert said.endswith(
                "cancelled (running ones stop within a heartbeat); 1 was busy and left unchanged: run it again\n"
            )
            assert said.startswith("1 job ")
        finally:
            holder.rollback()
            holder.close()
        assert _states(farm._store, [ids[1]]) == {ids[1]: "queued"}
        again = farm.cancel_jobs(JobFilter(queue="busy"))
        assert (again, again.busy) == (1, 0)


@pytest.mark.postgres
def test_on_postgresql_each_payload_has_its_row_apart_whatever_door_its_job_came_by_until_it_is_pruned(pg_url):
    """The payloads' own table (schema.payloads_ddl) holds one row per job with a payload, written by the Python
    enqueue (one or many), by qp_enqueue, and never by a job without one; retention deletes it with its job."""
    with Farm(pg_url) as farm:
        spec = farm.python_spec("bench.jobs:noop", {"day": "monday"})
        ids = [*farm.enqueue(spec, count=2), *farm.enqueue(farm.python_spec("bench.jobs:noop"))]
        with farm._engine.begin() as conn:
            ids.append(
                conn.execute(text("""SELECT qp_enqueue('python', 'bench.jobs:noop', '{"day": "friday"}')""")).scalar()
            )
        with farm._engine.connect() as conn:
            kept = dict(conn.execute(text("SELECT job_id, doc->>'day' FROM qp_payloads")).all())
        assert kept == {ids[0]: "monday", ids[1]: "monday", ids[3]: "friday"}
        assert {job["id"] for job in farm.find_jobs(JobFilter(search="day=monday"))} == set(ids[:2])
        with farm._engine.begin() as conn:
            conn.execute(text("UPDATE qp_jobs SET state = 'succeeded', finished_at = 0"))
        assert farm._store.jobs.prune(keep_seconds=60) == 4
        with farm._engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM qp_payloads")).scalar() == 0
