"""A cancel asked of a running job is kept whatever way its run goes back to the queue, on every backend: a
retryable failure (alone and in a batch), a release by its node, a lease taken back by `requeue_expired` or by a
claim. The job ends cancelled, never runs again, and its waiting children are cancelled with the reason."""

import time

import pytest

from queueprocessor.rules.job import Ending, JobSpec
from queueprocessor.store.types import ClaimRequest

WORK = JobSpec(executor="python", target="bench.jobs:noop", max_attempts=3)


def register(store, name="m"):
    return store.machines.register(
        name=name, host="h", instance=f"{name}-{time.monotonic_ns()}", pid=1, version="t", capacity=64
    )


def running_asked_to_stop(farm, *, lease=30.0, children=False):
    """A job claimed by a machine and asked to stop (with a child waiting for it, if `children`): (machine,
    claimed, child id or None)."""
    store = farm._store
    me = register(store)
    [job_id] = store.jobs.enqueue(WORK)
    child = (
        store.jobs.enqueue(JobSpec(executor="python", target="bench.jobs:noop", after=(job_id,)))[0]
        if children
        else None
    )
    [claimed] = store.jobs.claim(ClaimRequest(me, 64, lease))
    assert claimed.id == job_id
    assert farm.cancel(job_id) == "cancelling"
    return me, claimed, child


def assert_cancelled(farm, job_id, child):
    job = farm._store.jobs.get(job_id)
    assert (job["state"], job["last_error"]) == ("cancelled", "cancelled by an operator")
    if child is not None:
        kept = farm._store.jobs.get(child)
        assert (kept["state"], kept["last_error"]) == ("cancelled", f"parent {job_id} was cancelled")
    assert farm._store.jobs.claim(ClaimRequest(register(farm._store, "other"), 64, 30.0)) == [], "it never runs again"


@pytest.mark.parametrize("children", [False, True])
def test_a_retryable_failure_of_a_job_asked_to_stop_ends_it_cancelled(farm, children):
    me, claimed, child = running_asked_to_stop(farm, children=children)
    state = farm._store.runs.finish(claimed, me, "failed", error="flaky", retry_in=0.0)
    assert state == "cancelled"
    assert_cancelled(farm, claimed.id, child)
    [run] = farm._store.runs.read(job_id=claimed.id)
    assert (run["outcome"], run["error"]) == ("failed", "flaky"), "the run keeps how it ended"


def test_a_batch_of_endings_keeps_the_cancel_of_the_one_asked_to_stop(farm):
    """The batch finish (one statement on PostgreSQL) ends the one asked to stop cancelled, the other queued."""
    store = farm._store
    me = register(store)
    a, b = store.jobs.enqueue(WORK, count=2)
    claimed = {c.id: c for c in store.jobs.claim(ClaimRequest(me, 64, 30.0))}
    assert farm.cancel(a) == "cancelling"
    endings = [Ending(claimed[a], "failed", "flaky", 0.0), Ending(claimed[b], "failed", "flaky", 0.0)]
    assert store.runs.finish_many(me, endings) == ["cancelled", "queued"]
    assert store.jobs.get(a)["state"] == "cancelled"
    assert [c.id for c in store.jobs.claim(ClaimRequest(me, 64, 30.0))] == [b]


@pytest.mark.parametrize("children", [False, True])
def test_a_release_of_a_job_asked_to_stop_ends_it_cancelled(farm, children):
    me, claimed, child = running_asked_to_stop(farm, children=children)
    assert farm._store.runs.release(claimed, me, "handed back: the node is draining")
    assert_cancelled(farm, claimed.id, child)


@pytest.mark.parametrize("children", [False, True])
def test_an_expired_lease_taken_back_of_a_job_asked_to_stop_ends_it_cancelled(farm, children):
    me, claimed, child = running_asked_to_stop(farm, lease=0.05, children=children)
    time.sleep(0.1)
    assert farm._store.jobs.requeue_expired(before=farm._store.ask_time()) == 1
    assert_cancelled(farm, claimed.id, child)
    [run] = farm._store.runs.read(job_id=claimed.id)
    assert run["outcome"] == "lost"


@pytest.mark.parametrize(("children", "turn"), [(False, False), (True, False), (False, True), (True, True)])
def test_a_claim_never_starts_a_job_asked_to_stop_whose_lease_ran_out(farm, children, turn):
    """Its machine died before it could stop it: the next claim (alone, or a turn's: one statement on PostgreSQL)
    takes it over, but ends it cancelled instead of handing it on, with the attempt it counted given back."""
    me, claimed, child = running_asked_to_stop(farm, lease=0.05, children=children)
    time.sleep(0.1)
    other = register(farm._store, "b")
    if turn:
        taken = farm._store.jobs.take_turn_and_claim(1, ClaimRequest(other, 64, 30.0))
        assert taken.won and taken.claimed == []
    else:
        assert farm._store.jobs.claim(ClaimRequest(other, 64, 30.0)) == []
    assert_cancelled(farm, claimed.id, child)
    assert farm._store.jobs.get(claimed.id)["attempts"] == 1
