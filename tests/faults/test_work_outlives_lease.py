"""No work of a job outlives the lease that covers it, whatever happens to its node (docs/design.md §3): the short
forms of bench/faults's scenarios for work that lives beside the node, on the suite's real PostgreSQL server with
real node processes and a real HTTP service that records every run. A command job here is
tests/support/slow_command.py, which holds one request to the service open while it runs: the service's record is
the command's [start, end] and fence, so "two runs of one job at once" is what the target itself saw.

The long forms, with many trials and their figures: `python bench/faults --only kill-commands lone-freeze
sys-exit dependency-races` (docs/benchmarks.md, "Faults").
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import faults

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def evidence(outcome: faults.Outcome) -> str:
    return "\n".join(outcome.notes)


def assert_clean(outcome: faults.Outcome) -> None:
    """What the user needs after any of these faults: nothing lost, nothing stuck, no error in a node's log."""
    t = outcome.tally
    assert t["lost"] == 0, f"jobs lost: {t['lost_ids']}\n{evidence(outcome)}"
    assert t["stuck_runs"] == 0, f"a run was left 'running'\n{evidence(outcome)}"
    assert t["stale_completions"] == 0, "a result written under an old fence was accepted"
    assert t["password_in_logs"] == 0
    assert not t["log_errors"], "a node logged an error no user caused:\n" + "\n".join(t["log_errors"][:20])


def test_a_node_killed_in_the_middle_of_its_commands_leaves_none_at_work_beside_their_next_run(pg_server):
    """Three nodes run 4 s commands; three times a node is SIGKILLed 0.6-1.6 s into one (a crash, the OOM killer)
    and started again. Its commands must die with it: none may still be at work, as the service saw it, when
    another machine's run of its job starts."""
    outcome = faults.command_kill_churn(pg_server, quick=True)
    f = outcome.facts
    assert f["kills"] == 3 and f["mid_command"] >= 3, "a kill did not land in the middle of a command"
    assert f["taken"], "no killed node's job ran again: the scenario missed its case"
    assert f["twice"] == 0, (
        f"{f['twice']} pairs of runs of one job at once: a killed node's command ran on for up to "
        f"{f['ran_on_max']:.2f} s after its node died, {f['together_max']:.2f} s beside the next run\n"
        f"{evidence(outcome)}"
    )
    assert_clean(outcome)


def test_a_node_frozen_alone_past_its_lease_has_no_command_at_work_once_its_jobs_run_elsewhere(pg_server):
    """One node process alone is SIGSTOPped 0.3-0.8 s into its two 4 s commands for two to three times its lease (a
    debugger, a frozen cgroup, a paused VM), then continued, twice, each on a fresh farm. It cannot stop anything
    while frozen, yet once a peer's run of a job starts, the frozen node's command of that job must be over; and
    the node must wake and go on without an error."""
    outcome = faults.lone_freeze(pg_server, quick=True)
    f = outcome.facts
    assert f["held"] == 2 * f["trials"], "the node was not frozen with its commands under way"
    assert len(f["taken"]) == f["held"], "a frozen node's job did not run elsewhere: the scenario missed its case"
    assert f["twice"] == 0, (
        f"{f['twice']} pairs of runs of one job at once, in {f['twice_trials']} of {f['trials']} trials: the frozen "
        f"node's command was at work {f['together_max']:.2f} s after its job's next run started\n{evidence(outcome)}"
    )
    assert f["alive"], "the frozen node did not live on after it was continued"
    assert_clean(outcome)


def test_jobs_that_call_sys_exit_fail_naming_it_and_their_node_goes_on(pg_server):
    """Python jobs that call sys.exit(3) (sync and async), raise KeyboardInterrupt, or whose module calls sys.exit as
    it is imported, among HTTP jobs on one node: each quitter fails with an error naming what it raised, every other
    job succeeds, the node stays alive and runs the work enqueued after them, and a drain ends."""
    outcome = faults.sys_exit_jobs(pg_server, quick=True)
    f = outcome.facts
    assert not f["stuck"], f"jobs never ended: {f['stuck']}\n{evidence(outcome)}"
    assert not f["wrong"], "jobs did not end as they should:\n" + "\n".join(f["wrong"])
    assert f["alive"], "the node died"
    assert f["drained"] and f["drain_code"] == 0, f"a drain did not end (exit code {f['drain_code']})"
    assert_clean(outcome)


def test_bulk_retries_and_cancels_racing_with_dependencies_never_run_a_child_before_its_parent(pg_server):
    """Parents that fail once, each with a child and a grandchild after it, on three nodes, while bulk cancels and
    bulk retries (`retry --queue default`) race with them, then what is left is retried until nothing is: the
    service must never see a child's request start before its parent's successful request ended, and every job
    must end (none left waiting for ever)."""
    outcome = faults.dependency_races(pg_server, quick=True)
    f = outcome.facts
    assert f["actions"].get("cancel") and f["actions"].get("retry"), f["actions"]
    assert not f["early"], f"{len(f['early'])} children ran before their parent succeeded:\n" + "\n".join(f["early"])
    assert f["waiting"] == 0 and not f["stuck"], f"jobs never ended: {f['left']}\n{evidence(outcome)}"
    assert_clean(outcome)
