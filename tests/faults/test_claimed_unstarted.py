"""Claimed but not started: the jobs a node holds before their work begins count like any other.

A node holds such jobs in two cases (and for the moment its executor takes to import a target it has not run yet):
- a job claimed ahead of its time: a turn claims what is due before the next turn (up to a period ahead, a
  schedule's occurrences above all) and starts each exactly at its time;
- a newer run of a job waiting for this machine's older, stopped run of it to end (runner._after_prior).
No batch waits for room or to fill: a batch is what one claim brought. Each case's jobs hold leases the keepalive
renews, a paused or draining node gives them back at once (their time kept), and a node SIGKILLed while holding
them loses none: they come back after the lease.
"""

import contextlib
import time

import pytest

from queueprocessor.farm import Farm
from queueprocessor.node.runs import STOPPED
from queueprocessor.store.types import ClaimRequest
from tests.support import pyjobs
from tests.support.work import NodeProcesses, Nodes, stubborn_claimed_back, wait_for

pytestmark = pytest.mark.postgres

# A period long beside the lease (0.75 s): a job due within the next period is claimed at once (on its push
# notice) and held for seconds, several leases, before it starts.
HOLDING = dict(period=5.0, heartbeat=0.25)
DUE_IN = 4.0  # seconds from enqueue to a held job's time


@pytest.fixture
def farm(pg_url):
    with Farm(pg_url) as the_farm:
        the_farm.settings(**HOLDING)
        yield the_farm


@pytest.fixture
def nodes(farm, http_target):
    started = Nodes(farm, http_base=http_target.base_url, **HOLDING)
    yield started
    started.stop_all()


def held_ahead(farm, node, http_target) -> tuple[int, dict]:
    """A job enqueued DUE_IN seconds ahead, once `node` holds it unstarted: its id and its row then."""
    wait_for(lambda: farm.serving("default"), timeout=20)
    [job_id] = farm.enqueue_http("/ok", delay=DUE_IN)
    row = wait_for(lambda: (r := farm._store.jobs.get(job_id))["owner"] == node.id and r, timeout=DUE_IN / 2)
    assert row["state"] == "running" and not http_target.requests("/ok"), "claimed ahead of its time, not begun"
    return job_id, row


def back_in_queue(farm, job_id, held: dict, reason: str) -> None:
    """The job is queued again, its time and attempts as before its claim, with `reason`; it did not start."""
    row = wait_for(lambda: (r := farm._store.jobs.get(job_id))["state"] == "queued" and r, timeout=DUE_IN / 2)
    assert farm._store.ask_time() < held["run_at"], "given back before its time, not when it came"
    assert (row["owner"], row["run_at"], row["attempts"]) == (None, held["run_at"], 0)
    assert row["last_error"] == STOPPED[reason]


def test_a_job_claimed_ahead_of_its_time_keeps_its_lease_renewed_until_it_starts(farm, nodes, http_target):
    a = nodes("a")
    job_id, held = held_ahead(farm, a, http_target)
    leases = {held["lease_until"]}
    while not http_target.requests("/ok"):
        row = farm._store.jobs.get(job_id)
        if row["state"] == "running" and not http_target.requests("/ok"):
            leases.add(row["lease_until"])
        time.sleep(0.05)
    assert len(leases) >= 3, "its lease was not renewed while it waited for its time"
    wait_for(lambda: farm.job(job_id)["state"] == "succeeded")
    [run] = farm.job(job_id)["runs"]
    assert (run["machine_id"], run["fence"], run["outcome"]) == (a.id, 1, "succeeded")
    assert len(http_target.requests("/ok")) == 1


@pytest.mark.parametrize("wish, reason", [("pause", "paused"), ("drain", "released")])
def test_a_paused_or_draining_node_gives_back_at_once_what_it_claimed_ahead_of_its_time(
    farm, nodes, http_target, wish, reason
):
    a = nodes("a")
    job_id, held = held_ahead(farm, a, http_target)
    farm.steer("a", wish)
    back_in_queue(farm, job_id, held, reason)
    if wish == "drain":
        assert a.stopped.wait(5), "the drained node waited for work it had given back"
    b = nodes("b")  # another machine runs it, at its time, once
    wait_for(lambda: farm.job(job_id)["state"] == "succeeded", timeout=DUE_IN + 10)
    assert [(r["machine"], r["fence"]) for r in http_target.requests("/ok")] == [(b.id, 2)]


