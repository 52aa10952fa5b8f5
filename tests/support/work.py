"""Helpers for the tests of the kinds of work: waiting on a condition, in-process nodes, sample jobs.

`pyjobs` (next to this file) holds the Python callables the nodes run; nodes
started by `Nodes` allow that module, `sh`, `cat`, `printf` and `sleep`.
"""

import contextlib
import subprocess
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import func, select

from queueprocessor.cli import main
from queueprocessor.executors.python import PythonExecutor
from queueprocessor.node.runner import JobRunner
from queueprocessor.rules.clock import SystemClock
from queueprocessor.rules.states import JobState, Outcome
from queueprocessor.store.schema import jobs
from queueprocessor.store.types import ClaimRequest
from tests.support import pyjobs

FAST = dict(period=0.2, heartbeat=0.2)
PYJOBS = "tests.support.pyjobs"
COMMANDS = ("sh", "cat", "printf", "sleep")
ROOT = Path(__file__).resolve().parents[2]


def wait_for(condition, timeout=10.0, interval=0.05):
    """Poll `condition` until it returns something true; return that, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


class Nodes:
    """Starts in-process nodes on a farm; `stop_all()` stops the ones still running (without draining)."""

    def __init__(self, farm, http_base="http://127.0.0.1/", **defaults):
        self.farm = farm
        self.http_base = http_base
        self.defaults = {**FAST, **defaults}
        self.started = []

    def __call__(self, name, capacity=4, **options):
        settings = {"allow_modules": [PYJOBS], "allow_commands": COMMANDS, **self.defaults, **options}
        node = self.farm.node(name=name, capacity=capacity, http_base=self.http_base, clock=SystemClock(), **settings)
        self.started.append(node.start())
        return node

    def stop_all(self):
        for node in self.started:
            if not node.stopped.is_set():
                node.stop(drain=False)


@contextlib.contextmanager
def stubborn_claimed_back(farm, machine: int):
    """A plain function that ignores its stop flag (pyjobs.stubborn, 2 s) claimed by `machine`'s runner, stopped as
    the watchdog stops it when a database freezes while its call goes on, and claimed back by the node's turn after
    the thaw. Yields (runner, job id, the old claim, the new one, submitted); stops the runner on the way out."""
    store = farm._store
    [job_id] = farm.enqueue_python("tests.support.pyjobs:stubborn", [2.0])
    [old] = store.jobs.claim(ClaimRequest(machine, 1, lease=30))
    python = PythonExecutor((PYJOBS,))
    runner = JobRunner(store, machine, {"python": python}, store.ask_time, lambda _job, _outcome: None)
    runner.start()
    try:
        runner.submit(old)
        wait_for(lambda: pyjobs.CALLS)
        runner.stop_job((old.id, old.fence), Outcome.LOST)  # the freeze; the call goes on
        store.runs.renew(machine, [(job_id, old.fence)], lease=-1.0)
        [new] = store.jobs.claim(ClaimRequest(machine, 1, lease=30))  # the node's turn after the thaw
        runner.submit(new)
        yield runner, job_id, old, new
    finally:
        runner.stop()


def runs_per_machine(farm, job_ids=None) -> dict[int, int]:
    counts: dict[int, int] = {}
    for run in farm._store.runs.read(limit=1_000_000):
        if job_ids is None or run["job_id"] in job_ids:
            counts[run["machine_id"]] = counts.get(run["machine_id"], 0) + 1
    return counts


def run_cli(*argv) -> int:
    """Run the `queueprocessor` command in this process; its exit code."""
    try:
        main(list(argv))
    except SystemExit as done:
        return done.code or 0
    return 0


class NodeProcesses:
    """Real `queueprocessor node` processes (run from the repository root so they can import the test jobs);
    `kill_all()` kills what is left."""

    def __init__(self, url, log_dir, timing=FAST):
        """`timing`: the farm's period and heartbeat, as the nodes are told them (FAST unless said)."""
        self.url = url
        self.log_dir = log_dir
        self.timing = timing
        self.procs: dict[str, subprocess.Popen] = {}

    def __call__(self, name, *args, capacity=4):
        log = open(self.log_dir / f"{name}.log", "w")
        command = [
            sys.executable,
            "-m",
            "queueprocessor.cli",
            "--db",
            self.url,
            "node",
            "--name",
            name,
            "--period",
            str(self.timing["period"]),
            "--heartbeat",
            str(self.timing["heartbeat"]),
            "--capacity",
            str(capacity),
            "--allow-module",
            PYJOBS,
            *(a for c in COMMANDS for a in ("--allow-command", c)),
            *args,
        ]
        self.procs[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        log.close()
        return self.procs[name]

    def kill_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


class RunningSampler:
    """Samples, from the database, how many jobs of a queue are running, until stopped: the farm's own count."""

    def __init__(self, farm, queue: str):
        self.counts: list[int] = []
        self._stop = threading.Event()
        count = select(func.count()).select_from(jobs).where(jobs.c.queue == queue, jobs.c.state == JobState.RUNNING)
        self._thread = threading.Thread(target=self._sample, args=(farm, count), name="sampler", daemon=True)

    def _sample(self, farm, count):
        while not self._stop.wait(0.01):
            self.counts.append(farm._store.rows(count)[0][0])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        self._thread.join()
