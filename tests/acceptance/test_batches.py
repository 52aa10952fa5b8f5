"""Batch functions (`@job(batch=N)`): many jobs in one call, each still a job of its own, on PostgreSQL with
in-process nodes, and with 2 real node processes for the rules per job (a queue's limit, order keys). What is
checked is what each job's row and runs say and what the function (or the service it called) saw; nothing is
timed."""

import json

import pytest

from queueprocessor import job
from queueprocessor.executors import PythonExecutor
from queueprocessor.farm import Farm
from queueprocessor.node.runner import JobRunner
from queueprocessor.rules.errors import InvalidJob
from queueprocessor.store.types import ClaimRequest
from tests.support import pyjobs
from tests.support.httptarget import most_at_once
from tests.support.work import FAST, PYJOBS, NodeProcesses, Nodes, RunningSampler, wait_for

pytestmark = pytest.mark.postgres

ENDED = ("succeeded", "failed", "cancelled")


@pytest.fixture
def farm(pg_url):
    with Farm(pg_url) as the_farm:
        the_farm.settings(**FAST)
        yield the_farm
        the_farm._store.give_back()


@pytest.fixture
def nodes(farm):
    pyjobs.SEEN.clear()
    pyjobs.BATCHES.clear()
    pyjobs.IN_FLIGHT.update(jobs=0, most=0, calls=0, most_calls=0, keys=set(), overlaps=[])
    started = Nodes(farm)
    yield started
    started.stop_all()


def ended(farm, ids, timeout=20.0):
    """The jobs `ids`, once every one of them has ended."""

    def look():
        found = [farm.job(i) for i in ids]
        return all(j["state"] in ENDED for j in found) and found

    return wait_for(look, timeout=timeout)


def called_with(ids) -> list[list[int]]:
    """The calls that had any of `ids`, as the job ids each was given."""
    return [call for call in pyjobs.BATCHES if set(call) & set(ids)]


def test_a_returned_list_ends_each_job_of_the_call_by_its_own_entry(farm, nodes):
    # Enqueued before the node starts: its first claim takes all three, and they are called together.
    ids = [pyjobs.batch_each.enqueue(farm, p) for p in ({"n": 1}, {"fail": "no good"}, {"n": 3})]
    nodes("a", capacity=20)
    first, bad, third = ended(farm, ids)
    assert called_with(ids) == [ids], "one call for the three"
    assert first["state"] == third["state"] == "succeeded"
    assert json.loads(first["runs"][0]["output"]) == {"echo": {"n": 1}, "job": ids[0]}
    assert json.loads(third["runs"][0]["output"]) == {"echo": {"n": 3}, "job": ids[2]}
    assert bad["state"] == "failed" and bad["last_error"] == "ValueError: no good"
    for each in (first, bad, third):  # each its own run, fence and attempt
        [run] = each["runs"]
        assert (run["attempt"], run["fence"]) == (1, 1)


def test_a_raise_fails_every_job_of_the_call_and_each_retries_by_its_own_max_attempts(farm, nodes):
    nodes("a", capacity=20)
    wait_for(lambda: farm.serving("default"))
    once = pyjobs.batch_raise.enqueue(farm, "once", max_attempts=1)
    twice = pyjobs.batch_raise.enqueue(farm, "twice", max_attempts=2)
    thrice = pyjobs.batch_raise.enqueue(farm, "thrice")  # the decorator's 3
    jobs_ = dict(zip(("once", "twice", "thrice"), ended(farm, [once, twice, thrice], timeout=30)))
    for name, attempts in (("once", 1), ("twice", 2), ("thrice", 3)):
        found = jobs_[name]
        assert found["state"] == "failed", name
        assert [r["outcome"] for r in found["runs"]] == ["failed"] * attempts, name
        assert all(r["error"].startswith("RuntimeError: all ") for r in found["runs"]), name


