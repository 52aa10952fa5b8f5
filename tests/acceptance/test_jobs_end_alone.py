"""Work that misbehaves towards its node ends its own run, and only that (docs/design.md §3): a job that calls
sys.exit or raises KeyboardInterrupt, a module that exits or hangs when imported, a coroutine that raises
CancelledError or TimeoutError of its own, or one that blocks the node's event loop. Each ends as its user would
expect, the node goes on claiming and running, and a drain ends."""

import logging
import threading

import pytest

from queueprocessor.executors import Executor
from queueprocessor.farm import Farm
from queueprocessor.node.runner import JobRunner
from queueprocessor.node.runs import OWN_CANCEL
from queueprocessor.rules.job import JobSpec
from queueprocessor.store.types import ClaimRequest
from tests.support import pyjobs, unruly
from tests.support.work import PYJOBS, Nodes, wait_for

UNRULY = unruly.__name__
MODULES = [PYJOBS, UNRULY, "tests.support.exits_on_import", "tests.support.hangs_on_import"]
ENDED = ("succeeded", "failed", "cancelled")


@pytest.fixture
def farm(tmp_path):
    """SQLite: what is at stake here is the runner's, the same on every backend."""
    with Farm(f"sqlite:///{tmp_path / 'farm.db'}") as the_farm:
        yield the_farm


@pytest.fixture
def nodes(farm):
    started = Nodes(farm, allow_modules=MODULES)
    yield started
    started.stop_all()


def ended(farm, job_id, timeout=10.0):
    return wait_for(lambda: (j := farm.job(job_id))["state"] in ENDED and j, timeout=timeout)


@pytest.mark.parametrize(
    "target, says",
    [
        (f"{UNRULY}:exits", "SystemExit: 3"),
        (f"{UNRULY}:interrupts", "KeyboardInterrupt"),
        (f"{UNRULY}:exits_async", "SystemExit: 4"),
        (f"{UNRULY}:exits_in_batch", "SystemExit: 5"),
        ("tests.support.exits_on_import:run", "importing tests.support.exits_on_import failed: SystemExit: usage"),
    ],
)
def test_a_job_that_exits_fails_alone_and_its_node_goes_on(farm, nodes, target, says):
    """The issue's trial: `sys.exit(3)` in a job killed the runner's loop while the heartbeat renewed its jobs, so
    they stayed running for ever, nothing else ran there, and a drain never ended."""
    node = nodes("a")
    [bad] = farm.enqueue_python(target, max_attempts=1)
    [good] = farm.enqueue_python(f"{PYJOBS}:noop")
    job = ended(farm, bad)
    assert job["state"] == "failed" and says in job["last_error"], job["last_error"]
    assert "cannot exit its node's process" in job["last_error"]
    assert ended(farm, good)["state"] == "succeeded"
    [after] = farm.enqueue_python(f"{PYJOBS}:noop")  # it still claims
    assert ended(farm, after)["state"] == "succeeded"
    assert not node.stopped.is_set() and node.last_error is None
    node.stop()  # a drain ends
    assert node.stopped.is_set()


def test_a_job_that_raises_its_own_cancelled_error_fails_and_spends_its_attempts(farm, nodes):
    """The issue's trial: taken for a lost lease, it was handed back with its attempt refunded: 9 runs in 8 s."""
    nodes("a")
    [job_id] = farm.enqueue_python(f"{UNRULY}:cancels_itself", max_attempts=2)
    job = ended(farm, job_id, timeout=20)
    assert job["state"] == "failed" and job["attempts"] == 2
    assert [(r["outcome"], r["error"]) for r in job["runs"]] == [("failed", OWN_CANCEL[1])] * 2


def test_a_timeout_error_raised_by_the_work_itself_is_its_failure_not_its_timeout(farm):
    """An HTTP client's own TimeoutError (aiohttp's connect timeout) in a job without a timeout was taken for the
    job's timeout, whose record then failed to format: the job stayed held, renewed, for ever. The executor here
    stands in for the HTTP one: the runner's handling is what is at stake, on a real store."""

    class TimesOut(Executor):
        name = "http"

        def validate(self, spec):
            pass

        async def run(self, job, context):
            raise TimeoutError

    store = farm._store
    machine = store.machines.register(name="m", host="h", instance="i", pid=1, version="t", capacity=1)
    [job_id] = farm.enqueue_http("/slow", max_attempts=1)
    [job] = store.jobs.claim(ClaimRequest(machine, 1, lease=30))
    runner = JobRunner(store, machine, {"http": TimesOut()}, store.ask_time, lambda _job, _outcome: None)
    runner.start()
    try:
        runner.submit(job)
        row = ended(farm, job_id)
    finally:
        runner.stop()
    assert (row["state"], row["runs"][0]["outcome"], row["last_error"]) == ("failed", "failed", "TimeoutError: ")


def test_an_async_job_that_reads_its_results_on_the_loop_is_told_how_to_do_it(farm, nodes):
    nodes("a")
    [job_id] = farm.enqueue_python(f"{UNRULY}:reads_results_on_the_loop", max_attempts=1)
    job = ended(farm, job_id)
    assert job["state"] == "failed" and "await asyncio.to_thread(context.results)" in job["last_error"]


