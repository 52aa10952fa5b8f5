"""Faults: what users of peers complain about, provoked on purpose and counted.

Every scenario runs on a real PostgreSQL server with real `queueprocessor node`
processes that call a real local HTTP service recording every request it gets
(job, attempt, fence, machine, start, end): HTTP jobs, and the jobs of a batch function
(`@job(batch=N)`, tests.support.pyjobs:batch_call) whose call sends one request per job.
The figures come from that record and from the farm's own history (qp_jobs, qp_runs, qp_turns):

- jobs run, and jobs lost: every job that did not end `succeeded` (target 0);
- two live executions of one job at once, as the service saw them (target 0);
- re-runs, each with its cause (a killed machine, a self-stop, a result that
  could not be written...); "lease expired while its machine lived" would be a
  live machine declared dead (target 0);
- time to recover.

The scenarios: a random node SIGKILLed and restarted every few seconds over
thousands of jobs; PostgreSQL restarted mid-run; PostgreSQL frozen (SIGSTOP of
every server process) for longer than the dead timeout; jobs ten times longer
than the lease; a node's wall clock stepped by an hour mid-run; a node cut off
from the database by a TCP proxy; a node partitioned from both the database and
the service (its late writes must be refused by the fence); a node process
frozen for twice its lease (its late results must be refused by the fence); two
processes started with the same machine name. Work that must not outlive its lease
(tests/support/slow_command.py: a command job of 10 s, 4 s in the short form, that holds
one request to the service open while it runs, so the record is the command's run):
nodes SIGKILLed in the middle of their commands; one node process alone frozen past its
lease with its commands under way (many trials); Python jobs that call sys.exit or raise
KeyboardInterrupt among HTTP jobs on one node; bulk retries and cancels racing with
parents and their `after=` children. Then many trials of random shapes
each on a fresh farm of 3-4 nodes running HTTP jobs of 1-30 s: PostgreSQL
frozen, the nodes' links stalled or reset at TCP proxies, PostgreSQL restarted, each
for 2-10 s, where a node may claim back its own stopped jobs. Every node's log is
scanned too: a traceback or an exception nobody retrieved fails the scenario.

The database runs on this machine, so its clock is the harness's: events the
harness causes are stamped with time.time() and compared with database times.

    python bench/faults                    # long form (about 50 minutes), writes the Faults section
                                           # of docs/benchmarks.md
    python bench/faults --quick            # short form (tests/faults/test_faults.py and
                                           # test_work_outlives_lease.py run the same scenarios)
    python bench/faults --only kill freeze
    python bench/faults --only freezes --trials 20 --seed 7
    python bench/faults --only kill-commands lone-freeze sys-exit dependency-races

One module per kind of fault (kills, database, links, freezes, machines, work, trials), the rig they share
(rig.py, on the bench harness), the judging of the service's record and the nodes' logs (judge.py), the report
(report.py) and the command line (__main__.py).
"""

from .database import postgres_freeze, postgres_restart
from .freezes import FREEZE_TRIALS, lone_freeze, stalled_node
from .kills import command_kill_churn, kill_churn
from .links import cut_off, partition
from .machines import clock_step, long_jobs, same_name
from .rig import Outcome
from .trials import FAULT_KINDS, TRIALS, Shape, fault_trials
from .work import dependency_races, sys_exit_jobs

__all__ = [
    "FAULT_KINDS",
    "FREEZE_TRIALS",
    "TRIALS",
    "Outcome",
    "Shape",
    "clock_step",
    "command_kill_churn",
    "cut_off",
    "dependency_races",
    "fault_trials",
    "kill_churn",
    "lone_freeze",
    "long_jobs",
    "partition",
    "postgres_freeze",
    "postgres_restart",
    "same_name",
    "stalled_node",
    "sys_exit_jobs",
]
