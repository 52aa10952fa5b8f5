"""The runner's own lifecycle: its result writer is never left behind on a closed loop."""

import gc
import logging
import subprocess
import sys
import threading

from queueprocessor.executors.http import HttpExecutor
from queueprocessor.farm import Farm
from queueprocessor.node.runner import JobRunner
from queueprocessor.rules.job import JobSpec
from queueprocessor.rules.states import Outcome
from queueprocessor.store.types import ClaimRequest
from tests.support.work import wait_for


def test_a_stopping_runner_lets_the_result_writers_last_statement_end_before_its_loop_closes(farm, caplog):
    """The writer writes results in a thread of the loop's executor. A runner stopped while that thread is held
    there used to close its loop under the writer's task, which was then destroyed pending ("Task was destroyed
    but it is pending ... Recorder._write")."""
    store = farm._store
    held, release, over = threading.Event(), threading.Event(), threading.Event()
    finish_many = store.runs.finish_many

    def finish_held_up(*args):  # the real write, on the real executor thread, held until the test lets it go
        held.set()
        release.wait(10)
        try:
            return finish_many(*args)
        finally:
            over.set()

    store.runs.finish_many = finish_held_up
    machine = store.machines.register(name="m", host="h", instance="runner-test", pid=1, version="0", capacity=1)
    store.jobs.enqueue(JobSpec(executor="python", target="tests.support.pyjobs:echo"))
    [job] = store.jobs.claim(ClaimRequest(machine, 1, 30.0))
    ended = threading.Event()
    runner = JobRunner(store, machine, {}, store.ask_time, lambda _job, _outcome: ended.set())
    runner.start()
    runner.submit(job)  # no executor for it here: it fails at once, and its result is written
    assert held.wait(10), "the writer reached its statement"
    threading.Timer(0.5, release.set).start()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            runner.stop()
            assert over.is_set(), "stop() returned while the writer's statement was still under way"
            assert runner.loop.is_closed() and runner.recorder.task.done()
            release.set()
            over.wait(10)
            del runner
            gc.collect()
        assert "destroyed but it is pending" not in caplog.text
    finally:
        release.set()
        store.runs.finish_many = finish_many
    assert farm.job(job.id)["state"] == "failed"


def test_a_result_the_database_was_away_for_is_still_written_by_a_stopping_runner(farm, caplog):
    """The writer tries a result again a moment after the database refused it, the job held meanwhile. A runner
    stopped in that moment used to close its loop with the try still to come: the result was lost without a word,
    the job left running until its lease expired."""
    store = farm._store
    refused = threading.Event()
    finish_many = store.runs.finish_many

    def away_once(*args):  # the database is away for the first write (a restart), back for the next
        if not refused.is_set():
            refused.set()
            raise ConnectionError("server closed the connection unexpectedly")
        return finish_many(*args)

    store.runs.finish_many = away_once
    machine = store.machines.register(name="m", host="h", instance="runner-test", pid=1, version="0", capacity=1)
    [job_id] = store.jobs.enqueue(JobSpec(executor="python", target="tests.support.pyjobs:echo"))
    [job] = store.jobs.claim(ClaimRequest(machine, 1, 30.0))
    runner = JobRunner(store, machine, {}, store.ask_time, lambda _job, _outcome: None)
    runner.start()
    try:
        runner.submit(job)  # no executor for it here: it fails at once, and its result is to be written
        assert refused.wait(10)
        with caplog.at_level(logging.WARNING):
            runner.stop()
            del runner
            gc.collect()
    finally:
        store.runs.finish_many = finish_many
    assert "destroyed but it is pending" not in caplog.text
    assert store.jobs.get(job_id)["state"] == "failed"


STOPPING = """
import json, sys, time
from pathlib import Path
from queueprocessor.executors.command import CommandExecutor
from queueprocessor.farm import Farm
from queueprocessor.node.runner import JobRunner
from queueprocessor.rules.job import JobSpec
from queueprocessor.store.types import ClaimRequest

url, started = sys.argv[1], Path(sys.argv[2])
with Farm(url) as farm:
    store = farm._store
    machine = store.machines.register(name="m", host="h", instance="stop-test", pid=1, version="0", capacity=3)
    argv = ["sh", "-c", 'echo >> "$0"; exec sleep 30', str(started)]
    store.jobs.enqueue(JobSpec(executor="command", target=json.dumps(argv)), count=3)
    jobs = store.jobs.claim(ClaimRequest(machine, 3, 30.0))
    runner = JobRunner(store, machine, {"command": CommandExecutor(("sh",))}, store.ask_time, lambda *_: None)
    runner.start()
    runner.submit_many(jobs)
    deadline = time.monotonic() + 10
    while (not started.exists() or len(started.read_text()) < 3) and time.monotonic() < deadline:
        time.sleep(0.02)
    runner.stop_all("exit")
    runner.stop()
"""


