"""A snoozed run (a 429 with Retry-After, context.snooze, a command's exit code 75) on every backend, PgBouncer too:
its job goes back to the queue at database now + the delay with its attempt refunded, the run is recorded with its
reason, the write is fenced, a cancel asked meanwhile ends the job cancelled, a limited queue's place is freed, an
order key keeps its place, and a job snoozes at most MAX_SNOOZES times before a snooze fails like any failure."""

import time

import pytest
from sqlalchemy import select, update

from queueprocessor.farm import Farm
from queueprocessor.rules.job import Ending, JobSpec
from queueprocessor.rules.limits import MAX_SNOOZES
from queueprocessor.rules.states import Outcome
from queueprocessor.store.schema import jobs, queues
from queueprocessor.store.types import ClaimRequest, Plan
from tests.conftest import BACKENDS, PGBOUNCER, backend_url

WORK = JobSpec(executor="python", target="bench.jobs:noop", max_attempts=2)
WHY = "GET http://t/x answered HTTP 429, Retry-After 30; back in 30 s"


@pytest.fixture(params=[*BACKENDS, PGBOUNCER])
def farm(request, tmp_path):
    the_farm = Farm(backend_url(request, tmp_path))
    yield the_farm
    the_farm._store.give_back()
    leaked = the_farm._engine.pool.checkedout()
    the_farm.close()
    assert leaked == 0, f"{leaked} database connections were not returned to the pool"


def register(store, name="m"):
    return store.machines.register(
        name=name, host="h", instance=f"{name}-{time.monotonic_ns()}", pid=1, version="t", capacity=64
    )


def claim(store, me):
    return store.jobs.claim(ClaimRequest(me, 64, 30.0))


def snoozed(claimed, delay=30.0, why=WHY):
    return Ending(claimed, Outcome.SNOOZED, why, delay, None, True)


def test_a_snooze_puts_the_job_back_at_the_delay_with_its_attempt_refunded(farm):
    store = farm._store
    me = register(store)
    [job_id] = store.jobs.enqueue(WORK)
    [claimed] = claim(store, me)
    assert claimed.attempts == 1
    before = store.ask_time()
    assert store.runs.finish_many(me, [snoozed(claimed)]) == ["queued"]
    job = store.jobs.get(job_id)
    assert (job["state"], job["attempts"], job["snoozes"], job["owner"]) == ("queued", 0, 1, None)
    assert job["last_error"] == WHY
    assert before + 30 <= job["run_at"] <= store.ask_time() + 30
    [run] = store.runs.read(job_id=job_id)
    assert (run["outcome"], run["error"], run["attempt"], run["fence"]) == ("snoozed", WHY, 1, claimed.fence)
    assert claim(store, me) == [], "not due before its delay"
    store.count(update(jobs).where(jobs.c.id == job_id).values(run_at=store.ask_time() - 1))
    [again] = claim(store, me)
    assert (again.id, again.attempts) == (job_id, 1), "its next run is on the same attempt"
    assert store.runs.finish(again, me, Outcome.SUCCEEDED) == "succeeded"
    shown = farm.job(job_id)
    assert (shown["snoozes"], [r["outcome"] for r in shown["runs"]]) == (1, ["succeeded", "snoozed"])


def test_a_snooze_in_a_batch_of_endings_touches_its_job_alone(farm):
    store = farm._store
    me = register(store)
    ids = store.jobs.enqueue(WORK, count=3)
    a, b, c = sorted(claim(store, me), key=lambda j: j.id)
    endings = [Ending(a, Outcome.SUCCEEDED), snoozed(b, 0.0), Ending(c, Outcome.FAILED, "flaky", 0.0)]
    assert store.runs.finish_many(me, endings) == ["succeeded", "queued", "queued"]
    rows = {i: store.jobs.get(i) for i in ids}
    assert [(rows[i]["attempts"], rows[i]["snoozes"]) for i in ids] == [(1, None), (0, 1), (1, None)]
    assert {r["job_id"]: r["outcome"] for r in store.runs.read()} == {
        a.id: "succeeded",
        b.id: "snoozed",
        c.id: "failed",
    }


def test_a_snooze_is_fenced(farm):
    """A late writer (the lease lost, the job claimed again under a new fence) snoozes nothing."""
    store = farm._store
    me, other = register(store), register(store, "other")
    [job_id] = store.jobs.enqueue(WORK)
    [old] = store.jobs.claim(ClaimRequest(me, 64, 0.05))
    time.sleep(0.1)
    [new] = store.jobs.claim(ClaimRequest(other, 64, 30.0))
    assert new.fence > old.fence
    assert store.runs.finish_many(me, [snoozed(old)]) == [None]
    job = store.jobs.get(job_id)
    assert (job["state"], job["owner"], job["attempts"], job["snoozes"]) == ("running", other, 2, None)
    assert [r["outcome"] for r in store.runs.read(job_id=job_id) if r["outcome"] == "snoozed"] == []