def test_a_node_told_to_stop_gives_back_what_it_claimed_ahead_of_its_time_instead_of_waiting_to_run_it(
    farm, nodes, http_target
):
    a = nodes("a")
    job_id, held = held_ahead(farm, a, http_target)
    a.stop()  # drains: SIGTERM's way
    back_in_queue(farm, job_id, held, "released")
    assert not http_target.requests("/ok")


def test_a_node_sigkilled_while_holding_jobs_ahead_of_their_time_loses_none(pg_url, http_target, tmp_path):
    """A real node process killed with jobs claimed and not begun: after their lease they run elsewhere, once."""
    with Farm(pg_url) as farm:
        farm.settings(**HOLDING)
        procs = NodeProcesses(pg_url, tmp_path, timing=HOLDING)
        try:
            victim = procs("victim", "--http-base", http_target.base_url)
            wait_for(lambda: farm.serving("default"), timeout=20)
            ids = farm.enqueue_http("/ok", delay=DUE_IN, count=3)
            wait_for(lambda: all(farm._store.jobs.get(i)["state"] == "running" for i in ids), timeout=DUE_IN / 2)
            assert not http_target.requests("/ok")
            victim.kill()
            victim.wait()
            procs("heir", "--http-base", http_target.base_url)
            wait_for(lambda: all(farm.job(i)["state"] == "succeeded" for i in ids), timeout=30)
        finally:
            procs.kill_all()
        assert sorted(r["job"] for r in http_target.requests("/ok")) == sorted(ids), "each ran once"
        assert http_target.concurrent_overlaps() == []
        for job_id in ids:
            lost, ran = sorted(farm.job(job_id)["runs"], key=lambda r: r["fence"])
            assert (lost["outcome"], ran["outcome"]) == ("lost", "succeeded")


@contextlib.contextmanager
def claimed_back(pg_url):
    """stubborn_claimed_back on a fresh farm with a machine of its own: yields (store, machine, runner, job id, the
    old claim, the new one), pyjobs.CALLS holding only its calls."""
    pyjobs.CALLS.clear()
    with Farm(pg_url) as farm:
        store = farm._store
        machine = store.machines.register(name="m", host="h", instance="i", pid=1, version="t", capacity=4)
        with stubborn_claimed_back(farm, machine) as (runner, job_id, old, new):
            yield store, machine, runner, job_id, old, new


def test_a_run_waiting_for_its_older_run_is_renewed_and_given_back_by_a_pause_only_once_that_run_is_over(pg_url):
    """The watchdog stopped a function that ignores its flag; the node claimed the job back after a thaw. The new run
    waits for the old call to return: meanwhile its lease is renewed, and a pause gives it back, but only once the
    old call has returned. Given back at once, the job went back to the queue while the old call still worked here,
    and another machine ran it beside it."""
    with claimed_back(pg_url) as (store, machine, runner, job_id, old, new):
        wait_for(lambda: (job_id, new.fence) in runner.held())
        assert (job_id, new.fence) in store.runs.renew(machine, runner.held(), lease=30), "the keepalive's renewal"
        runner.hand_back_waiting("paused")
        row = wait_for(lambda: (r := store.jobs.get(job_id))["state"] == "queued" and r, timeout=15)
        assert pyjobs.CALLS[0]["ended"] is not None, "the job went back to the queue while its old call worked"
        assert (row["owner"], row["last_error"]) == (None, STOPPED["paused"])
        wait_for(lambda: runner.count() == 0, timeout=15)
    assert [call["fence"] for call in pyjobs.CALLS] == [old.fence], "the new run never began"


def test_a_third_claim_of_a_job_waits_for_every_older_run_still_at_work_here(pg_url):
    """The wait for an older run was one level deep: a second run stopped while it waited for the first ended at
    once, the job went back to the queue, and a third claim started beside the first, whose call still worked."""
    with claimed_back(pg_url) as (store, machine, runner, job_id, old, second):
        wait_for(lambda: (job_id, second.fence) in runner.held())
        runner.stop_job((job_id, second.fence), "lost")  # another freeze
        store.runs.renew(machine, [(job_id, second.fence)], lease=-1.0)  # its lease runs out meanwhile
        [third] = store.jobs.claim(ClaimRequest(machine, 1, lease=30))  # the node's turn after the thaw, again
        runner.submit(third)
        wait_for(lambda: store.jobs.get(job_id)["state"] != "running", timeout=20)
    assert [call["fence"] for call in pyjobs.CALLS] == [old.fence, third.fence]
    assert pyjobs.overlapping(pyjobs.CALLS) == [], "two calls of the job at once on one machine"
