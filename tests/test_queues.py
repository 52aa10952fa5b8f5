"""Named queues (issue 10): names, roles, pause, limits, rates and order keys, on each backend.

The claim's guards are tested on the store, where a test decides who claims when; the behaviour across
machines with in-process nodes (roles, pause) here, and with real node processes killed mid-run in
test_queues_farm.py.
"""

import pytest
from sqlalchemy import update
from sqlalchemy.dialects.mssql import pyodbc

from queueprocessor.errors import BadQueueInput, NotFound
from queueprocessor.farm import Farm
from queueprocessor.queues import OnFailure, QueueInfo, Rate, Served
from queueprocessor.schema import jobs
from queueprocessor.statements import claim_statement, spend_statement
from queueprocessor.store import JobSpec, Plan
from tests.support.work import PYJOBS, Nodes, run_cli, wait_for

NOOP = f"{PYJOBS}:noop"


def spec(queue="default", order_key=None, **extra) -> JobSpec:
    return JobSpec("python", NOOP, queue=queue, order_key=order_key, **extra)


def machine(farm, name="m", queues="") -> int:
    return farm.store.register(name=name, host="h", instance=f"{name}-i", pid=1, version="t", capacity=8,
                               queues=queues)


def test_names_rates_and_served_lists_are_checked_before_anything_is_written():
    assert Rate.parse("10/s") == Rate(10, 1.0) and str(Rate.parse(" 3 / min ")) == "3/min"
    assert Served.parse("reports:2, default") == Served(("reports", "default"), (("reports", 2),))
    assert str(Served.parse("reports:2,default")) == "reports:2,default" and Served.parse(None).every
    for bad in ("ten/s", "5/fortnight", "0/s", "/s", "10"):
        with pytest.raises(BadQueueInput, match="is not a rate"):
            Rate.parse(bad)
    for bad in (",", " , ", "a b", "x" * 65, "reports:0", "reports:two", "-x"):
        with pytest.raises(BadQueueInput):
            Served.parse(bad)


def test_a_claim_takes_only_the_queues_it_serves(farm):
    reports = farm.store.enqueue(spec("reports"), count=2)
    plain = farm.store.enqueue(spec(), count=2)
    me = machine(farm, queues="reports")
    assert {job.id for job in farm.store.claim(me, 8, 30.0, plan=Plan(served=("reports",)))} == set(reports)
    assert {job.queue for job in farm.store.claim(me, 8, 30.0)} == {"default"}, "every queue, by default"
    assert farm.store.get_job(plain[0])["queue"] == "default"


def test_a_paused_queue_starts_nothing_until_resumed_and_others_go_on(farm):
    held = farm.store.enqueue(spec("reports"))[0]
    other = farm.store.enqueue(spec())[0]
    me = machine(farm)
    farm.pause_queue("reports")
    assert [job.id for job in farm.store.claim(me, 8, 30.0)] == [other]
    assert [q.paused for q in farm.queues() if q.name == "reports"] == [True]
    farm.resume_queue("reports")
    assert [job.id for job in farm.store.claim(me, 8, 30.0)] == [held]


def test_queue_list_says_what_waits_runs_and_who_serves(farm):
    farm.store.enqueue(spec("reports", order_key="a"), count=3)
    farm.store.enqueue(spec("reports", order_key="b"))
    farm.set_queue("reports", limit=2, rate="10/s", on_failure=OnFailure.BLOCK)
    machine(farm, "r1", queues="reports:1")
    machine(farm, "any")
    [default, reports] = farm.queues()
    assert reports == QueueInfo(name="reports", waiting=4, running=0, limit=2, rate=Rate(10, 1.0), order_keys_waiting=2,
                                paused=False, on_failure=OnFailure.BLOCK, serving=("r1", "any"))
    assert default.serving == ("any",) and default.limit is None and default.on_failure == OnFailure.SKIP
    farm.set_queue("reports", limit=None)
    assert [q.limit for q in farm.queues()] == [None, None]
    assert farm.status()["machines"][0]["queues"] == ("reports",)
    assert [m["caps"] for m in farm.status()["machines"]] == [{"reports": 1}, {}]  # its own limit, published


