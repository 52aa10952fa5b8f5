"""Recurring schedules: the calendar (cron with time zones across DST, intervals), misfires, and
each occurrence running once on a farm of several machines."""

import threading
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import insert, update

from queueprocessor.farm import Farm
from queueprocessor.rules.errors import InvalidJob
from queueprocessor.rules.schedules import Recurrence, plan
from queueprocessor.store.schema import schedules
from tests.support import pyjobs
from tests.support.httptarget import HttpTarget
from tests.support.work import FAST, NodeProcesses, Nodes, run_cli, wait_for

EARLY = 0.05  # a node's idea of database time may be off by its error bound, a few milliseconds

BERLIN = ZoneInfo("Europe/Berlin")


def occurrences(recurrence: Recurrence, start: datetime, n: int) -> list[str]:
    t, seen = start.timestamp(), []
    for _ in range(n):
        t = recurrence.after(t)
        seen.append(recurrence.label(t))
    return seen


def test_a_daily_time_in_the_hour_clocks_skip_runs_at_the_jump():
    daily = Recurrence.parse(cron="30 2 * * *", tz="Europe/Berlin")
    assert occurrences(daily, datetime(2026, 3, 28, 12, tzinfo=BERLIN), 2) == [
        "2026-03-29T03:00:00.000+02:00",
        "2026-03-30T02:30:00.000+02:00",
    ]


def test_a_daily_time_in_the_hour_clocks_repeat_runs_once():
    daily = Recurrence.parse(cron="30 2 * * *", tz="Europe/Berlin")
    assert occurrences(daily, datetime(2026, 10, 24, 12, tzinfo=BERLIN), 2) == [
        "2026-10-25T02:30:00.000+02:00",
        "2026-10-26T02:30:00.000+01:00",
    ]


def test_an_hourly_cadence_keeps_real_time_across_both_changes():
    hourly = Recurrence.parse(cron="0 * * * *", tz="Europe/Berlin")
    autumn = occurrences(hourly, datetime(2026, 10, 25, 0, 30, tzinfo=BERLIN), 4)
    assert autumn == [
        "2026-10-25T01:00:00.000+02:00",
        "2026-10-25T02:00:00.000+02:00",
        "2026-10-25T02:00:00.000+01:00",
        "2026-10-25T03:00:00.000+01:00",
    ]
    spring = occurrences(hourly, datetime(2026, 3, 29, 0, 30, tzinfo=BERLIN), 2)
    assert spring == ["2026-03-29T01:00:00.000+01:00", "2026-03-29T03:00:00.000+02:00"]


def test_an_interval_recurs_at_whole_multiples_so_every_machine_agrees():
    every = Recurrence.parse(every=0.5)
    assert every.after(1000.2) == 1000.5 and every.after(1000.5) == 1001.0
    assert every.label(1_800_000_000.5) == "2027-01-15T08:00:00.500+00:00"


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(cron="61 * * * *"), "malformed cron expression '61 * * * *'"),
        (dict(cron="* * *"), "malformed cron expression"),
        (dict(cron="0 0 30 2 *"), "never matches a real date"),
        (dict(cron="* * * * *", tz="Mars/Olympus"), "unknown time zone 'Mars/Olympus'"),
        (dict(cron="* * * * *", every=5), "either cron EXPRESSION or every SECONDS"),
        (dict(), "either cron EXPRESSION or every SECONDS"),
        (dict(every=0.01), "every must be at least 0.1 seconds"),
        (dict(every=5, tz="UTC"), "tz only applies to cron"),
    ],
)
def test_a_bad_recurrence_is_refused_with_its_reason(arguments, message):
    with pytest.raises(InvalidJob, match=message.replace("*", r"\*").replace("(", r"\(")):
        Recurrence.parse(**arguments)


