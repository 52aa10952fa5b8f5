"""The dashboard's read-only queries, on a real farm database (SQLite and PostgreSQL).

Rows are written through the Store the nodes use (register, take a turn, claim,
finish), so the views are checked against what a farm really writes.
"""

import gc
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import event

from queueprocessor import singletons
from queueprocessor.rules.errors import QPError
from queueprocessor.rules.job import JobSpec
from queueprocessor.rules.schedules import Recurrence
from queueprocessor.store.types import ClaimRequest
from queueprocessor.views import (
    Dashboard,
    FarmTiming,
    Query,
    judge_machines,
    read_schedules,
    upcoming_slots,
)

TIMING = FarmTiming(period=1.0, heartbeat=1.0, misses=3)


def _machine(store, name):
    return store.machines.register(name=name, host="h", instance=f"i-{name}", pid=1, version="t", capacity=4)


def _run(store, machine, target, outcome):
    store.jobs.enqueue(JobSpec(executor="http", target=target))
    [job] = store.jobs.claim(ClaimRequest(machine, 1, lease=30))
    store.runs.finish(job, machine, outcome, error=None if outcome == "succeeded" else "boom")
    return job


def test_turns_between_is_the_turn_log_inside_the_window(farm):
    store = farm._store
    a, b = _machine(store, "a"), _machine(store, "b")
    now = store.ask_time()
    base = int(now)
    for n, who in enumerate([a, b, a, b]):
        assert store.turns.take(base - 10 + n, who)
    assert not store.turns.take(base - 10, b)  # the slot is taken: the log keeps the first
    turns = store.views.turns_between(now - 60, store.ask_time())
    assert [(t["slot"], t["machine_id"]) for t in turns] == [
        (base - 10, a),
        (base - 9, b),
        (base - 8, a),
        (base - 7, b),
    ]
    assert store.views.turns_between(now - 60, now - 30) == []


def test_runs_between_holds_runs_overlapping_the_window_with_their_target(farm):
    store = farm._store
    a = _machine(store, "a")
    before = store.ask_time()
    done = _run(store, a, "/ok", "succeeded")
    store.jobs.enqueue(JobSpec(executor="http", target="/still"))
    [running] = store.jobs.claim(ClaimRequest(a, 1, lease=30))
    after = store.ask_time()
    runs = store.views.runs_between(before, after)
    assert {(r["job_id"], r["outcome"], r["target"]) for r in runs} == {
        (done.id, "succeeded", "/ok"),
        (running.id, "running", "/still"),
    }
    # A window after the finished run ended still shows the run that is going on.
    later = store.views.runs_between(after + 100, after + 200)
    assert [(r["job_id"], r["outcome"]) for r in later] == [(running.id, "running")]


def test_throughput_counts_finished_runs_per_bucket_and_machine(farm):
    store = farm._store
    a, b = _machine(store, "a"), _machine(store, "b")
    start = store.ask_time()
    for outcome in ("succeeded", "succeeded", "failed"):
        _run(store, a, "/x", outcome)
    _run(store, b, "/y", "succeeded")
    end = store.ask_time()
    rows = store.views.throughput(start - 1, end + 1, bucket=5.0)
    totals = {}
    for row in rows:
        assert row["start"] % 5.0 == 0
        assert start - 5 <= row["start"] <= end
        totals[row["outcome"]] = totals.get(row["outcome"], 0) + row["count"]
    assert totals == {"succeeded": 3, "failed": 1}
    assert store.views.machine_throughput(start - 1, end + 1) == {a: {"succeeded": 2, "failed": 1}, b: {"succeeded": 1}}


def test_judged_machines_mark_the_leader_the_dead_and_the_unsynchronised():
    now = 1000.5
    rows = [
        dict(id=1, name="a", state="active", last_seen=now - 0.5, joined_at=now - 100, error_bound=0.001),
        dict(id=2, name="b", state="active", last_seen=now - 0.2, joined_at=now - 100, error_bound=0.4),
        dict(id=3, name="c", state="active", last_seen=now - 10, joined_at=now - 100, error_bound=0.001),
        dict(id=4, name="d", state="stopped", last_seen=now - 5000, joined_at=now - 9000, error_bound=None),
    ]
    judged = {m["name"]: m for m in judge_machines(rows, now, TIMING)}
    assert set(judged) == {"a", "b", "c"}  # d stopped long ago
    assert judged["c"]["status"] == "dead"
    # Roster [1, 2]: slot 1000 belongs to id 1.
    assert [m["name"] for m in judged.values() if m["leader"]] == ["a"]
    assert judged["a"]["synced"] and not judged["b"]["synced"]
    assert upcoming_slots(rows, now, TIMING, horizon=2.0) == [(1000, 1), (1001, 2), (1002, 1)]
    assert "d" in {m["name"] for m in judge_machines(rows, now, TIMING, keep_gone=1e9)}