def test_an_import_that_hangs_holds_no_job(farm, nodes, tmp_path, monkeypatch):
    """Jobs waiting for their target's first import had not begun, so a cancel, a timeout or a pause missed them,
    and an import that hung held them, renewed, for ever. Now each ends when it is told to; the import goes on and
    later jobs of the target run once it is over."""
    gate = tmp_path / "gate"
    monkeypatch.setenv("QP_TEST_IMPORT_GATE", str(gate))
    target = "tests.support.hangs_on_import:run"
    node = nodes("a")
    [timed] = farm.enqueue_python(target, timeout=0.5, max_attempts=1)
    [cancelled] = farm.enqueue_python(target)
    wait_for(lambda: farm.job(cancelled)["state"] == "running")
    assert farm._store.jobs.cancel(cancelled) == "cancelling"
    assert (ended(farm, timed)["state"], farm.job(timed)["runs"][0]["outcome"]) == ("failed", "timeout")
    assert ended(farm, cancelled)["state"] == "cancelled"
    [paused] = farm.enqueue_python(target)
    wait_for(lambda: farm.job(paused)["state"] == "running")
    farm.steer("a", "pause")
    row = wait_for(lambda: (r := farm.job(paused))["state"] == "queued" and r)
    assert row["attempts"] == 0 and node.runner.count() == 0
    gate.touch()
    farm.steer("a", "resume")
    assert ended(farm, paused)["state"] == "succeeded"


def test_an_async_job_that_blocks_the_loop_is_named_in_the_log(farm, nodes, caplog):
    """While the loop is blocked no HTTP call or coroutine of the node can be stopped: the operator is told which
    code does it."""
    nodes("a")
    with caplog.at_level(logging.WARNING, logger="queueprocessor.node"):
        [job_id] = farm.enqueue_python(f"{UNRULY}:blocks_the_loop", 1.0)
        assert ended(farm, job_id)["state"] == "succeeded"
    [said] = [r.getMessage() for r in caplog.records if "event loop has been blocked" in r.getMessage()]
    assert "blocks_the_loop" in said and "asyncio.to_thread" in said


def test_a_slow_roster_read_does_not_fence_off_the_jobs_it_delays(farm):
    """The renewal comes first in a check-in, so one slow read of the roster (2 s, the lease 3 s, fencing at 2.5 s)
    does not stop the node's jobs. Renewed after the read, they were renewed 3 s after their last renewal."""
    node = farm.node(name="a", heartbeat=1.0, period=1.0, allow_modules=[PYJOBS])
    read_farm, reads_holding, slowed = node.store.roster.read_farm, [], threading.Event()

    def slow_once(*args, **kwargs):
        if node.runner is not None and node.runner.count():
            reads_holding.append(1)
            if len(reads_holding) == 2:  # the job's lease was renewed by the check-in before this one
                threading.Event().wait(2.0)
                slowed.set()
        return read_farm(*args, **kwargs)

    node.store.roster.read_farm = slow_once
    node.start()
    try:
        [job_id] = farm.enqueue_python(f"{PYJOBS}:nap", 5.0, max_attempts=1)
        job = ended(farm, job_id, timeout=20)
    finally:
        node.stop(drain=False)
    assert slowed.is_set()
    assert job["state"] == "succeeded" and [r["outcome"] for r in job["runs"]] == ["succeeded"]
    assert node.tally.read().fences == 0


def test_a_runner_loop_interrupted_all_the_same_stops_its_node_and_hands_its_jobs_back(farm, nodes):
    """What the runner cannot catch (a callback of its loop that raises SystemExit) must not leave a node whose
    heartbeat renews jobs that nobody runs: the node stops loudly, as when one of its threads dies."""
    node = nodes("a")
    [job_id] = farm.enqueue_python(f"{PYJOBS}:wait_for_cancel")
    wait_for(lambda: job_id in pyjobs.SEEN)

    def interrupt():
        raise SystemExit("interrupted")

    node.runner.loop.call_soon_threadsafe(interrupt)
    assert node.stopped.wait(15), "the node limped on"
    assert node.last_error == "the runner's event loop was interrupted"
    row = farm.job(job_id)
    assert (row["state"], row["owner"], row["attempts"]) == ("queued", None, 0)


def test_a_node_that_exits_in_its_schedule_warm_up_goes_on(farm, nodes):
    """The warm-up imports every active schedule's module on every node: one that exits at import used to stop the
    whole farm."""
    node = nodes("a")
    farm.schedule("argv", JobSpec(executor="python", target="tests.support.exits_on_import:run"), every=3600)
    [job_id] = farm.enqueue_python(f"{PYJOBS}:noop")
    assert ended(farm, job_id)["state"] == "succeeded"
    wait_for(lambda: node.upcoming[0] >= 3)  # heartbeats since the schedule: the warm-up has run
    [after] = farm.enqueue_python(f"{PYJOBS}:noop")
    assert ended(farm, after)["state"] == "succeeded" and not node.stopped.is_set()