@pytest.mark.parametrize(
    "misfire, grace, expected",
    [
        ("skip", 3600, [100.0, 101.0]),
        ("once", 3600, [99.0, 100.0, 101.0]),  # the newest missed occurrence, once
        ("all", 3600, [90.0, 91.0, 92.0, 93.0, 94.0, 95.0, 96.0, 97.0, 98.0, 99.0, 100.0, 101.0]),
        ("all", 4.5, [96.0, 97.0, 98.0, 99.0, 100.0, 101.0]),  # older than the grace: dropped whatever the policy
    ],
)
def test_occurrences_the_farm_missed_follow_the_misfire_policy(misfire, grace, expected):
    """The farm was down from 90 s to 100.2 s; one period (1 s) late still counts as on time."""
    todo = plan(Recurrence(every=1.0), 90.0, 100.2, ahead=1.0, period=1.0, misfire=misfire, grace=grace)
    assert todo.occurrences == expected and todo.next_run == 102.0


@pytest.fixture
def nodes(farm):
    pyjobs.SEEN.clear()
    started = Nodes(farm)
    yield started
    started.stop_all()


def test_each_occurrence_runs_once_on_a_farm_of_three(farm, nodes):
    machines = {nodes(name).id for name in "abc"}
    farm.schedule("tick", farm.python_spec(pyjobs.noop), every=0.5)
    time.sleep(4.0)
    farm.pause_schedule("tick")
    jobs = [j for j in farm._store.jobs.newest(limit=1000) if j["key"] and j["state"] != "cancelled"]
    wait_for(lambda: all(farm._store.jobs.get(j["id"])["state"] == "succeeded" for j in jobs))
    times = sorted(j["run_at"] for j in jobs)
    assert len(times) >= 6 and times == [times[0] + 0.5 * i for i in range(len(times))]  # none missing, none twice
    assert all(j["key"] == f"tick@{Recurrence(every=0.5).label(j['run_at'])}" for j in jobs)
    for j in jobs:
        [run] = farm._store.runs.read(job_id=j["id"])
        assert run["machine_id"] in machines and run["started_at"] >= j["run_at"] - EARLY  # not at its claim


def test_an_occurrence_claimed_early_starts_at_its_time_not_at_a_turn(farm):
    """Turns a second apart claim each occurrence up to a second early; its run starts at its time (database
    time), where a start at the next turn would be up to a period late and one at its claim up to a period early.
    Judged on the occurrences made into jobs more than a period ahead (all but those the schedule's creation made,
    which may come after the turn that would have claimed them)."""
    period = 1.0
    nodes = Nodes(farm, period=period, heartbeat=0.5)

    def made_ahead():
        return [
            j for j in farm._store.jobs.newest(state="succeeded") if j["key"] and j["run_at"] - j["created_at"] > period
        ]

    try:
        nodes("a"), nodes("b")
        wait_for(lambda: len({t["machine_id"] for t in farm._store.turns.read(0)}) == 2, timeout=10)  # turns go round
        farm.schedule("punctual", farm.python_spec(pyjobs.noop), every=0.7)
        made = wait_for(lambda: len(done := made_ahead()) >= 5 and done, timeout=20)
    finally:
        nodes.stop_all()
    for job in made:
        [run] = farm._store.runs.read(job_id=job["id"])
        assert -EARLY <= run["started_at"] - job["run_at"] < period / 2, (job["key"], run["started_at"] - job["run_at"])


@pytest.mark.postgres
def test_a_new_schedules_first_occurrences_start_at_their_time_on_every_node(pg_url, tmp_path):
    """As a user adds one (`schedule add tick --every 1 http /ok` on three node processes, PostgreSQL, the default
    1 s period), with an HTTP server's access log as the record: its first occurrences start at their time like
    every later one. Turns go round, so each is a fresh node's first HTTP job, whose client (0.15-0.3 s to import
    on a quiet 2-core machine, over a second at load average 10) must be loaded before it is due; and the first
    occurrence must be far enough away to be claimed ahead of its time at all, and for every node to load that
    client first, as it does when a heartbeat shows it a new schedule (rules.schedules.first_occurrence,
    node/warmup.py).
    Tolerance: a twentieth of a period, where a start at the next turn would be a period late (without the loading
    ahead it failed 3 times out of 3 at load average 12; with it, it passed 5 of 5)."""
    timing = dict(period=1.0, heartbeat=1.0)
    late = timing["period"] / 20
    farm = Farm(pg_url)
    farm.settings(**timing)
    processes = NodeProcesses(pg_url, tmp_path, timing=timing)
    try:
        with HttpTarget() as target:
            for name in "abc":
                processes(name, "--http-base", target.base_url)
            wait_for(lambda: len({t["machine_id"] for t in farm._store.turns.read(0)}) == 3, timeout=30)
            assert run_cli("--db", pg_url, "schedule", "add", "tick", "--every", "1", "http", "/ok") == 0
            wait_for(lambda: len({r["job"] for r in target.requests("/ok")}) >= 4, timeout=20)
            farm.pause_schedule("tick")
            first = {}  # job id -> its first request
            for record in target.requests("/ok"):
                first.setdefault(record["job"], record)
        due = {job: farm._store.jobs.get(job)["run_at"] for job in first}
    finally:
        processes.kill_all()
        farm.close()
    opening = sorted(first, key=due.__getitem__)[:3]
    starts = {job: first[job]["started"] - due[job] for job in opening}
    assert len({first[job]["machine"] for job in opening}) == 3, "each on a node that had run no HTTP job"
    assert all(-EARLY <= start <= late for start in starts.values()), {j: round(s * 1000, 1) for j, s in starts.items()}


