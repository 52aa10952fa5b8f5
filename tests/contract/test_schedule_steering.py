"""An operator steers a schedule: run it now (once per request, however many machines send it), edit it (each
field checked as `schedule add` checks it; a new recurrence starts from now without a burst, a paused schedule
stays paused) and read its last runs with their outcome and lateness. On every backend."""

import threading

import pytest
from sqlalchemy import update

from queueprocessor.farm import Farm
from queueprocessor.rules.errors import InvalidJob, NotFound, QPError
from queueprocessor.rules.schedules import Recurrence, made_by, settling
from queueprocessor.store.schema import jobs, schedules
from tests.support import pyjobs
from tests.support.work import FAST, Nodes, wait_for

EARLY = 0.05  # a node's idea of database time may be off by its error bound, a few milliseconds


def schedule_jobs(farm: Farm, name: str) -> list[dict]:
    return [j for j in farm._store.jobs.newest(limit=1000) if (j["key"] or "").startswith(f"{name}@")]


@pytest.fixture
def hourly(farm):
    """A schedule whose next occurrence is an hour away at most, with none waiting within the next periods."""
    farm.settings(**FAST)
    farm.schedule("hourly", farm.python_spec(pyjobs.noop), cron="0 * * * *")
    return farm.get_schedule("hourly")


def test_run_now_sent_by_two_machines_at_once_makes_one_job(farm, db_url, hourly):
    other = Farm(db_url)
    barrier = threading.Barrier(4)
    ids: list[int] = []

    def run_now(on: Farm) -> None:
        barrier.wait()
        ids.append(on.run_schedule("hourly", request="click-1"))

    try:
        threads = [threading.Thread(target=run_now, args=(on,)) for on in (farm, other, farm, other)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        other.close()
    made = schedule_jobs(farm, "hourly")
    assert len(made) == 1 and set(ids) == {made[0]["id"]}
    job = farm.job(ids[0])
    assert job["key"] == "hourly@run now click-1" and made_by(job) == "hourly (run now)"
    assert job["state"] == "queued" and job["run_at"] <= farm._store.ask_time()  # due now
    assert farm.get_schedule("hourly")["next_run"] == hourly["next_run"]  # the regular occurrences go on as before


def test_each_run_now_request_is_one_more_job(farm, hourly):
    first, second = farm.run_schedule("hourly"), farm.run_schedule("hourly")
    assert first != second and len(schedule_jobs(farm, "hourly")) == 2
    assert farm.run_schedule("hourly", request="again") == farm.run_schedule("hourly", request="again")


def test_run_now_of_a_paused_schedule_runs_and_keeps_it_paused(farm, hourly):
    farm.pause_schedule("hourly")
    farm.run_schedule("hourly")
    assert farm.get_schedule("hourly")["paused"] and len(schedule_jobs(farm, "hourly")) == 1


def test_run_now_of_an_unknown_schedule_or_with_a_bad_request_is_one_line(farm, hourly):
    with pytest.raises(NotFound, match="^no schedule named 'nope'$"):
        farm.run_schedule("nope")
    with pytest.raises(InvalidJob, match="^request must be 1-64 printable characters"):
        farm.run_schedule("hourly", request=" x")


@pytest.mark.parametrize(
    "change, expected",
    [
        (dict(cron="30 2 * * *"), dict(cron="30 2 * * *", tz="UTC", every=None)),
        (dict(tz="Europe/Berlin"), dict(cron="0 * * * *", tz="Europe/Berlin", every=None)),
        (dict(cron="@daily", tz="Asia/Tokyo"), dict(cron="0 0 * * *", tz="Asia/Tokyo", every=None)),
        (dict(every=90), dict(cron=None, tz=None, every=90.0)),
        (dict(misfire="all"), dict(misfire="all", grace=3600.0)),
        (dict(grace=5), dict(misfire="once", grace=5.0)),
        (dict(payload='{"day": 1}'), dict(payload='{"day":1}')),
        (dict(payload=None), dict(payload=None)),
        (dict(queue="reports"), dict(queue="reports")),
        (dict(target="tests.support.pyjobs:echo"), dict(executor="python", target="tests.support.pyjobs:echo")),
        (
            dict(executor="command", target=["sh", "-c", "true"]),
            dict(executor="command", target='["sh", "-c", "true"]'),
        ),
        (dict(executor="http", target="/ok", method="post"), dict(executor="http", target="/ok", method="POST")),
    ],
)
def test_an_edit_changes_the_fields_given_and_no_other(farm, hourly, change, expected):
    edited = farm.edit_schedule("hourly", **change)
    assert {key: edited[key] for key in expected} == expected
    unchanged = {key: value for key, value in hourly.items() if key not in expected and key != "next_run"}
    assert {key: edited[key] for key in unchanged} == unchanged


def test_a_method_goes_with_http_work_through_an_edit(farm, hourly):
    """Work turned from HTTP POST to another kind drops the method without being told to; one stored before other
    work refused a method (POST on a Python schedule) still takes an edit, and loses it."""
    farm.edit_schedule("hourly", executor="http", target="/ok", method="POST")
    assert farm.edit_schedule("hourly", executor="python", target="tests.support.pyjobs:noop")["method"] == "GET"
    farm._store.count(update(schedules).where(schedules.c.name == "hourly").values(method="POST"))
    edited = farm.edit_schedule("hourly", payload='{"day": 2}')
    assert (edited["executor"], edited["method"], edited["payload"]) == ("python", "GET", '{"day":2}')
    with pytest.raises(QPError, match="^method is for http work only: python work takes none$"):
        farm.edit_schedule("hourly", method="POST")


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(cron="61 * * * *"), "malformed cron expression '61 * * * *'"),
        (dict(tz="Mars/Olympus"), "unknown time zone 'Mars/Olympus'"),
        (dict(cron="0 0 30 2 *"), "cron expression '0 0 30 2 *' never matches a real date"),
        (dict(cron="* * * * *", every=5), "give a schedule either cron EXPRESSION or every SECONDS"),
        (dict(every=0.01), "every must be at least 0.1 seconds (got 0.01)"),
        (dict(every=1e12), "every must be at most 315576000 seconds, ten years (got 1e+12)"),
        (dict(every=60, tz="UTC"), "tz only applies to cron schedules"),
        (dict(misfire="sometimes"), "unknown misfire policy 'sometimes': use one of skip, once, all"),
        (dict(grace=-1), "grace must be a non-negative number of seconds (got -1)"),
        (dict(executor="http"), "give target with executor: what a target means depends on its executor"),
        (dict(executor="ftp", target="/x"), "unknown executor 'ftp'"),
        (dict(target="no-colon"), "Python job target 'no-colon' is not of the form"),
        (dict(payload="{oops"), "payload is not valid JSON"),
        (dict(queue="bad name!"), "queue 'bad name!' is not a queue name"),
    ],
)
def test_a_bad_edit_is_refused_with_its_reason_and_changes_nothing(farm, hourly, change, message):
    with pytest.raises(QPError) as refused:
        farm.edit_schedule("hourly", **change)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert farm.get_schedule("hourly") == hourly