@pytest.mark.parametrize("children", [False, True])
def test_a_snooze_of_a_job_asked_to_stop_ends_it_cancelled(farm, children):
    store = farm._store
    me = register(store)
    [job_id] = store.jobs.enqueue(WORK)
    child = (
        store.jobs.enqueue(JobSpec(executor="python", target="bench.jobs:noop", after=(job_id,)))[0]
        if children
        else None
    )
    [claimed] = claim(store, me)
    assert farm.cancel(job_id) == "cancelling"
    assert store.runs.finish_many(me, [snoozed(claimed)]) == ["cancelled"]
    job = store.jobs.get(job_id)
    assert (job["state"], job["last_error"]) == ("cancelled", "cancelled by an operator")
    if child is not None:
        assert store.jobs.get(child)["state"] == "cancelled"
    assert claim(store, register(store, "other")) == []


def test_a_parent_that_snoozes_keeps_its_children_waiting(farm):
    store = farm._store
    me = register(store)
    [parent] = store.jobs.enqueue(WORK)
    [child] = store.jobs.enqueue(JobSpec(executor="python", target="bench.jobs:noop", after=(parent,)))
    [claimed] = claim(store, me)
    assert store.runs.finish_many(me, [snoozed(claimed, 0.0)]) == ["queued"]
    assert (store.jobs.get(parent)["attempts"], store.jobs.get(child)["state"]) == (0, "waiting")
    [again] = claim(store, me)
    assert again.id == parent
    assert store.runs.finish(again, me, Outcome.SUCCEEDED) == "succeeded"
    assert store.jobs.get(child)["state"] == "queued"


def test_a_snooze_frees_its_place_in_a_limited_queue(farm):
    store = farm._store
    narrow = JobSpec(executor="python", target="bench.jobs:noop", queue="narrow")
    first, second = store.jobs.enqueue(narrow, count=2)
    farm.set_queue("narrow", limit=1)
    me = register(store)
    plan = Plan(served=("narrow",), alone=(("narrow", 8, True),))
    [claimed] = store.jobs.claim(ClaimRequest(me, 8, 30.0, plan=plan))
    assert claimed.id == first
    assert running_count(store) == 1
    assert store.runs.finish_many(me, [snoozed(claimed, 3600.0)]) == ["queued"]
    assert running_count(store) == 0
    assert [j.id for j in store.jobs.claim(ClaimRequest(me, 8, 30.0, plan=plan))] == [second], "its place, taken"


def running_count(store):
    [(count,)] = store.rows(select(queues.c.running).where(queues.c.name == "narrow"))
    return count


def test_an_order_key_waits_for_its_snoozed_job(farm):
    """A snoozed job of an order key keeps its place: the next job of the key does not start before it has run."""
    store = farm._store
    me = register(store)
    spec = JobSpec(executor="python", target="bench.jobs:noop", order_key="customer-7")
    first, second = store.jobs.enqueue(spec, count=2)
    [claimed] = claim(store, me)
    assert claimed.id == first
    assert store.runs.finish_many(me, [snoozed(claimed, 0.5)]) == ["queued"]
    assert claim(store, me) == [], "the second waits behind the snoozed first"
    time.sleep(0.6)
    [again] = claim(store, me)
    assert again.id == first
    assert store.runs.finish(again, me, Outcome.SUCCEEDED) == "succeeded"
    assert [j.id for j in claim(store, me)] == [second]


def test_a_job_snoozes_at_most_max_snoozes_times_then_fails_spending_an_attempt(farm):
    store = farm._store
    me = register(store)
    [job_id] = store.jobs.enqueue(WORK)
    store.count(update(jobs).where(jobs.c.id == job_id).values(snoozes=MAX_SNOOZES - 1))
    [claimed] = claim(store, me)
    assert store.runs.finish_many(me, [snoozed(claimed, 0.0)]) == ["queued"]
    assert store.jobs.get(job_id)["snoozes"] == MAX_SNOOZES
    [claimed] = claim(store, me)
    assert claimed.attempts == 1
    assert store.runs.finish_many(me, [snoozed(claimed, 0.0)]) == ["queued"], "a failure with an attempt left"
    job = store.jobs.get(job_id)
    assert (job["attempts"], job["snoozes"]) == (1, MAX_SNOOZES), "an attempt spent, no snooze counted"
    assert job["last_error"] == f"snoozed {MAX_SNOOZES} times: {WHY}"
    [claimed] = claim(store, me)
    assert store.runs.finish_many(me, [snoozed(claimed, 0.0)]) == ["failed"], "its last attempt spent: failed"
    outcomes = [r["outcome"] for r in sorted(store.runs.read(job_id=job_id), key=lambda r: r["fence"])]
    assert outcomes == ["snoozed", "failed", "failed"]


def test_a_singleton_snoozes_and_comes_back(farm):
    store = farm._store
    me = register(store)
    [job_id] = store.jobs.enqueue(
        JobSpec(executor="python", target="bench.jobs:noop", kind="singleton", key="tick", max_attempts=1)
    )
    [claimed] = claim(store, me)
    assert store.runs.finish_many(me, [snoozed(claimed, 0.0)]) == ["queued"]
    assert (store.jobs.get(job_id)["snoozes"], [j.id for j in claim(store, me)]) == (1, [job_id])