def test_a_schedule_that_cannot_be_planned_is_paused_alone_and_the_rest_of_the_work_drains(farm, nodes, caplog):
    """Rows written by SQL (or by a machine whose croniter or tzdata accepted more) that this node cannot plan."""
    bad = {
        "bogus-cron": dict(cron="bogus", tz="UTC"),
        "mars": dict(cron="* * * * *", tz="Mars/Olympus"),
        "zero": dict(every=0.0),
        "negative": dict(every=-1.0),
        "neither": dict(),
    }
    now = farm._store.ask_time()
    for name, recurrence in bad.items():
        farm._store.count(
            insert(schedules).values(
                **{"cron": None, "tz": None, "every": None, **recurrence},
                name=name,
                executor="python",
                target=f"{pyjobs.__name__}:noop",
                method="GET",
                priority=0,
                max_attempts=1,
                misfire="once",
                grace=60.0,
                paused=False,
                next_run=now,
                created_at=now,
            )
        )
    farm.schedule("good", farm.python_spec(pyjobs.noop), every=0.5)
    queued = farm.enqueue_python(pyjobs.noop, count=3)
    nodes("a")
    wait_for(lambda: all(farm._store.jobs.get(j)["state"] == "succeeded" for j in queued))
    wait_for(lambda: any(j["key"].startswith("good@") for j in farm._store.jobs.newest(state="succeeded") if j["key"]))
    assert all(farm.get_schedule(name)["paused"] for name in bad)
    assert not farm.get_schedule("good")["paused"]
    reasons = {j["origin"]: j["last_error"] for j in farm._store.jobs.newest(state="failed")}
    assert set(reasons) == {f"schedule {name}" for name in bad}
    assert "malformed cron expression 'bogus'" in reasons["schedule bogus-cron"]
    assert "unknown time zone 'Mars/Olympus'" in reasons["schedule mars"]
    assert "every must be at least 0.1 seconds (got -1)" in reasons["schedule negative"]
    assert reasons["schedule zero"].startswith("schedule zero paused: it cannot be planned (")
    assert reasons["schedule zero"].endswith("then resume it")
    assert "database unreachable" not in caplog.text and "turn failed" not in caplog.text
    assert all(caplog.text.count(f"schedule {name} paused") == 1 for name in bad)  # said once
    with pytest.raises(InvalidJob, match="^every must be at least 0.1 seconds"):
        farm.resume_schedule("zero")  # still unusable: one clear line, not a traceback


