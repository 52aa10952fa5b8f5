"""A command never outlives the lease that covers it, whatever becomes of its node (docs/design.md §3).

Each test runs a real command on a real node process: it holds one request open to the recording HTTP target for
seconds, with its job and fence, and the target judges whether two runs of the job were ever at work at once. Its
node is then SIGKILLed (a crash, the OOM killer), SIGSTOPped alone (a debugger, a frozen cgroup), or has its event
loop blocked by an async job while the database is out of reach: in each, the command's process group is gone
before its lease ends, so the machine that takes the job over never works beside it.
"""

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from queueprocessor.executors.command import CommandExecutor
from queueprocessor.farm import Farm
from queueprocessor.node.runner import JobRunner
from queueprocessor.rules.job import JobSpec
from queueprocessor.rules.states import Outcome
from queueprocessor.store.types import ClaimRequest
from tests.support import leashjobs
from tests.support.tcpproxy import TcpProxy
from tests.support.work import NodeProcesses, wait_for

pytestmark = pytest.mark.postgres

TIMING = dict(period=0.5, heartbeat=0.5)  # a lease of 1.5 s; the warden kills 1.375 s after the last renewal
WORK = 4.0  # seconds a command's first run (fence 1) works: long beside the lease, so an outliver meets its successor
GONE_WITHIN = 2.0  # seconds: its group ends at once, or at its deadline; the command itself would work on for WORK
LEASHED = ("--allow-command", sys.executable, "--allow-module", "tests.support.leashjobs")


@pytest.fixture
def farm(pg_url):
    with Farm(pg_url) as the_farm:
        the_farm.settings(**TIMING)
        yield the_farm


@pytest.fixture
def nodes(pg_url, tmp_path):
    started = NodeProcesses(pg_url, tmp_path, timing=TIMING)
    yield started
    started.kill_all()


@pytest.fixture
def work_dir(tmp_path):
    """Where the commands write their pids; whatever of them is left at the end is killed."""
    (work := tmp_path / "work").mkdir()
    yield work
    for pid_file in work.glob("*.pid"):
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


def group_alive(pgid: int) -> bool:
    """Does any process of group `pgid` live (a zombie waiting for its reaper does not)?"""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError):
            continue  # ended while we looked
        if int(group) == pgid and state != "Z":
            return True
    return False


def working(work_dir: Path, fence: int) -> int:
    """The pid (and process group) of the command run under `fence`, once it has started."""
    pid_file = work_dir / f"{fence}.pid"
    wait_for(pid_file.exists, timeout=20)
    return int(pid_file.read_text())


def started_command(farm, nodes, work_dir, http_target, work=WORK) -> tuple[int, int]:
    """A command job working `work` seconds on node a, with node b ready to take it over: (job id, its pid)."""
    [job_id] = farm.enqueue_command(leashjobs.command(http_target.base_url, str(work_dir), work))
    pid = working(work_dir, 1)
    nodes("b", *LEASHED)
    wait_for(lambda: "b" in farm.serving("default"), timeout=20)
    assert group_alive(pid)
    return job_id, pid


def taken_over_alone(farm, job_id, http_target) -> None:
    """The job was run again (fence 2) and succeeded, and its two runs were never at work at once."""
    wait_for(lambda: farm.job(job_id)["state"] == "succeeded", timeout=20)
    assert sorted(r["fence"] for r in http_target.requests("/sleep")) == [1, 2]
    assert http_target.concurrent_overlaps() == []


def test_a_command_dies_with_its_killed_node_before_another_machine_takes_the_job(farm, nodes, work_dir, http_target):
    a = nodes("a", *LEASHED)
    wait_for(lambda: "a" in farm.serving("default"), timeout=20)
    job_id, pid = started_command(farm, nodes, work_dir, http_target)
    a.kill()
    wait_for(lambda: not group_alive(pid), timeout=GONE_WITHIN)  # the warden ends it at once: not WORK later
    taken_over_alone(farm, job_id, http_target)