def test_dashboard_reads_everything_one_poll_needs(farm):
    span = 30.0
    store = farm._store
    a = _machine(store, "a")
    job = _run(store, a, "/ok", "succeeded")
    store.turns.take(int(store.ask_time()), a)
    dashboard = Dashboard(store, FarmTiming.of(farm.settings()))
    snap = dashboard.read(Query(span=span, job_id=job.id))
    assert snap["until"] - snap["since"] == pytest.approx(span)
    assert [m["name"] for m in snap["machines"]] == ["a"]
    assert snap["names"] == {a: "a"}
    assert len(snap["turns"]) == 1 and len(snap["runs"]) == 1
    assert snap["job_counts"]["succeeded"] == 1
    assert snap["job"]["id"] == job.id and [r["outcome"] for r in snap["job"]["runs"]] == ["succeeded"]
    assert [j["id"] for j in snap["jobs"]] == [job.id]
    assert dashboard.read(Query(job_id=10**9))["job"] is None


def test_find_jobs_matches_id_target_machine_and_error_with_like_characters_taken_literally(farm):
    store = farm._store
    render = _machine(store, "Render-7")
    percent = _run(store, render, "/rate/100%done", "succeeded")
    failed = _run(store, _machine(store, "idle"), "/plain", "failed")  # its error is "boom"
    [underscore] = store.jobs.enqueue(JobSpec(executor="http", target="/a_b"))
    [lookalike] = store.jobs.enqueue(JobSpec(executor="http", target="/axb"))
    [other] = store.jobs.enqueue(JobSpec(executor="http", target="/other"))

    def found(text, state=None):
        return [job["id"] for job in store.views.find_jobs(text, state)]

    assert found("%DONE") == [percent.id]  # % is a character, not "anything"; case is ignored
    assert found("a_b") == [underscore]  # _ is a character, not "any one character"
    assert found("render-") == [percent.id]  # the name of the machine that ran it
    assert found("BOOM") == [failed.id]
    assert found(str(lookalike)) == [lookalike]
    assert found("/", state="queued") == [other, lookalike, underscore]  # newest first
    assert found("%") == [percent.id] and found("_") == [underscore]
    assert found("'; drop table qp_jobs; --") == []
    assert len(found("/")) == 5
    with pytest.raises(QPError, match="unknown job state"):
        store.views.find_jobs("x", "nosuchstate")


def test_a_slow_text_search_is_repeated_at_most_a_tenth_of_the_time(farm):
    store = farm._store
    [first] = store.jobs.enqueue(JobSpec(executor="http", target="/reports/daily"))
    # The clock the dashboard paces searches by: this search takes 1 s, so it is not repeated for 10 s.
    readings = iter([0.0, 1.0, 5.0, 11.0, 11.0, 12.0, 12.0])
    dashboard = Dashboard(store, FarmTiming.of(farm.settings()), clock=lambda: next(readings))
    search = Query(jobs_text="reports")

    assert [j["id"] for j in dashboard.read(search)["jobs"]] == [first]
    [second] = store.jobs.enqueue(JobSpec(executor="http", target="/reports/weekly"))
    assert [j["id"] for j in dashboard.read(search)["jobs"]] == [first]  # 5 s later: the last result
    assert [j["id"] for j in dashboard.read(search)["jobs"]] == [second, first]  # 11 s later: searched again
    assert [j["id"] for j in dashboard.read(Query(jobs_text="weekly"))["jobs"]] == [second]  # new text: at once
    assert [j["id"] for j in dashboard.read(Query())["jobs"]] == [second, first]  # no text: the newest jobs


def test_dashboard_rows_are_not_tracked_by_the_garbage_collector(farm):
    """A dashboard holds 10,000 run rows per poll: tracked rows would make Python's full collections (pauses
    with the interpreter lock held, the window frozen) run every few polls."""
    store = farm._store
    a = _machine(store, "a")
    _run(store, a, "/ok", "failed")
    store.turns.take(int(store.ask_time()), a)
    now = store.ask_time()
    rows = store.views.runs_between(0, now + 1) + store.views.turns_between(0, now + 1) + store.views.find_jobs("ok")
    assert len(rows) == 3
    assert [row for row in rows if gc.is_tracked(row)] == []


def _utc(*fields) -> float:
    return datetime(*fields, tzinfo=UTC).timestamp()