@pytest.mark.parametrize("misfire, runs", [("skip", 0), ("once", 1)])
def test_occurrences_left_waiting_through_an_outage_follow_the_misfire_policy(farm, nodes, misfire, runs):
    """Made into jobs before the whole farm went down, they are claimed only after it is back, later than the
    schedule's grace: skip drops them all, once runs the newest of them."""
    first = nodes("a")
    farm.schedule("beat", farm.python_spec(pyjobs.noop), every=0.1, misfire=misfire, grace=0.5)
    wait_for(lambda: farm._store.jobs.counts()["succeeded"] >= 2)
    first.stop(drain=False)
    waiting = [j for j in farm._store.jobs.newest(state="queued") if j["key"]]
    assert len(waiting) >= 2, "a schedule's next occurrences are jobs a few periods ahead"
    newest = max(j["run_at"] for j in waiting)
    wait_for(lambda: farm._store.ask_time() > newest + 0.5 + 0.2, timeout=5)
    back = farm._store.ask_time()
    nodes("b")
    wait_for(lambda: any(j["run_at"] > back for j in farm._store.jobs.newest(state="succeeded")))  # beating again
    ended = [farm._store.jobs.get(j["id"]) for j in waiting]
    ran = [j for j in ended if j["state"] == "succeeded"]
    assert [j["run_at"] for j in ran] == [newest] * runs
    dropped = [j for j in ended if j["state"] == "cancelled"]
    assert len(dropped) == len(waiting) - runs
    reason = f"missed: more than 0.5 s late, beyond the schedule's grace (misfire policy {misfire})"
    assert all(j["last_error"] == reason for j in dropped)


def test_two_machines_materialising_at_once_make_each_occurrence_once(farm):
    farm.settings(**FAST)
    farm.schedule("race", farm.command_spec(["sh", "-c", "true"]), every=0.1)
    farm._store.count(update(schedules).values(next_run=farm._store.ask_time() - 5))  # as if the farm was down
    barrier = threading.Barrier(4)

    def materialise():
        barrier.wait()
        farm._store.schedules.materialise(ahead=1.0, period=0.2)  # as each node does, on its own

    threads = [threading.Thread(target=materialise) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    keys = [j["key"] for j in farm._store.jobs.newest(limit=1000)]
    assert len(keys) == len(set(keys)) >= 10


def test_pause_resume_and_remove(farm, capsys):
    farm.settings(**FAST)
    assert (
        run_cli("--db", farm.url, "schedule", "add", "poll", "--every", "60", "command", "--", "sh", "-c", "true") == 0
    )
    assert "schedule poll: every 60 s, next at" in capsys.readouterr().out
    assert run_cli("--db", farm.url, "schedule", "pause", "poll") == 0
    [row] = farm.list_schedules()
    assert row["paused"]
    assert run_cli("--db", farm.url, "schedule", "resume", "poll") == 0
    assert not farm.get_schedule("poll")["paused"]
    assert run_cli("--db", farm.url, "schedule", "list") == 0
    assert "poll  every 60 s" in capsys.readouterr().out
    assert run_cli("--db", farm.url, "schedule", "remove", "poll") == 0
    assert farm.list_schedules() == []
    assert run_cli("--db", farm.url, "schedule", "remove", "poll") == 1
    assert capsys.readouterr().err == "error: no schedule named 'poll': see `queueprocessor schedule list`\n"


def test_pausing_cancels_the_occurrences_already_waiting(farm):
    farm.settings(**FAST)
    # Made at once: those from two periods on (its first, see first_occurrence) to the horizon, 2 periods + a heartbeat.
    farm.schedule("soon", farm.command_spec(["sh", "-c", "true"]), every=0.2)
    waiting = [j for j in farm._store.jobs.newest() if j["state"] == "queued"]
    assert waiting, "occurrences within the horizon are made into jobs when the schedule is added"
    farm.pause_schedule("soon")
    assert all(farm._store.jobs.get(j["id"])["state"] == "cancelled" for j in waiting)


def test_pausing_a_schedule_leaves_a_grab_of_the_same_name_alone(farm):
    farm.settings(**FAST)
    farm.schedule("report", farm.command_spec(["sh", "-c", "true"]), every=3600)
    grabbed = farm.grab("report", "2026-11-22", farm.command_spec(["sh", "-c", "true"]))
    farm.pause_schedule("report")
    assert farm._store.jobs.get(grabbed)["state"] == "queued"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cron", "61 * * * *"], "error: malformed cron expression '61 * * * *'"),
        (["--cron", "0 3 * * *", "--tz", "Europe/Atlantis"], "error: unknown time zone 'Europe/Atlantis'"),
        (["--every", "0"], "error: --every must be at least 0.1 seconds"),
    ],
)
def test_bad_schedules_are_one_line_at_the_cli(farm, argv, message, capsys):
    assert run_cli("--db", farm.url, "schedule", "add", "x", *argv, "http", "/ok") == 1
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert farm.list_schedules() == []
