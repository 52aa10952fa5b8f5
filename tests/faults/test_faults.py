"""The fault harness's short form, as tests: each scenario of bench/faults on the suite's real
PostgreSQL server, with real node processes and a real HTTP service, must end with no job lost, no job run
twice at once (a batch function's jobs among them, each judged by the service's record of its own request, see
Rig.batches), no live machine declared dead, no stale result accepted, no password in any log and no error in
a node's log that no user caused (a traceback, an exception nobody retrieved).

The long form with its figures: `python bench/faults` (docs/benchmarks.md, "Faults").
"""

import sys
import threading
import time
from pathlib import Path

import pytest

from queueprocessor.executors import HttpExecutor
from queueprocessor.farm import Farm
from queueprocessor.node.runner import JobRunner
from queueprocessor.store.types import ClaimRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import faults

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def assert_safe(outcome: faults.Outcome, causes: set[str]) -> None:
    """What every fault must leave true, whatever else it did."""
    t = outcome.tally
    assert t["jobs"] > 0
    assert not t["odd"], t["odd"]
    assert t["lost"] == 0, f"jobs lost: {t['lost_ids']}"
    assert t["overlaps"] == 0, "a job ran twice at once"
    assert t["false_deaths"] == 0, "a live machine's job was taken over"
    assert t["stale_completions"] == 0, "a result written under an old fence was accepted"
    assert t["stuck_runs"] == 0, "a run was left 'running'"
    assert t["password_in_logs"] == 0
    assert not t["log_errors"], "a node logged an error no user caused:\n" + "\n".join(t["log_errors"][:20])
    assert set(t["causes"]) <= causes, t["causes"]


KILLED = "its machine was killed"
SELF_STOPPED = "stopped by its own machine (no lease renewal for lease - margin)"


def test_sigkill_churn_loses_nothing_and_hands_work_over_after_the_lease(pg_server):
    outcome = faults.kill_churn(pg_server, quick=True)
    assert_safe(outcome, {KILLED})
    f = outcome.facts
    assert f["kills"] >= 2
    assert outcome.tally["batch_reruns"] > 0, "no kill took a machine amid a batch function's call"
    assert f["takeovers"] >= outcome.tally["reruns"] > 0  # (the singleton's takeovers are counted apart)
    assert f["takeover_max"] < f["lease"] + 3 * f["period"], (
        f"a killed machine's job waited {f['takeover_max']:.1f} s to run elsewhere (lease {f['lease']:g} s): expired "
        "leases must go back to work on the next turn, even when the turn's holder has room for fewer than the dead "
        "machine held, or has just joined"
    )
    assert f["ticks"] and set(f["ticks"]) == {"succeeded"}, f["ticks"]  # every occurrence ran, once
    assert f["singleton_holders"] >= 2, "the singleton's holder was never killed"
    assert f["singleton_gap_max"] < f["lease"] + 3 * f["period"]


def test_postgres_restart_loses_nothing_and_reruns_nothing(pg_server):
    outcome = faults.postgres_restart(pg_server, quick=True)
    assert_safe(outcome, set())
    f = outcome.facts
    assert f["nodes_alive"]
    assert f["checked_in"] <= 2 * f["heartbeat"]
    assert f["resumed"] is not None and f["resumed"] <= 2 * f["heartbeat"]


def test_postgres_freeze_declares_nobody_dead_and_work_resumes_within_two_heartbeats(pg_server):
    outcome = faults.postgres_freeze(pg_server, quick=True)
    assert_safe(outcome, {SELF_STOPPED})
    f = outcome.facts
    assert f["nodes_alive"]
    assert f["wrong_turns"] == 0 and f["turns"] > 0, "a live machine was left out of the turns"
    assert f["checked_in"] <= 2 * f["heartbeat"]
    assert f["first_turn"] is not None and f["first_turn"] <= 2 * f["heartbeat"]
    assert f["resumed"] is not None and f["resumed"] <= 2 * f["heartbeat"]
    assert f["status_dead_for"] <= f["heartbeat"], "the operator's view kept a live machine dead"


def test_jobs_ten_times_the_lease_are_never_rerun(pg_server):
    outcome = faults.long_jobs(pg_server, quick=True)
    assert_safe(outcome, set())
    assert outcome.tally["reruns"] == 0 and outcome.tally["service_repeats"] == 0
    assert outcome.facts["max_requests_per_job"] == 1


def test_wall_clock_steps_leave_turns_and_leases_alone(pg_server):
    outcome = faults.clock_step(pg_server, quick=True)
    assert_safe(outcome, set())
    before, ahead, back = outcome.facts["phases"]
    assert abs(before["offset"]) < 1 and abs(ahead["offset"] + 3600) < 1 and abs(back["offset"]) < 1
    for phase in (before, ahead, back):
        assert phase["turns"] >= 1, phase
        assert phase["wrong_turns"] == 0, phase
        assert phase["late_max"] < outcome.facts["period"] / 2, phase
        assert phase["lost"] == 0, phase