def test_a_new_recurrence_starts_from_now_without_a_burst_of_what_it_missed(farm):
    farm.settings(**FAST)
    farm.schedule("beat", farm.python_spec(pyjobs.noop), every=3600, misfire="all")
    now = farm._store.ask_time()
    old_waiting = farm.run_schedule("beat")  # a run-now waiting is not the old recurrence's: it stays
    farm._store.count(update(schedules).values(next_run=now - 600))  # as if the farm had been down ten minutes
    farm.edit_schedule("beat", every=0.2)
    later = farm._store.ask_time()
    made = [j for j in schedule_jobs(farm, "beat") if j["id"] != old_waiting]
    first = min(j["run_at"] for j in made)  # none of the 1,200 it "missed": its first after the settling time
    assert now + settling(FAST["period"]) < first <= later + settling(FAST["period"]) + 0.2
    assert farm.job(old_waiting)["state"] == "queued"


def _on(recurrence: Recurrence, at: float) -> bool:
    return abs(recurrence.after(at - 0.001) - at) < 1e-4


def test_a_new_recurrence_cancels_the_occurrences_the_old_one_left_waiting(farm):
    farm.settings(**FAST)
    farm.schedule("soon", farm.python_spec(pyjobs.noop), every=0.2)
    waiting = [j for j in schedule_jobs(farm, "soon") if j["state"] == "queued"]
    assert waiting
    # A new interval that the first waiting occurrence is not on (one that is stays: see below), so there is one
    # the edit must cancel.
    every = next(r for r in map(lambda e: Recurrence(every=e), (0.3, 0.7, 1.1)) if not _on(r, waiting[0]["run_at"]))
    farm.edit_schedule("soon", every=every.every)
    ended = [farm.job(j["id"]) for j in waiting]

    def recurs(job: dict) -> bool:  # an occurrence of the new recurrence, by its key
        return job["key"] == f"soon@{every.label(every.after(job['run_at'] - 0.001))}"

    assert all(j["state"] == "queued" for j in ended if recurs(j))  # in both: its key would block the new job
    others = [j for j in ended if not recurs(j)]
    assert others and all(j["state"] == "cancelled" and "was edited" in j["last_error"] for j in others)
    fresh = [j for j in schedule_jobs(farm, "soon") if j["state"] == "queued"]
    assert all(recurs(j) for j in fresh)  # (the new one's first may be too far ahead to be made yet)


