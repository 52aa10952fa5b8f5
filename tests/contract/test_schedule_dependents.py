"""A job that runs after a schedule's occurrence is not left waiting for ever when the schedule cancels that
occurrence (a pause, a removal, a missed occurrence dropped, an edit of its recurrence): it is cancelled with it,
with the reason, as after an operator's cancel. On every backend."""

import pytest
from sqlalchemy import update

from queueprocessor.rules.schedules import Recurrence
from queueprocessor.store.schema import jobs
from tests.support import pyjobs
from tests.support.work import FAST


def occurrence_with_child(farm, name, **recurrence):
    """A schedule's first waiting occurrence (a run-now if none is made yet) and a job enqueued to run after it:
    (occurrence, child)."""
    farm.settings(**FAST)
    farm.schedule(name, farm.python_spec(pyjobs.noop), **recurrence)
    if recurrence.get("every", 0) > 60:
        farm.run_schedule(name)
    waiting = sorted(
        (j for j in farm._store.jobs.newest() if j["state"] == "queued" and (j["key"] or "").startswith(f"{name}@")),
        key=lambda j: j["run_at"],
    )
    assert waiting, "occurrences within the horizon are made into jobs when the schedule is added"
    occurrence = waiting[0]
    [child] = farm.enqueue_python(pyjobs.noop, after=[occurrence["id"]])
    assert farm.job(child)["state"] == "waiting"
    return occurrence, child


def assert_cancelled_with(farm, occurrence, child):
    assert farm.job(occurrence["id"])["state"] == "cancelled"
    job = farm.job(child)
    assert (job["state"], job["last_error"]) == ("cancelled", f"parent {occurrence['id']} was cancelled")


@pytest.mark.parametrize("how", ["pause", "remove"])
def test_a_paused_or_removed_schedules_occurrence_cancels_the_jobs_after_it(farm, how):
    occurrence, child = occurrence_with_child(farm, "soon", every=0.2)
    (farm.pause_schedule if how == "pause" else farm.remove_schedule)("soon")
    assert_cancelled_with(farm, occurrence, child)


def test_a_missed_occurrence_dropped_cancels_the_jobs_after_it(farm):
    occurrence, child = occurrence_with_child(farm, "late", every=3600, misfire="skip", grace=1)
    farm._store.count(update(jobs).where(jobs.c.id == occurrence["id"]).values(run_at=occurrence["run_at"] - 7200))
    assert farm._store.schedules.drop_missed() == 1
    assert_cancelled_with(farm, occurrence, child)


def test_an_occurrence_a_new_recurrence_cancels_cancels_the_jobs_after_it(farm):
    occurrence, child = occurrence_with_child(farm, "edited", every=0.2)
    due = occurrence["run_at"]
    every = next(e for e in (0.3, 0.7, 1.1) if abs(Recurrence(every=e).after(due - 0.001) - due) >= 1e-4)
    farm.edit_schedule("edited", every=every)
    assert_cancelled_with(farm, occurrence, child)