def test_a_plain_return_succeeds_every_job_and_a_lone_job_is_not_held_for_a_batch(farm, nodes):
    """The node never waits for a batch to fill: a job enqueued alone on an idle farm is called alone, by the claim
    its push brought, and the jobs of one enqueue are called together."""
    nodes("a", capacity=20)
    wait_for(lambda: farm.serving("default"))
    [lone] = farm.enqueue_python(pyjobs.batch_async, "lone")
    [done] = ended(farm, [lone])
    assert called_with([lone]) == [[lone]]
    assert done["state"] == "succeeded" and json.loads(done["runs"][0]["output"]) == {"batch": 1}
    five = farm.enqueue_python(pyjobs.batch_async, "five", count=5)
    assert {j["state"] for j in ended(farm, five)} == {"succeeded"}
    assert called_with(five) == [five]


def test_the_runner_calls_a_lone_job_before_any_other_claim_comes(farm):
    """At the runner: a job submitted alone is called at once, with nothing else ever submitted while it waits (a
    runner holding it back for a batch to fill would never call it), and the next claim makes a call of its own."""
    pyjobs.BATCHES.clear()
    store = farm._store
    machine = store.machines.register(name="m", host="h", instance="batch-test", pid=1, version="0", capacity=20)
    spec = farm.python_spec(pyjobs.batch_async, None)
    store.jobs.enqueue(spec)
    [first] = store.jobs.claim(ClaimRequest(machine, 20, 30.0))
    runner = JobRunner(store, machine, {"python": PythonExecutor((PYJOBS,))}, store.ask_time, lambda *_: None)
    runner.start()
    try:
        runner.submit(first)
        wait_for(lambda: pyjobs.BATCHES == [[first.id]])
        store.jobs.enqueue(spec, count=3)
        three = store.jobs.claim(ClaimRequest(machine, 20, 30.0))
        runner.submit_many(three)
        wait_for(lambda: len(pyjobs.BATCHES) == 2)
        assert pyjobs.BATCHES == [[first.id], [j.id for j in three]]
        wait_for(lambda: runner.count() == 0)
    finally:
        runner.stop()
    assert {store.jobs.get(i)["state"] for i in (first.id, *(j.id for j in three))} == {"succeeded"}


def test_a_backlog_is_claimed_half_a_capacity_at_a_time_so_the_next_call_is_at_work_before_the_last_ends(farm, nodes):
    """Working off a backlog, a node's claim takes at most half its capacity and it claims the room left at once: the
    jobs of the next claim are at work while the last claim's are, two calls of one node at once (a claim that took
    the whole room would leave none until its call ended). A turn's claim may take the whole room."""
    nodes("a", capacity=20)
    wait_for(lambda: farm.serving("default"))
    ids = farm.enqueue_python(pyjobs.batch_busy, None, count=200)
    assert {j["state"] for j in ended(farm, ids, timeout=60)} == {"succeeded"}
    calls = called_with(ids)
    assert sum(len(call) <= 10 for call in calls) > len(calls) / 2, "most calls are of a backlog's claims: half"
    assert pyjobs.IN_FLIGHT["most_calls"] >= 2, "two calls at work at once on the one node"
    assert pyjobs.IN_FLIGHT["most"] <= 20, "never more at work than the node's capacity"


def test_a_farm_wide_limit_of_5_never_has_6_running_with_batches_of_20(farm, nodes):
    nodes("a", capacity=20)
    nodes("b", capacity=20)
    wait_for(lambda: len(farm.serving("default")) == 2)
    farm.enqueue_python(pyjobs.batch_busy, None, queue="limited")  # makes the queue known, then limit it
    farm.set_queue("limited", limit=5)
    with RunningSampler(farm, "limited") as sampler:
        ids = farm.enqueue_python(pyjobs.batch_busy, None, queue="limited", count=60)
        done = ended(farm, ids, timeout=60)
    assert {j["state"] for j in done} == {"succeeded"}
    assert pyjobs.IN_FLIGHT["most"] <= 5, "never more than the limit inside calls at once, across both nodes"
    assert max(sampler.counts) <= 5, "nor running, as the database says"
    assert max(len(call) for call in called_with(ids)) > 1, "the jobs were called in batches"