def test_a_retry_waiting_for_its_next_attempt_is_not_cancelled_by_a_new_recurrence(farm):
    farm.settings(**FAST)
    farm.schedule("soon", farm.python_spec(pyjobs.noop), every=0.2)
    [retry, *_] = [j for j in schedule_jobs(farm, "soon") if j["state"] == "queued"]
    farm._store.count(update(jobs).where(jobs.c.id == retry["id"]).values(attempts=1))  # as after a failed attempt
    farm.edit_schedule("soon", every=0.7)
    assert farm.job(retry["id"])["state"] == "queued"


def test_new_work_is_written_into_the_occurrences_still_waiting(farm):
    farm.settings(**FAST)
    farm.schedule("soon", farm.python_spec(pyjobs.noop), every=0.2)
    farm.edit_schedule("soon", payload='{"v": 2}', queue="reports", target="tests.support.pyjobs:echo")
    waiting = [j for j in schedule_jobs(farm, "soon") if j["state"] == "queued"]
    assert waiting and {(j["payload"], j["queue"], j["target"]) for j in waiting} == {
        ('{"v":2}', "reports", "tests.support.pyjobs:echo")
    }


def test_a_paused_schedule_stays_paused_through_an_edit(farm, hourly):
    farm.pause_schedule("hourly")
    edited = farm.edit_schedule("hourly", every=0.2, payload='{"x": 1}')
    assert edited["paused"] and edited["every"] == 0.2
    assert schedule_jobs(farm, "hourly") == []  # no occurrence made while paused
    resumed = farm.resume_schedule("hourly")
    assert not resumed["paused"] and resumed["next_run"] == Recurrence(every=0.2).after(resumed["next_run"] - 0.1)


def test_an_occurrence_planned_from_the_row_before_an_edit_is_not_made(farm, hourly):
    """A turn that read the schedule just before an edit must not make jobs of the old definition after it."""
    store = farm._store.schedules
    before = farm.get_schedule("hourly")
    farm.edit_schedule("hourly", payload='{"new": true}')
    assert not store._advance(before, Recurrence.of(before), [before["next_run"]], before["next_run"] + 3600)
    assert schedule_jobs(farm, "hourly") == []


def test_an_edit_of_an_unknown_schedule_is_not_found(farm):
    with pytest.raises(NotFound, match="^no schedule named 'ghost'$"):
        farm.edit_schedule("ghost", every=5)


def test_last_runs_show_outcome_lateness_and_which_were_run_now(farm):
    farm.settings(**FAST)
    nodes = Nodes(farm)
    try:
        nodes("a")
        farm.schedule("tick", farm.python_spec(pyjobs.noop), every=0.3)
        manual = farm.run_schedule("tick", request="r1")
        wait_for(lambda: sum(not r["manual"] and r["outcome"] == "succeeded" for r in farm.schedule_runs("tick")) >= 3)
        wait_for(lambda: farm.job(manual)["state"] == "succeeded")
        farm.pause_schedule("tick")
    finally:
        nodes.stop_all()
    runs = farm.schedule_runs("tick", limit=50)
    [asked] = [r for r in runs if r["manual"]]
    assert asked["job"] == manual and asked["key"] == "tick@run now r1" and asked["machine_name"] == "a"
    regular = [r for r in runs if not r["manual"] and r["outcome"] == "succeeded"]
    assert all(abs(r["due"] - farm.job(r["job"])["run_at"]) < 0.001 for r in regular)  # the occurrence's time
    assert all(-EARLY <= r["late"] < 1.0 and r["late"] == r["started_at"] - r["due"] for r in regular + [asked])
    assert [r["job"] for r in runs] == sorted((r["job"] for r in runs), reverse=True)  # newest first
    assert len(farm.schedule_runs("tick", limit=2)) == 2
    with pytest.raises(NotFound):
        farm.schedule_runs("ghost")


def test_an_occurrence_that_never_ran_shows_how_it_ended(farm, hourly):
    farm.settings(**FAST)
    farm.schedule("soon", farm.python_spec(pyjobs.noop), every=0.2)
    farm.pause_schedule("soon")  # cancels its waiting occurrences
    runs = farm.schedule_runs("soon")
    assert runs and all(r["outcome"] == "cancelled" and r["late"] is None and r["started_at"] is None for r in runs)
    assert all("was removed or paused" in r["error"] for r in runs)
