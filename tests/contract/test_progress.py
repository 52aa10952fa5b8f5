"""A running job's progress (context.progress) over every backend: written with the lease renewal, under the run's
fence, and kept with the run when it ends."""

import time

import pytest

from queueprocessor.rules.job import JobSpec
from queueprocessor.rules.limits import PROGRESS_NOTE
from queueprocessor.rules.states import Outcome
from queueprocessor.store.types import ClaimRequest, Progress

HTTP = JobSpec(executor="http", target="/ok")


def register(store, name):
    return store.machines.register(
        name=name, host="h", instance=f"{name}-{time.monotonic_ns()}", pid=1, version="t", capacity=4
    )


def progress_of(store, job_id):
    job = store.jobs.get(job_id)
    return job["progress"], job["progress_message"]


def test_progress_is_written_with_the_renewal_and_kept_with_the_run(farm):
    store = farm._store
    me = register(store, "a")
    store.jobs.enqueue(HTTP, count=3)
    one, two, quiet = store.jobs.claim(ClaimRequest(me, 3, lease=30))
    said = {(one.id, one.fence): Progress(0.25, "row 250 of 1000"), (two.id, two.fence): Progress(0.5, None)}
    held = [(j.id, j.fence) for j in (one, two, quiet)]
    assert store.runs.renew(me, held, 30, said) == {key: False for key in held}
    assert progress_of(store, one.id) == (0.25, "row 250 of 1000")
    assert progress_of(store, two.id) == (0.5, None)
    assert progress_of(store, quiet.id) == (None, None)
    # A renewal without news leaves what was said; the run in progress shows it in the history.
    store.runs.renew(me, held, 30, {(one.id, one.fence): Progress(0.75, "row 750 of 1000")})
    assert progress_of(store, two.id) == (0.5, None)
    [running] = store.runs.read(job_id=one.id)
    assert (running["outcome"], running["progress"], running["progress_message"]) == (
        "running",
        0.75,
        "row 750 of 1000",
    )
    store.runs.finish(one, me, Outcome.SUCCEEDED)
    [ended] = store.runs.read(job_id=one.id)
    assert (ended["outcome"], ended["progress"], ended["progress_message"]) == ("succeeded", 0.75, "row 750 of 1000")


def test_a_run_that_lost_its_lease_writes_no_progress(farm):
    """The old owner's report reaches the database after another machine took the job: it matches nothing, and the
    new run starts with no progress of the old one's."""
    store = farm._store
    a, b = register(store, "a"), register(store, "b")
    store.jobs.enqueue(HTTP)
    [old] = store.jobs.claim(ClaimRequest(a, 1, lease=0.05))
    store.runs.renew(a, [(old.id, old.fence)], 0.05, {(old.id, old.fence): Progress(0.4, "old run")})
    assert progress_of(store, old.id) == (0.4, "old run")
    time.sleep(0.1)
    [new] = store.jobs.claim(ClaimRequest(b, 1, lease=30))
    assert (new.id, new.fence) == (old.id, old.fence + 1)
    assert progress_of(store, new.id) == (None, None)  # a claim starts a run that has said nothing yet
    late = {(old.id, old.fence): Progress(0.9, "old run, late")}
    assert store.runs.renew(a, [(old.id, old.fence)], 30, late) == {}
    assert progress_of(store, new.id) == (None, None)
    assert store.runs.renew(b, [(new.id, new.fence)], 30, {(new.id, new.fence): Progress(0.1, "new")})
    # Nor does the old owner's fence reach the new run under another machine's name: the same job, our own fence.
    assert store.runs.renew(a, [(new.id, new.fence)], 30, {(new.id, new.fence): Progress(1.0, "not ours")}) == {}
    assert progress_of(store, new.id) == (0.1, "new")


@pytest.mark.parametrize("fraction", [-0.1, 1.5, float("nan"), "half", True])
def test_a_fraction_outside_0_to_1_is_refused_where_the_job_reports_it(fraction):
    with pytest.raises(ValueError, match="progress must be a number from 0 to 1"):
        Progress.of(fraction, None)


def test_a_long_message_is_cut_to_what_the_column_keeps():
    assert Progress.of(1, "x" * 1000) == Progress(1.0, "x" * PROGRESS_NOTE)
