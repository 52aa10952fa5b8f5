"""The runner's own lifecycle: its result writer is never left behind on a closed loop."""

import gc
import logging
import threading

from queueprocessor.runner import JobRunner
from queueprocessor.store import JobSpec


def test_a_stopping_runner_lets_the_result_writers_last_statement_end_before_its_loop_closes(farm, caplog):
    """The writer writes results in a thread of the loop's executor. A runner stopped while that thread is held
    there used to close its loop under the writer's task, which was then destroyed pending ("Task was destroyed
    but it is pending ... Recorder._write")."""
    store = farm.store
    held, release, over = threading.Event(), threading.Event(), threading.Event()
    finish_many = store.finish_many

    def finish_held_up(*args):  # the real write, on the real executor thread, held until the test lets it go
        held.set()
        release.wait(10)
        try:
            return finish_many(*args)
        finally:
            over.set()

    store.finish_many = finish_held_up
    machine = store.register(name="m", host="h", instance="runner-test", pid=1, version="0", capacity=1)
    store.enqueue(JobSpec(executor="python", target="tests.support.pyjobs:echo"))
    [job] = store.claim(machine, 1, 30.0)
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
        store.finish_many = finish_many
    assert farm.job(job.id)["state"] == "failed"
