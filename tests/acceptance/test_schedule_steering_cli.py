"""An operator steers a schedule from the command line, as a user runs it: `schedule run` on a farm of real
node processes runs the work exactly once per request, `schedule set` changes only what it is given (one clear
line for bad input), and `schedule show` lists the last runs with their lateness."""

import json
import os
import subprocess
import sys

import pytest

from queueprocessor.farm import Farm
from tests.support.httptarget import HttpTarget
from tests.support.work import FAST, NodeProcesses, wait_for


def run(db: str, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "queueprocessor.cli", "--db", db, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=dict(os.environ))


def test_a_run_now_sent_twice_from_two_hosts_runs_once_on_a_farm_of_two(db_url, tmp_path):
    farm = Farm(db_url)
    farm.settings(**FAST)
    processes = NodeProcesses(db_url, tmp_path)
    try:
        with HttpTarget() as target:
            for name in ("a", "b"):
                processes(name, "--http-base", target.base_url)
            wait_for(lambda: len({t["machine_id"] for t in farm._store.turns.read(0)}) == 2, timeout=30)
            added = run(db_url, "schedule", "add", "nightly", "--cron", "0 3 1 1 *", "http", "/ok")
            assert added.returncode == 0, added.stderr
            sent = [run(db_url, "schedule", "run", "nightly", "--request", "incident-42") for _ in range(2)]
            assert [done.returncode for done in sent] == [0, 0], [done.stderr for done in sent]
            assert sent[0].stdout == sent[1].stdout  # the same job, named twice
            job_id = farm.run_schedule("nightly", request="incident-42")  # a third time, through the API
            assert f"as job {job_id};" in sent[0].stdout
            wait_for(lambda: farm.job(job_id)["state"] == "succeeded", timeout=20)
            later = farm._store.ask_time() + 5 * FAST["period"]
            wait_for(lambda: farm._store.ask_time() > later)  # turns enough for any second start to have come
            calls = target.requests("/ok")
        shown = run(db_url, "schedule", "show", "nightly", "--json")
        listed = run(db_url, "jobs")
    finally:
        processes.kill_all()
        farm.close()
    assert [c["job"] for c in calls] == [job_id]  # exactly once, on one machine
    assert len(farm_runs := json.loads(shown.stdout)["runs"]) == 1
    [ran] = farm_runs
    assert ran["manual"] and ran["outcome"] == "succeeded" and ran["machine_name"] in ("a", "b")
    assert 0 <= ran["late"] < 2 * FAST["period"] + 1.0  # asked for now, started at the next turn or push
    assert "nightly (run now)" in listed.stdout


@pytest.fixture
def nightly(tmp_path):
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    assert (
        run(url, "schedule", "add", "nightly", "--cron", "0 3 * * *", "--tz", "Europe/Berlin", "http", "/a").returncode
        == 0
    )
    return url


def test_schedule_set_changes_what_it_is_given_and_nothing_else(nightly):
    done = run(
        nightly, "schedule", "set", "nightly", "--cron", "30 4 * * *", "--payload", '{"day": 1}', "--queue", "q2"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("schedule nightly: cron '30 4 * * *' Europe/Berlin, next at ")
    with Farm(nightly) as farm:
        row = farm.get_schedule("nightly")
    assert (row["cron"], row["tz"], row["payload"], row["queue"], row["target"]) == (
        "30 4 * * *",
        "Europe/Berlin",
        '{"day":1}',
        "q2",
        "/a",
    )
    assert (
        run(nightly, "schedule", "set", "nightly", "--every", "300", "--misfire", "skip", "--grace", "60").returncode
        == 0
    )
    assert run(nightly, "schedule", "set", "nightly", "command", "--", "backup", "--full").returncode == 0
    with Farm(nightly) as farm:
        row = farm.get_schedule("nightly")
    assert (row["every"], row["cron"], row["tz"], row["misfire"], row["grace"]) == (300.0, None, None, "skip", 60.0)
    assert (row["executor"], row["target"], row["payload"]) == ("command", '["backup", "--full"]', '{"day":1}')


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cron", "61 * * * *"], "error: malformed cron expression '61 * * * *'"),
        (["--tz", "Europe/Atlantis"], "error: unknown time zone 'Europe/Atlantis'"),
        (["--every", "0"], "error: --every must be at least 0.1 seconds (got 0)"),
        (["--every", "60", "--tz", "UTC"], "error: --tz only applies to --cron schedules"),
        (["--misfire", "often"], "error: Invalid value for '--misfire'"),
        (["--grace", "-5"], "error: Invalid value for '--grace'"),
        (["--payload", "{nope"], "error: payload is not valid JSON"),
        (["--queue", "no spaces"], "error: --queue 'no spaces' is not a queue name"),
        (["python", "a", "b"], "error: python work takes one target"),
        ([], "error: nothing to change: give --cron"),
    ],
)
def test_a_bad_schedule_set_is_one_line_and_changes_nothing(nightly, argv, message):
    with Farm(nightly) as farm:
        before = farm.get_schedule("nightly")
    done = run(nightly, "schedule", "set", "nightly", *argv)
    assert done.returncode != 0 and done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr
    with Farm(nightly) as farm:
        assert farm.get_schedule("nightly") == before


def test_run_and_set_of_an_unknown_schedule_say_where_to_look(nightly):
    for argv in (["run", "ghost"], ["set", "ghost", "--every", "5"], ["show", "ghost"]):
        done = run(nightly, "schedule", *argv)
        assert (done.returncode, done.stderr) == (
            1,
            "error: no schedule named 'ghost': see `queueprocessor schedule list`\n",
        )


def test_schedule_show_lists_the_last_runs_newest_first(nightly):
    with Farm(nightly) as farm:
        first, second = farm.run_schedule("nightly"), farm.run_schedule("nightly")
        for job_id in (first, second):  # as a node would have ended them: cancelled before they ran
            farm.cancel(job_id)
    done = run(nightly, "schedule", "show", "nightly")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("schedule nightly: cron '0 3 * * *' Europe/Berlin, next at ")
    table = [line for line in lines if line.split()[:1] in ([str(first)], [str(second)])]
    assert [line.split()[0] for line in table] == [str(second), str(first)]
    assert all("run now" in line and "cancelled" in line for line in table)