def test_two_jobs_of_one_order_key_are_never_in_flight_at_once_in_one_batch_or_two(farm, nodes):
    nodes("a", capacity=20)
    nodes("b", capacity=20)
    wait_for(lambda: len(farm.serving("default")) == 2)
    ids = [
        farm.enqueue_python(pyjobs.batch_busy, {"key": key, "seq": seq}, order_key=f"k{key}")[0]
        for seq in range(5)
        for key in range(6)
    ]
    done = ended(farm, ids, timeout=60)
    assert {j["state"] for j in done} == {"succeeded"}
    assert pyjobs.IN_FLIGHT["overlaps"] == []
    assert max(len(call) for call in called_with(ids)) > 1, "the jobs were called in batches"


def test_a_timeout_ends_every_job_of_the_call_with_the_reason_on_each(farm, nodes):
    nodes("a", capacity=20)
    wait_for(lambda: farm.serving("default"))
    ids = farm.enqueue_python(pyjobs.batch_sleep_async, None, count=3)
    done = ended(farm, ids)
    assert called_with(ids) == [ids]
    for each in done:
        [run] = each["runs"]
        assert each["state"] == "failed" and run["outcome"] == "timeout"
        assert run["error"] == "stopped after its timeout of 0.5 s"
        seen = pyjobs.SEEN[each["id"]]
        assert seen["noticed"] and seen["context"].cancelled.is_set(), "the call was cancelled, every flag set"


def test_a_cancel_of_one_job_of_a_running_batch_ends_that_job_alone(farm, nodes):
    """The call is one unit of work: the cancelled job's flag is set, the call goes on for the others, and the
    cancelled job ends as cancelled when it returns, its entry of the result discarded."""
    nodes("a", capacity=20)
    wait_for(lambda: farm.serving("default"))
    ids = farm.enqueue_python(pyjobs.batch_until_cancelled, None, count=3)
    wait_for(lambda: called_with(ids))
    assert farm.cancel(ids[1]) == "cancelling"
    first, cancelled, third = ended(farm, ids)
    assert called_with(ids) == [ids]
    assert [pyjobs.SEEN[i]["cancelled"] for i in ids] == [False, True, False], "only its flag was set"
    assert first["state"] == third["state"] == "succeeded"
    assert json.loads(first["runs"][0]["output"]) == {"job": ids[0]}
    assert cancelled["state"] == "cancelled"
    [run] = cancelled["runs"]
    assert run["outcome"] == "cancelled" and run["error"] == "cancelled by an operator" and run["output"] is None


def test_an_async_batch_is_cancelled_as_a_whole_once_every_job_of_it_is_cancelled(farm, nodes):
    nodes("a", capacity=20)
    wait_for(lambda: farm.serving("default"))
    ids = farm.enqueue_python(pyjobs.batch_sleep_async, None, count=2, timeout=60)
    wait_for(lambda: called_with(ids))
    for job_id in ids:
        farm.cancel(job_id)
    done = ended(farm, ids)
    assert [j["state"] for j in done] == ["cancelled", "cancelled"]
    for job_id, each in zip(ids, done):
        seen = pyjobs.SEEN[job_id]
        assert seen["noticed"] and seen["context"].cancelled.is_set(), "the call was cancelled, every flag set"
        assert [r["outcome"] for r in each["runs"]] == ["cancelled"]


def test_batch_must_be_a_whole_number_of_jobs():
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(InvalidJob, match="batch="):
            job(batch=bad)(pyjobs.noop)
    assert job(batch=7)(pyjobs.noop).batch == 7 and job(pyjobs.noop).batch is None