@pytest.mark.parametrize("mode", ["cut", "blackhole"])
def test_cut_off_node_stops_its_jobs_before_its_lease_ends_and_they_run_elsewhere(pg_server, mode):
    outcome = faults.cut_off(pg_server, quick=True, mode=mode)
    assert_safe(outcome, {"its machine was cut off"})
    f = outcome.facts
    assert f["held"] == outcome.tally["reruns"] > 0
    assert f["stopped_after"] < f["lease"]
    assert f["stopped_after"] < f["taken_after"]
    assert f["wrong_turns_after_rejoin"] == 0


def test_partitioned_node_late_writes_are_refused_by_the_fence(pg_server):
    outcome = faults.partition(pg_server, quick=True)
    assert_safe(outcome, {"its machine was partitioned", SELF_STOPPED})
    f = outcome.facts
    assert f["self_stop_after"] is None or f["self_stop_after"] < f["lease"]  # None: all its jobs had ended
    assert f["late_accepted"] == 0
    assert outcome.tally["batch_reruns"] > 0, "the partition took no batch function's job from the node"
    assert f["stragglers"] and set(f["stragglers"]) == {409}


def test_a_node_frozen_past_its_lease_writes_nothing_over_its_successors(pg_server):
    outcome = faults.stalled_node(pg_server, quick=True)
    assert_safe(outcome, {"its machine was frozen (SIGSTOP)"})
    f = outcome.facts
    assert f["alive"], "the node woke and went on"
    assert f["answered"] == f["held"] == outcome.tally["reruns"] > 0  # each job it held ran again elsewhere
    assert f["taken_after"] < f["lease"] + 3 * f["period"]


def test_nodes_that_claim_back_the_jobs_a_database_freeze_stopped_never_run_one_twice_at_once(pg_server):
    """A freeze outlasts the lease, so every node's watchdog stops its jobs; after the thaw a node may
    claim its own stopped jobs back while their stopped runs are still being handed back. Each of those runs must
    stay its own: renewed until it ends, stoppable, and never beside another machine's run of the job. Judged by
    the service's record and the nodes' logs over several trials of a shape that takes that path in most of them
    (bench/faults runs 50 of random shapes)."""
    shape = faults.Shape("freezes", nodes=3, lengths=(4.0,) * 12, lead=1.0, length=3.0, cut=(0, 1, 2))
    outcome = faults.fault_trials(pg_server, quick=True, kind="freezes", shapes=[shape] * 6)
    t, f = outcome.tally, outcome.facts
    evidence = "\n".join(outcome.notes)
    assert f["claimed_back"] > 0, "no node claimed back a job of its own: the trials missed the case"
    assert t["batch_reruns"] > 0, "no batch function's job was stopped by a freeze"
    assert t["overlaps"] == 0, (
        f"{t['overlaps']} pairs of runs of one job on different fences at once, in trials "
        f"{f['failed_trials']} of {f['trials']}:\n{evidence}"
    )
    assert t["lost"] == 0, f"jobs lost (trial:job): {t['lost_ids']}\n{evidence}"
    assert not t["log_errors"], "a node logged an error no user caused:\n" + "\n".join(t["log_errors"][:20])
    assert t["stuck_runs"] == 0 and t["stale_completions"] == 0 and t["password_in_logs"] == 0, t


def test_two_processes_with_one_name_are_two_machines(pg_server):
    outcome = faults.same_name(pg_server, quick=True)
    assert_safe(outcome, set())
    f = outcome.facts
    assert len(set(f["twin_ids"])) == 2
    assert all(n > 0 for n in f["twin_runs"])
    assert f["pause_exit"] == 1
    assert f["pause_says"].startswith("error: 2 machines are named 'twin'") and "give the id" in f["pause_says"]
    assert "Traceback" not in f["pause_says"]


def test_a_job_stopped_before_its_task_first_runs_is_handed_back(pg_url):
    """The freeze scenario found this: the watchdog stopped a job claimed a moment earlier, before its
    asyncio task had run, and the job stayed 'running' (its lease renewed) forever."""
    with Farm(pg_url) as farm:
        [job_id] = farm.enqueue_http("/ok")
        machine = farm._store.machines.register(
            name="m", host="h", instance="i", pid=1, version="0", capacity=1, allow="{}"
        )
        [job] = farm._store.jobs.claim(ClaimRequest(machine, 1, lease=30))
        runner = JobRunner(
            farm._store, machine, {"http": HttpExecutor()}, farm._store.ask_time, lambda _job, _outcome: None
        )
        runner.start()
        try:
            busy = threading.Event()
            runner.loop.call_soon_threadsafe(lambda: (busy.set(), time.sleep(0.3)))
            busy.wait(5)  # the loop is busy: the launch and the stop queue up behind it, in that order
            runner.submit(job)
            assert runner.stop_job((job.id, job.fence), "lost")
            deadline = time.monotonic() + 10
            while runner.count() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert runner.count() == 0
        finally:
            runner.stop()
        record = farm._store.jobs.get(job_id)
        assert (record["state"], record["owner"], record["attempts"]) == ("queued", None, 0)
