"""Acceptance: real node processes on a real PostgreSQL server, driven through the CLI."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from queueprocessor.farm import Farm
from queueprocessor.rules.errors import LostLease
from queueprocessor.rules.job import Claimed
from tests.support.work import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def spawn(pg_url, tmp_path):
    """Start `queueprocessor node` processes; all are killed at the end."""
    procs: list[subprocess.Popen] = []
    logs = []

    def start(name, *args):
        logs.append(open(tmp_path / f"{name}.log", "w"))
        proc = subprocess.Popen(
            [sys.executable, "-m", "queueprocessor.cli", "--db", pg_url, "node", "--name", name, *args],
            stdout=logs[-1],
            stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    for log in logs:
        log.close()


def cli(url, *args) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "queueprocessor.cli", "--db", url, *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_three_skewed_nodes_take_one_turn_per_slot_in_rotation(pg_url, spawn):
    Farm(pg_url).close()  # create the schema before the nodes race for it
    for name, skew in (("west", "-0.7"), ("mid", "0"), ("east", "0.9")):
        spawn(name, "--clock-skew", skew)
    with Farm(pg_url) as farm:
        check_rotation(farm, pg_url)


def check_rotation(farm, pg_url):
    wait_for(lambda: len([m for m in farm.status()["machines"] if m["status"] == "active"]) == 3, 20)
    time.sleep(3)  # every node has joined the roster
    start = farm._store.ask_time()
    time.sleep(15)
    end = farm._store.ask_time()
    turns = [
        t for t in json.loads(cli(pg_url, "turns", "--since", "30", "--json"))["turns"] if start <= t["taken_at"] <= end
    ]
    slots = [t["slot"] for t in turns]
    assert slots == list(range(slots[0], slots[0] + len(slots))), "one turn in every slot, none twice"
    assert len(slots) >= 14
    owners = [t["machine_id"] for t in turns]
    assert len(set(owners)) == 3
    assert all(len(set(owners[i : i + 3])) == 3 for i in range(len(owners) - 2)), "turns rotate over all three"
    # Each turn was taken inside its own slot, in database time, despite the skews.
    assert all(t["slot"] <= t["taken_at"] < t["slot"] + 1 for t in turns)
    status = json.loads(cli(pg_url, "status", "--json"))
    offsets = {m["name"]: m["clock_offset"] for m in status["machines"]}
    assert offsets["west"] == pytest.approx(0.7, abs=0.02)
    assert offsets["east"] == pytest.approx(-0.9, abs=0.02)


def test_a_killed_nodes_job_runs_elsewhere_and_its_fence_is_refused(pg_url, spawn, http_target):
    Farm(pg_url).close()
    for name in ("n1", "n2", "n3"):
        spawn(name, "--http-base", http_target.base_url)
    with Farm(pg_url) as farm:
        check_failover(farm, http_target)


def check_failover(farm, http_target):
    wait_for(lambda: len(farm.status()["machines"]) == 3, 20)
    time.sleep(2)
    [job_id] = farm.enqueue_http("/sleep/30")
    job = wait_for(lambda: (j := farm._store.jobs.get(job_id))["state"] == "running" and j, 10)
    victim = next(m for m in farm.status()["machines"] if m["id"] == job["owner"])
    killed_at = farm._store.ask_time()
    os.kill(victim["pid"], signal.SIGKILL)

    def rerun():
        runs = farm._store.runs.read(job_id=job_id)
        return next((r for r in runs if r["attempt"] == 2), None)

    second = wait_for(rerun, 15)
    assert second["machine_id"] != victim["id"]
    # Dead timeout (3 heartbeats of 1 s) plus two periods of 1 s.
    assert second["started_at"] - killed_at <= 5.0
    first = next(r for r in farm._store.runs.read(job_id=job_id) if r["attempt"] == 1)
    assert first["outcome"] == "lost"
    # The dead machine's fence token can no longer write: not in the database...
    stale = Claimed(job_id, "http", "/sleep/30", "GET", None, 1, 3, None, first["fence"], 0.0)
    with pytest.raises(LostLease):
        farm._store.runs.finish(stale, victim["id"], "succeeded")
    # ...nor downstream, which sees the new owner's token first.
    base = http_target.base_url

    def post(fence: int) -> int:
        request = urllib.request.Request(
            base + "write/report", method="POST", headers={"X-QP-Job": str(job_id), "X-QP-Fence": str(fence)}
        )
        try:
            with urllib.request.urlopen(request) as response:
                return response.status
        except urllib.error.HTTPError as refused:
            return refused.code

    assert (post(second["fence"]), post(first["fence"])) == (200, 409)
    assert farm._store.jobs.get(job_id)["owner"] == second["machine_id"]