def test_a_runner_stopped_as_its_jobs_are_stopping_hands_every_one_back_and_leaves_no_task_behind(
    farm, db_url, tmp_path
):
    """A stop that comes right after the jobs were told to stop (the operator's exit, a crash in the screenshot
    script): stopping a command takes its process's end, several passes of the loop, and the loop used to close
    under the jobs' tasks and the writer of their results ("Task was destroyed but it is pending"), leaving the
    jobs running in the database until their leases expired."""
    done = subprocess.run(
        [sys.executable, "-c", STOPPING, db_url, str(tmp_path / "started")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "Task was destroyed" not in done.stderr
    jobs = farm.list_jobs()
    assert [(job["state"], job["owner"], job["attempts"]) for job in jobs] == [("queued", None, 0)] * 3


def test_a_job_claimed_back_while_its_stopped_run_is_ending_stays_renewed_and_stoppable(pg_url, http_target, caplog):
    """After a database freeze the watchdog stops a job (its lease about to run out); once the database is back,
    this machine claims the job again, under a new fence, while the stopped run's hand-back is still being tried.
    The runner tracked runs by job id: the new run overwrote the old, the old run's end then dropped the new one,
    which was no longer renewed (its lease ran out and another machine ran the job beside it) nor stoppable, and
    its own end raised KeyError in the result writer. Each run is now held under its job and fence until its own
    end is written, and the target sees the two runs one after the other."""
    with Farm(pg_url) as farm:
        store = farm._store
        machine = store.machines.register(name="m", host="h", instance="reclaim", pid=1, version="0", capacity=2)
        [job_id] = farm.enqueue_http("/sleep/30")
        [old] = store.jobs.claim(ClaimRequest(machine, 1, lease=30))
        handing_back, thawed = threading.Event(), threading.Event()
        release = store.runs.release

        def release_after_the_thaw(*args):  # the real hand-back, held up as by the frozen database
            handing_back.set()
            thawed.wait(10)
            return release(*args)

        store.runs.release = release_after_the_thaw
        runner = JobRunner(
            store, machine, {"http": HttpExecutor(http_target.base_url)}, store.ask_time, lambda _job, _outcome: None
        )
        runner.start()
        try:
            with caplog.at_level(logging.INFO):
                runner.submit(old)
                wait_for(lambda: len(http_target.requests("/sleep")) == 1)
                runner.stop_all(Outcome.LOST)  # the watchdog, as the freeze went on
                assert handing_back.wait(10)
                wait_for(lambda: http_target.requests("/sleep")[0]["ended"])  # the target saw the call end
                store.runs.renew(machine, [(job_id, old.fence)], lease=-1.0)  # its lease ran out meanwhile
                # this machine's turn after the thaw takes it back
                [new] = store.jobs.claim(ClaimRequest(machine, 1, lease=30))
                assert (new.id, new.fence) == (job_id, old.fence + 1)
                runner.submit(new)
                thawed.set()  # the old run's hand-back is refused (the fence moved on) and its run ends
                wait_for(lambda: len(http_target.requests("/sleep")) == 2)
                wait_for(lambda: (job_id, old.fence) not in runner.held())  # the old run's end is written
                assert runner.held() == [(job_id, new.fence)], "the new run is still held after the old one ended"
                assert store.runs.renew(machine, runner.held(), lease=30) == {(job_id, new.fence): False}
                runner.stop_all(Outcome.CANCELLED)
                wait_for(lambda: runner.count() == 0)
        finally:
            thawed.set()
            store.runs.release = release
            runner.stop()
        first, second = sorted(http_target.requests("/sleep"), key=lambda r: r["fence"])
        assert (first["fence"], second["fence"]) == (old.fence, new.fence)
        assert first["ended"] <= second["started"], "the new run began before the stopped one had ended"
        assert second["ended"] is not None, "the new run could not be stopped"
        assert store.jobs.get(job_id)["state"] == "cancelled"
        assert "KeyError" not in caplog.text and "never retrieved" not in caplog.text
