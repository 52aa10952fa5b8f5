"""Never twice at once: every run a node starts stays held (renewed, stoppable) under its job and fence until its
own end is written, its stop is over before its lease can run out, and a job is not started again, here or
elsewhere, while a run of it still works. The hazards a review of the node found, each shown by a test that
failed before the runner tracked runs by job and fence."""

import logging
import os
import threading
import time
from types import SimpleNamespace

import pytest

from queueprocessor.executors import JobContext
from queueprocessor.executors.command import CommandExecutor
from queueprocessor.executors.http import HttpExecutor
from queueprocessor.farm import Farm
from queueprocessor.node.config import NodeConfig
from queueprocessor.node.runner import JobRunner
from queueprocessor.node.runs import STOPPED, Running
from queueprocessor.rules.job import Claimed, JobSpec
from queueprocessor.rules.states import Kind, Outcome
from queueprocessor.store.types import ClaimRequest
from tests.support import pyjobs
from tests.support.work import Nodes, stubborn_claimed_back, wait_for

pytestmark = pytest.mark.postgres


def register(store, name="m"):
    return store.machines.register(
        name=name, host="h", instance=f"{name}-{time.monotonic_ns()}", pid=1, version="t", capacity=4
    )


def test_a_failed_job_claimed_again_before_its_end_is_noted_keeps_both_runs_to_their_ends(pg_url, http_target, caplog):
    """A failed job's retry is due within a second, and a turn claims up to a period ahead: the node can claim it
    again between the commit of the failure and the runner's note of it. That note used to drop the new run (one
    entry per job id), whose own end then raised KeyError in the result writer, and it was never noted."""
    with Farm(pg_url) as farm:
        store = farm._store
        machine = register(store)
        [job_id] = farm.enqueue_http("/fail")
        [old] = store.jobs.claim(ClaimRequest(machine, 1, lease=30))
        written, go_on = threading.Event(), threading.Event()
        finish_many = store.runs.finish_many

        def noted_late(*args):  # the real write; the runner hears of it only once the test says so
            states = finish_many(*args)
            if not written.is_set():
                written.set()
                go_on.wait(10)
            return states

        store.runs.finish_many = noted_late
        ended = []
        runner = JobRunner(
            store,
            machine,
            {"http": HttpExecutor(http_target.base_url)},
            store.ask_time,
            lambda job, outcome: ended.append((job.fence, outcome)),
        )
        runner.start()
        try:
            with caplog.at_level(logging.INFO):
                runner.submit(old)
                assert written.wait(10)
                [new] = store.jobs.claim(
                    ClaimRequest(machine, 1, lease=30, horizon=5.0)
                )  # its retry, claimed ahead of its time
                assert (new.id, new.fence) == (job_id, old.fence + 1)
                runner.submit(new)
                go_on.set()
                wait_for(lambda: len(ended) == 2)
                assert runner.count() == 0
        finally:
            go_on.set()
            store.runs.finish_many = finish_many
            runner.stop()
    assert ended == [(old.fence, Outcome.FAILED), (new.fence, Outcome.FAILED)]
    assert "KeyError" not in caplog.text and "never retrieved" not in caplog.text


def test_a_command_stopped_for_its_lease_is_over_before_the_lease_can_run_out(pg_url, tmp_path):
    """The watchdog stops a job `fence_margin` before its lease could run out, up to `watchdog_every` late. A
    command that ignores SIGTERM used to get a second before SIGKILL: it was still running when the next
    turn-holder took the lease. A stop for a lost lease now forces it after `fenced_grace`."""
    config = NodeConfig()
    assert config.watchdog_every + config.fenced_grace < config.fence_margin
    pid_file = tmp_path / "pid"
    with Farm(pg_url) as farm:
        store = farm._store
        machine = register(store)
        farm.enqueue_command(["sh", "-c", "trap '' TERM; echo $$ > \"$0\"; sleep 30; sleep 30", str(pid_file)])
        [job] = store.jobs.claim(ClaimRequest(machine, 1, lease=30))
        runner = JobRunner(
            store,
            machine,
            {"command": CommandExecutor(("sh",))},
            store.ask_time,
            lambda _job, _outcome: None,
            fenced_grace=config.fenced_grace,
        )
        runner.start()
        try:
            runner.submit(job)
            wait_for(lambda: pid_file.exists() and pid_file.read_text().strip())
            stopping = time.monotonic()
            assert runner.stop_job((job.id, job.fence), Outcome.LOST)
            while runner.working() and time.monotonic() - stopping < 5:
                time.sleep(0.005)
            took = time.monotonic() - stopping
            wait_for(lambda: runner.count() == 0)
        finally:
            runner.stop()
    assert took < config.fence_margin - config.watchdog_every, f"its stop took {took:.2f} s"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_a_python_function_that_ignores_its_stop_keeps_its_job_until_it_returns(pg_url, caplog):
    """A thread cannot be killed. A timed-out function that ignored its flag used to be abandoned after a second's
    grace, its job retried while it still ran. Now its run is held (the lease renewed) until it returns, loudly."""
    pyjobs.CALLS.clear()
    with Farm(pg_url) as farm:
        nodes = Nodes(farm)
        [job_id] = farm.enqueue_python("tests.support.pyjobs:stubborn", [3.0], timeout=0.2, max_attempts=2)
        try:
            with caplog.at_level(logging.ERROR):
                nodes("a")
                wait_for(lambda: farm.job(job_id)["state"] == "succeeded", timeout=20)
        finally:
            nodes.stop_all()
    first, second = [call for call in pyjobs.CALLS if call["job"] == job_id]
    assert first["ended"] <= second["started"], "the job was run again while its first call still ran"
    assert "has not returned 1 s after it was told to stop" in caplog.text