def test_bad_queue_settings_change_nothing(farm):
    farm.store.enqueue(spec("reports"))
    farm.set_queue("reports", limit=3)
    for bad in (dict(limit=0), dict(limit=-1), dict(limit=2.5), dict(rate="ten/s"), dict(on_failure="retry")):
        with pytest.raises(BadQueueInput):
            farm.set_queue("reports", **bad)
    with pytest.raises(NotFound, match="no queue named 'reprots'"):
        farm.set_queue("reprots", limit=1)
    with pytest.raises(BadQueueInput):
        farm.enqueue_python(NOOP, queue="a b")
    with pytest.raises(BadQueueInput):
        farm.enqueue_python(NOOP, order_key="k" * 201)
    assert [(q.name, q.limit, q.waiting) for q in farm.queues()] == [("default", None, 0), ("reports", 3, 1)]


def test_jobs_of_an_order_key_start_one_at_a_time_in_enqueue_order(farm):
    store = farm.store
    a = store.enqueue(spec(order_key="a"), count=3)
    b = store.enqueue(spec(order_key="b"), count=2)
    loose = store.enqueue(spec())[0]
    me = machine(farm)
    first = {job.id: job for job in store.claim(me, 8, 30.0)}
    assert set(first) == {a[0], b[0], loose}, "the oldest of each key, and the job with none"
    assert store.claim(me, 8, 30.0) == []
    store.finish(first[a[0]], me, "succeeded")
    [second] = store.claim(me, 8, 30.0)
    assert second.id == a[1]
    store.finish(second, me, "failed", error="boom", retry_in=0.0)  # attempts left: it holds its key
    [again] = store.claim(me, 8, 30.0)
    assert again.id == a[1] and again.attempts == 2


@pytest.mark.parametrize("policy", list(OnFailure))
def test_a_job_that_failed_for_good_blocks_its_key_or_not_as_the_queue_says(farm, policy):
    store = farm.store
    first, after = store.enqueue(spec(order_key="k", max_attempts=1), count=2)
    farm.set_queue("default", on_failure=policy)
    me = machine(farm)
    [job] = store.claim(me, 8, 30.0)
    assert store.finish(job, me, "failed", error="boom") == "failed"
    taken = [job.id for job in store.claim(me, 8, 30.0)]
    assert taken == ([] if policy == OnFailure.BLOCK else [after])
    if policy == OnFailure.BLOCK:
        farm.retry(first)  # an operator retries it: it runs first, then the key moves on
        [again] = store.claim(me, 8, 30.0)
        assert again.id == first and store.claim(me, 8, 30.0) == []
        store.finish(again, me, "succeeded")
        assert [job.id for job in store.claim(me, 8, 30.0)] == [after]


def test_a_farm_wide_limit_counts_running_jobs_and_leases_taken_over(farm):
    store = farm.store
    farm.store.enqueue(spec("reports"), count=5)
    farm.set_queue("reports", limit=2)
    a, b = machine(farm, "a"), machine(farm, "b")
    locked = Plan(alone=(("reports", 8, True),))
    assert store.claim(a, 8, 30.0) == [], "a claim that does not lock a limited queue takes none of it"
    [first] = store.claim(a, 1, 30.0, plan=locked)
    assert len(store.claim(b, 8, 30.0, plan=locked)) == 1
    assert store.claim(b, 8, 30.0, plan=locked) == [], "two running: the limit"
    store.count(update(jobs).where(jobs.c.id == first.id).values(lease_until=jobs.c.lease_until - 60))  # a dies
    assert store.claim(b, 8, 30.0, plan=locked, take_expired=False) == [], "its job counts until its fence moves"
    taken = store.claim(b, 8, 30.0, plan=locked)
    assert [job.id for job in taken] == [first.id], "the expired lease is taken over, still within the limit"
    assert store.claim(b, 8, 30.0, plan=locked) == []


