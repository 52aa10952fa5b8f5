"""A batch whose every run succeeded is finished by the finish's cheaper form on PostgreSQL (sql.runs.successes: three
arrays, no run rows): it keeps every guard of the general form, on every backend."""

import time

from queueprocessor.rules.job import Ending, JobSpec
from queueprocessor.rules.states import Outcome
from queueprocessor.store.types import ClaimRequest

HTTP = JobSpec(executor="http", target="/ok")


def register(store, name):
    return store.machines.register(
        name=name, host="h", instance=f"{name}-{time.monotonic_ns()}", pid=1, version="t", capacity=8
    )


def test_a_batch_of_successes_writes_only_the_runs_still_ours_each_with_its_output(farm):
    """Of a batch of successes, a run whose job was taken over (its lease ran out, a peer claimed it under a newer
    fence) writes nothing and is answered None; the others end succeeded with their own outputs, a cancel asked
    meanwhile included (a cancel stops a run; it does not undo its end), and no run rows are made for them."""
    store = farm._store
    a, b = register(store, "a"), register(store, "b")
    store.jobs.enqueue(HTTP, count=4)
    [late] = store.jobs.claim(ClaimRequest(a, 1, lease=0.05))
    claimed = [late, *store.jobs.claim(ClaimRequest(a, 3, lease=30))]
    time.sleep(0.1)
    [taken] = store.jobs.claim(ClaimRequest(b, 1, lease=30))  # its lease ran out: a peer's now
    assert (taken.id, taken.fence) == (late.id, late.fence + 1)
    assert store.jobs.cancel(claimed[1].id) == "cancelling"  # asked while it runs
    endings = [Ending(job, Outcome.SUCCEEDED, output=f'"{job.id}"') for job in claimed]
    assert store.runs.finish_many(a, endings) == [None, "succeeded", "succeeded", "succeeded"]
    assert store.jobs.get(late.id)["state"] == "running"  # still the peer's, untouched by the stale write
    for job in claimed[1:]:
        row = store.jobs.get(job.id)
        assert (row["state"], row["output"]) == ("succeeded", f'"{job.id}"')
    assert store.runs.read(job_id=claimed[2].id)[0]["outcome"] == "succeeded"