def test_a_job_claimed_back_while_its_stopped_function_still_runs_starts_once_that_call_has_returned(pg_url):
    """The watchdog stops a plain function that ignores its flag, and the node claims the job back after the
    thaw: the new run is held from its claim, but its work waits for the old call to return."""
    pyjobs.CALLS.clear()
    with Farm(pg_url) as farm:
        store = farm._store
        machine = register(store)
        with stubborn_claimed_back(farm, machine) as (runner, job_id, old, new):
            wait_for(lambda: runner.held() == [(job_id, new.fence)] or runner.count() == 0, timeout=15)
            wait_for(lambda: runner.count() == 0, timeout=15)
        assert store.jobs.get(job_id)["state"] == "succeeded"
    assert [call["fence"] for call in pyjobs.CALLS] == [old.fence, new.fence]
    assert pyjobs.overlapping(pyjobs.CALLS) == []


def test_a_node_stopping_at_once_renews_its_jobs_until_they_have_stopped(pg_url):
    """stop() used to end the heartbeat and the watchdog before it stopped the jobs: a job slow to stop ran on
    unrenewed, its lease ran out, and another machine ran it beside the first."""
    pyjobs.CALLS.clear()
    with Farm(pg_url) as farm:
        nodes = Nodes(farm)
        [job_id] = farm.enqueue_python("tests.support.pyjobs:stubborn", [2.0])
        try:
            a = nodes("a")
            wait_for(lambda: pyjobs.CALLS)
            b = nodes("b")
            wait_for(lambda: b.id in [m["id"] for m in farm.status()["machines"] if m["state"] == "active"])
            a.stop(drain=False)
            wait_for(lambda: farm.job(job_id)["state"] == "succeeded", timeout=20)
        finally:
            nodes.stop_all()
        runs = sorted((run["fence"], run["machine_id"], run["error"]) for run in farm._store.runs.read(job_id=job_id))
    assert pyjobs.overlapping(pyjobs.CALLS) == []
    assert [(call["machine"], call["ended"] is not None) for call in pyjobs.CALLS] == [(a.id, True), (b.id, True)]
    assert [(machine, error) for _fence, machine, error in runs] == [(a.id, STOPPED["exit"]), (b.id, None)]


def test_a_claim_that_comes_after_the_stop_is_handed_back_unstarted(pg_url, http_target):
    """A turn stuck in its claim while the node stops can start jobs after stop_all(): they are handed back."""
    with Farm(pg_url) as farm:
        store = farm._store
        machine = register(store)
        [job_id] = farm.enqueue_http("/ok")
        [job] = store.jobs.claim(ClaimRequest(machine, 1, lease=30))
        runner = JobRunner(
            store, machine, {"http": HttpExecutor(http_target.base_url)}, store.ask_time, lambda _job, _outcome: None
        )
        runner.start()
        try:
            runner.refuse("exit")
            runner.submit(job)
            wait_for(lambda: runner.count() == 0)
        finally:
            runner.stop()
        record = store.jobs.get(job_id)
    assert (record["state"], record["attempts"], record["last_error"]) == ("queued", 0, STOPPED["exit"])
    assert http_target.requests("/ok") == []


def test_a_singleton_claimed_after_a_drain_began_is_handed_back(pg_url):
    """A turn already past its look at the node's state could claim a singleton after release_singletons(): the
    drain waited for it for ever."""
    with Farm(pg_url) as farm:
        store = farm._store
        machine = register(store)
        farm.singleton("keeper", JobSpec(executor="python", target="tests.support.pyjobs:wait_for_cancel"))
        [job] = store.jobs.claim(ClaimRequest(machine, 1, lease=30))
        assert job.kind == Kind.SINGLETON
        runner = JobRunner(store, machine, {}, store.ask_time, lambda _job, _outcome: None)
        runner.start()
        try:
            runner.release_singletons()
            runner.submit(job)
            wait_for(lambda: runner.count() == 0)
        finally:
            runner.stop()
        record = store.jobs.get(job.id)
    assert (record["state"], record["owner"], record["last_error"]) == ("queued", None, STOPPED["released"])


def test_a_renewal_credits_only_the_runs_it_renewed():
    """The watchdog used to credit every job with the last renewal's send time, a job claimed while the renewal
    was on its way too: that job's lease runs from its claim, and its deadline moved later by the reply's lag."""
    no_store = SimpleNamespace(flows=SimpleNamespace(results=None))  # the renewal credit touches no database
    runner = JobRunner(no_store, 1, {}, time.time, lambda _job, _outcome: None)
    try:
        for job_id, claimed_at in ((1, 10.0), (2, 11.0)):
            job = Claimed(job_id, "http", "/ok", "GET", None, 1, 3, None, 1, 0.0)
            runner.running[job.id, job.fence] = Running(job, JobContext(job_id, 1, 1, 1), leased_at=claimed_at)
        runner.renewed([(1, 1), (3, 1)], sent=10.5)  # a renewal sent before job 2's claim; job 3 ended meanwhile
        assert dict(runner.leases()) == {(1, 1): 10.5, (2, 1): 11.0}
    finally:
        runner.loop.close()