def test_a_machine_takes_at_most_its_own_limit_of_a_queue(farm):
    farm.store.enqueue(spec("reports"), count=5)
    farm.store.enqueue(spec(), count=5)
    me = machine(farm, queues="reports:2,default")
    claimed = farm.store.claim(me, 6, 30.0, plan=Plan(("reports", "default"), (("reports", 2, False),)))
    assert sorted(job.queue for job in claimed) == ["default"] * 4 + ["reports"] * 2


def test_a_rate_spends_tokens_in_the_claims_transaction(farm):
    farm.store.enqueue(spec("feed"), count=5)
    farm.set_queue("feed", rate="2/min")  # a bucket of one start: what a period brings, at least one
    me = machine(farm)
    locked = Plan(alone=(("feed", 8, True),))
    assert len(farm.store.claim(me, 8, 30.0, plan=locked)) == 1
    assert farm.store.claim(me, 8, 30.0, plan=locked) == [], "no token left for half a minute"


def test_roles_work_of_a_queue_waits_for_a_machine_that_serves_it(farm, http_target):
    nodes = Nodes(farm, http_base=http_target.base_url)
    try:
        plain = nodes("plain", queues="default")
        [job] = farm.enqueue_python(NOOP, queue="reports")
        assert farm.serving("reports") == ()
        wait_for(lambda: plain.turns_taken >= 3)
        assert farm.job(job)["state"] == "queued", "no live machine serves reports: it waits"
        reporter = nodes("reporter", queues="reports:1")
        assert farm.serving("reports") == ("reporter",)
        done = farm.wait(job, timeout=20)
        assert done["state"] == "succeeded" and {r["machine_id"] for r in done["runs"]} == {reporter.id}
    finally:
        nodes.stop_all()


def test_a_paused_queue_is_applied_by_running_nodes_and_resumed(farm, http_target):
    nodes = Nodes(farm, http_base=http_target.base_url)
    try:
        nodes("n1", queues="reports,default")
        farm.pause_queue("reports")
        [held] = farm.enqueue_python(NOOP, queue="reports")
        [other] = farm.enqueue_python(NOOP)
        assert farm.wait(other, timeout=20)["state"] == "succeeded"
        assert farm.job(held)["state"] == "queued", "paused: nothing of it starts while other queues run"
        farm.resume_queue("reports")
        assert farm.wait(held, timeout=20)["state"] == "succeeded"
    finally:
        nodes.stop_all()


@pytest.mark.parametrize("served, branches", [(True, 0), (False, 2), (True, 1)])
def test_the_queue_guards_compile_for_sql_server(served, branches):
    """No SQL Server runs here: the claim's queue shapes and the bucket's spending compile to T-SQL (LEAST and
    GREATEST need SQL Server 2022)."""
    dialect = pyodbc.dialect()
    claim = str(claim_statement("mssql", True, True, 4, served=served, branches=branches).compile(dialect=dialect))
    assert claim.startswith("UPDATE qp_jobs SET") and claim.count("WITH (UPDLOCK, ROWLOCK, READPAST)") == 2 + branches
    assert ("qp_jobs.queue IN" in claim or "j.queue IN" in claim) == served
    assert claim.count("least(") >= 2 * branches
    assert "UPDATE qp_queues SET tokens" in str(spend_statement("mssql").compile(dialect=dialect))


def test_enqueue_to_a_queue_nobody_serves_is_accepted_with_a_one_line_warning(db_url, capsys):
    assert run_cli("--db", db_url, "enqueue", "python", NOOP, "--queue", "reports", "--order-key", "k") == 0
    out, err = capsys.readouterr()
    assert out.startswith("enqueued job ") and err.strip().splitlines() == [
        "warning: no live machine serves queue 'reports' yet: its jobs wait until one does (node --queues)"]
    with Farm(db_url) as farm:
        [job] = farm.list_jobs()
        assert (job["queue"], job["order_key"], job["state"]) == ("reports", "k", "queued")
        machine(farm, "r", queues="reports")
    assert run_cli("--db", db_url, "enqueue", "python", NOOP, "--queue", "reports") == 0
    assert capsys.readouterr().err == "", "served: no warning"