def test_the_last_occurrence_before_a_time_is_the_one_the_schedule_made():
    every = Recurrence(every=0.1)
    made = [every.after(0.0)]  # occurrences as a turn makes them, one after the other
    while len(made) < 100:
        made.append(every.after(made[-1]))
    assert [every.before(t) for t in made[1:]] == made[:-1]  # the very floats, so the same job keys
    assert every.before(made[5] + 0.05) == made[5]
    # Clocks going back in Paris on 2026-10-25: 02:30 happens twice, at 00:30 and 01:30 UTC; it runs once.
    nightly = Recurrence(cron="30 2 * * *", tz="Europe/Paris")
    assert nightly.before(_utc(2026, 10, 25, 1, 45)) == _utc(2026, 10, 25, 0, 30)
    assert nightly.before(_utc(2026, 10, 25, 0, 30)) == _utc(2026, 10, 24, 0, 30)
    hourly = Recurrence(cron="30 * * * *", tz="Europe/Paris")  # an hourly cadence continues in real time
    assert hourly.before(_utc(2026, 10, 25, 1, 45)) == _utc(2026, 10, 25, 1, 30)


def _statements(farm, table):
    """The statements sent from now on that read `table`."""
    seen = []
    event.listen(
        farm._engine, "before_cursor_execute", lambda *args: seen.append(args[2]) if table in args[2] else None
    )
    return seen


def test_schedules_carry_their_next_occurrence_and_their_last_ones_job(farm):
    store = farm._store
    machine = _machine(store, "runner")
    seen = _statements(farm, "qp_jobs")
    assert read_schedules(store, store.ask_time()) == []
    assert seen == []  # a farm without schedules reads no jobs for them

    farm.schedule("tick", farm.python_spec("tests.support.pyjobs:noop"), every=0.1)
    farm.schedule(
        "hourly", farm.command_spec(["sh", "-c", "true"]), cron="0 * * * *", tz="Europe/Paris", misfire="skip", grace=60
    )
    farm.schedule("later", farm.python_spec("tests.support.pyjobs:noop"), every=3600)
    farm.pause_schedule("later")
    time.sleep(2 * farm.settings()["period"] + 0.15)  # the first tick is due (two periods after its schedule was added)
    [job] = store.jobs.claim(ClaimRequest(machine, 1, lease=30))
    store.runs.finish(job, machine, "succeeded")
    done = store.jobs.get(job.id)
    assert done["key"].startswith("tick@")

    seen.clear()
    at = done["run_at"] + 0.05
    rows = {row["name"]: row for row in read_schedules(store, at)}
    assert len(seen) == 1  # the last occurrences' jobs, by key
    assert list(rows) == ["hourly", "later", "tick"]  # by name
    tick = rows["tick"]
    assert tick["recurrence"] == "every 0.1 s" and tick["executor"] == "python" and not tick["paused"]
    assert tick["next_at"] == Recurrence(every=0.1).after(at)
    assert (tick["last_at"], tick["last_job"], tick["last_state"], tick["last_machine"], tick["last_finished"]) == (
        done["run_at"],
        done["id"],
        "succeeded",
        machine,
        done["finished_at"],
    )
    hourly = rows["hourly"]
    assert hourly["recurrence"] == "cron '0 * * * *' Europe/Paris"
    assert (hourly["misfire"], hourly["grace"]) == ("skip", 60.0)
    assert hourly["next_at"] == Recurrence(cron="0 * * * *", tz="Europe/Paris").after(at)
    assert hourly["last_at"] is None and hourly["last_state"] is None  # made before its first occurrence
    later = rows["later"]
    assert later["paused"] and later["next_at"] is None

    # Paused, the tick's next occurrence (made into a job in advance) is cancelled, and shows so once due.
    farm.pause_schedule("tick")
    after = Recurrence(every=0.1).after(at)
    tick = read_schedules(store, after + 0.01)[2]
    assert tick["next_at"] is None and tick["last_at"] == after and tick["last_state"] == "cancelled"


def test_a_snapshot_carries_the_schedules_and_the_singletons(farm):
    store = farm._store
    farm.schedule("tick", farm.python_spec("tests.support.pyjobs:noop"), every=60)
    job_id = farm.singleton("feed", farm.python_spec("tests.support.pyjobs:wait_for_cancel"))
    machine = _machine(store, "holder")
    assert job_id in [job.id for job in store.jobs.claim(ClaimRequest(machine, 5, lease=30))]
    snap = Dashboard(store, FarmTiming.of(farm.settings())).read(Query())
    assert [(s["name"], s["recurrence"]) for s in snap["schedules"]] == [("tick", "every 60 s")]
    [feed] = snap["singletons"]
    assert (feed["name"], feed["target"], feed["state"], feed["owner"]) == (
        "feed",
        "tests.support.pyjobs:wait_for_cancel",
        "running",
        machine,
    )
    assert feed["started_at"] == store.jobs.get(job_id)["started_at"]
    assert snap["names"][machine] == "holder"
    singletons.remove(store, "feed")
    assert Dashboard(store, FarmTiming.of(farm.settings())).read(Query())["singletons"][0]["cancel_requested"]