def test_a_command_dies_before_its_lease_ends_while_its_node_alone_is_frozen(farm, nodes, work_dir, http_target):
    a = nodes("a", *LEASHED)
    wait_for(lambda: "a" in farm.serving("default"), timeout=20)
    job_id, pid = started_command(farm, nodes, work_dir, http_target)
    a.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: not group_alive(pid), timeout=GONE_WITHIN)  # at its deadline, before the lease ends
        taken_over_alone(farm, job_id, http_target)
    finally:
        a.send_signal(signal.SIGCONT)


def test_a_command_is_stopped_in_an_outage_though_an_async_job_blocks_its_nodes_loop(
    farm, pg_server, pg_url, tmp_path, nodes, work_dir, http_target
):
    """While the database answers, the renewals keep a command alive however long the loop is blocked (they reach
    the warden from the heartbeat's thread); once it does not, the watchdog's stop reaches it from its own."""
    proxy = TcpProxy("127.0.0.1", pg_server.port)
    proxy.start()
    through_proxy = NodeProcesses(pg_url.replace(f":{pg_server.port}/", f":{proxy.port}/"), tmp_path, timing=TIMING)
    try:
        through_proxy("a", *LEASHED, "--queues", "default,blocking")
        wait_for(lambda: "a" in farm.serving("blocking"), timeout=20)
        job_id, pid = started_command(farm, nodes, work_dir, http_target, work=3 * WORK)
        marker = tmp_path / "blocked"
        farm.enqueue_python(
            "tests.support.leashjobs:block_loop", {"seconds": 7.0, "marker": str(marker)}, queue="blocking"
        )
        wait_for(marker.exists)
        lease = farm._store.jobs.get(job_id)["lease_until"]
        wait_for(lambda: farm._store.jobs.get(job_id)["lease_until"] > lease + 2.0)  # renewed on, the loop blocked
        assert group_alive(pid)
        proxy.freeze()
        wait_for(lambda: not group_alive(pid), timeout=GONE_WITHIN)
        taken_over_alone(farm, job_id, http_target)
    finally:
        proxy.restore()
        through_proxy.kill_all()
        proxy.stop()


def test_a_timeout_and_a_stop_meeting_record_the_run_only_once_its_command_is_gone(farm, work_dir):
    """A command past its timeout is being stopped (it ignores SIGTERM, so it lives out its grace) when a stop
    comes for it too: that second cancellation used to cut the first stop short, before its SIGKILL, and the run was
    recorded while the command lived on."""
    store = farm._store
    machine = store.machines.register(name="m", host="h", instance="meeting", pid=1, version="0", capacity=1)
    script = (
        f"trap '' TERM; echo $$ > {work_dir}/1.tmp; mv {work_dir}/1.tmp {work_dir}/1.pid; while :; do sleep 0.05; done"
    )
    store.jobs.enqueue(JobSpec(executor="command", target=json.dumps(["sh", "-c", script]), timeout=0.5))
    [job] = store.jobs.claim(ClaimRequest(machine, 1, lease=30.0))
    recorded: list[tuple[str, bool]] = []

    def done(_job, outcome):
        recorded.append((outcome, group_alive(int((work_dir / "1.pid").read_text()))))

    runner = JobRunner(store, machine, {"command": CommandExecutor(("sh",))}, store.ask_time, done)
    runner.start()
    try:
        runner.submit(job)
        working(work_dir, 1)
        context = runner.running[(job.id, job.fence)].context
        wait_for(context.cancelled.is_set, interval=0.005)  # timed out: its stop has begun
        assert runner.stop_job((job.id, job.fence), Outcome.CANCELLED)
        [(outcome, alive)] = wait_for(lambda: list(recorded))
        assert not alive, f"run recorded ({outcome}) while its command still lived"
    finally:
        runner.stop()