def test_a_lost_lease_of_one_job_of_a_running_batch_hands_that_job_back_alone(farm):
    """At the runner, as its heartbeat does when a renewal misses one run: that job's flag is set, the call goes on
    for the others, and once it returns the lost job is handed back (no attempt spent), its result discarded."""
    pyjobs.BATCHES.clear()
    pyjobs.SEEN.clear()
    store = farm._store
    machine = store.machines.register(name="m", host="h", instance="batch-test", pid=1, version="0", capacity=20)
    store.jobs.enqueue(farm.python_spec(pyjobs.batch_until_cancelled, None), count=3)
    claimed = store.jobs.claim(ClaimRequest(machine, 20, 30.0))
    runner = JobRunner(store, machine, {"python": PythonExecutor((PYJOBS,))}, store.ask_time, lambda *_: None)
    runner.start()
    try:
        runner.submit_many(claimed)
        wait_for(lambda: pyjobs.BATCHES)
        lost = claimed[1]
        assert runner.stop_job((lost.id, lost.fence), "lost")
        wait_for(lambda: runner.count() == 0)
    finally:
        runner.stop()
    assert pyjobs.BATCHES == [[j.id for j in claimed]]
    assert [pyjobs.SEEN[j.id]["cancelled"] for j in claimed] == [False, True, False]
    first, back, third = (farm.job(j.id) for j in claimed)
    assert first["state"] == third["state"] == "succeeded"
    assert back["state"] == "queued" and back["attempts"] == 0, "handed back, no attempt spent"
    [run] = back["runs"]
    assert run["outcome"] == "lost" and run["output"] is None


# The same rules with 2 real node processes, judged by what the work did: each job of batch_call sends its own
# request to the recording service, so the service's record says which jobs were at work at once, and together.


def two_node_processes(farm, pg_url, http_target, tmp_path, capacity=20) -> NodeProcesses:
    procs = NodeProcesses(pg_url, tmp_path)
    for name in ("a", "b"):
        procs(name, "--http-base", http_target.base_url, capacity=capacity)
    wait_for(lambda: len(farm.serving("default")) == 2, timeout=30)
    return procs


def test_two_node_processes_with_a_limit_of_5_never_have_6_at_work(farm, pg_url, http_target, tmp_path):
    # Room for 3 each: neither can fill the limit alone, so both work the queue at once, and the limit binds.
    procs = two_node_processes(farm, pg_url, http_target, tmp_path, capacity=3)
    try:
        farm.enqueue_python(pyjobs.batch_call, {"url": http_target.base_url + "ok"}, queue="limited")
        farm.set_queue("limited", limit=5)
        with RunningSampler(farm, "limited") as sampler:
            payload = {"url": http_target.base_url + "sleep/0.1"}
            ids = farm.enqueue_python(pyjobs.batch_call, payload, queue="limited", count=60)
            done = ended(farm, ids, timeout=90)
    finally:
        procs.kill_all()
    assert {j["state"] for j in done} == {"succeeded"}
    work = [r for r in http_target.requests("/sleep") if r["job"] in ids]
    assert sorted(r["job"] for r in work) == sorted(ids), "each job's work, once"
    assert most_at_once(work) <= 5, "never more than the limit at work at once, across both processes"
    assert max(sampler.counts) <= 5, "nor running, as the database says"
    assert len({r["machine"] for r in work}) == 2 and max(map(len, pyjobs.called_together(work).values())) > 1


def test_two_node_processes_never_have_two_jobs_of_one_order_key_at_work_at_once(farm, pg_url, http_target, tmp_path):
    procs = two_node_processes(farm, pg_url, http_target, tmp_path)
    try:
        ids = {
            farm.enqueue_python(
                pyjobs.batch_call, {"url": f"{http_target.base_url}sleep/0.05?key=k{key}"}, order_key=f"k{key}"
            )[0]: key
            for seq in range(5)
            for key in range(6)
        }
        done = ended(farm, list(ids), timeout=90)
    finally:
        procs.kill_all()
    assert {j["state"] for j in done} == {"succeeded"}
    work = [r for r in http_target.requests("/sleep") if r["job"] in ids]
    assert sorted(r["job"] for r in work) == sorted(ids), "each job's work, once"
    for key in range(6):
        of_key = [r for r in work if ids[r["job"]] == key]
        assert most_at_once(of_key) == 1, f"two jobs of order key k{key} at work at once"
        runs = sorted((run["started_at"], run["finished_at"]) for j in done if ids[j["id"]] == key for run in j["runs"])
        assert all(a[1] <= b[0] for a, b in zip(runs, runs[1:])), f"two runs of order key k{key} overlap"
    assert len({r["machine"] for r in work}) == 2 and max(map(len, pyjobs.called_together(work).values())) > 1
