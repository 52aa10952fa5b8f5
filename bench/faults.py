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

    python bench/faults.py                 # long form (about 50 minutes), writes the Faults section
                                           # of docs/benchmarks.md
    python bench/faults.py --quick         # short form (tests/faults/test_faults.py and
                                           # test_work_outlives_lease.py run the same scenarios)
    python bench/faults.py --only kill freeze
    python bench/faults.py --only freezes --trials 20 --seed 7
    python bench/faults.py --only kill-commands lone-freeze sys-exit dependency-races
"""

import argparse
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from common import (
    ROOT,
    NodeProcess,
    fresh_database,
    load_average,
    percentile,
    postgres_pids,
    print_table,
    query,
    start_postgres,
    wait_for,
)
from sqlalchemy.exc import OperationalError

from queueprocessor import singletons
from queueprocessor.farm import Farm
from queueprocessor.rules.clock import SystemClock
from queueprocessor.rules.job import JobSpec
from queueprocessor.rules.search import JobFilter
from tests.support.httptarget import HttpTarget
from tests.support.tcpproxy import TcpProxy

BENCHMARKS = ROOT / "docs" / "benchmarks.md"
SECTION_BEGIN = "<!-- faults:begin (written by bench/faults.py) -->"
SECTION_END = "<!-- faults:end -->"
SELF_STOP = "stopped: this machine lost its lease"
BATCH_CALL = "tests.support.pyjobs:batch_call"  # a batch function whose jobs call the service (see Rig.batches)
SLOW_COMMAND = ROOT / "tests" / "support" / "slow_command.py"  # a command the service judges (see Rig.commands)
UNRULY = "tests.support.unruly"  # jobs that exit or interrupt, as argparse or click inside a job would
QUITS_ON_IMPORT = "tests.support.exits_on_import"  # a job module that calls sys.exit as it is imported
RECLAIMED = "lease expired"
# What no fault may leave in a node's log: these scenarios cause nothing a node should crash or leak an
# exception over, so any such line is an error a user did not cause.
LOG_ERRORS = re.compile(
    r"Traceback|exception was never retrieved|KeyError|Exception in thread|"
    r"Task was destroyed but it is pending| (ERROR|CRITICAL) "
)


@dataclass(frozen=True)
class Timing:
    """Farm-wide timing. The long form uses the product's defaults; the short form halves them."""

    heartbeat: float
    period: float
    misses: int = 3

    @property
    def lease(self) -> float:
        return self.misses * self.heartbeat

    @property
    def join_delay(self) -> float:
        return 1.5 * self.heartbeat


LONG = Timing(heartbeat=1.0, period=1.0)
QUICK = Timing(heartbeat=0.5, period=0.5)


@dataclass
class Outcome:
    """One scenario's figures: the common tally, the time to recover, and its own facts."""

    name: str
    title: str
    tally: dict
    recovery: str
    facts: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class Rig:
    """One scenario's farm: a fresh database, the recording service, node processes, what the harness did."""

    def __init__(self, server, timing: Timing, capacity: int = 4):
        self.server = server
        self.timing = timing
        self.capacity = capacity
        self.url = fresh_database(server, "faults")
        self.target = HttpTarget()
        self.farm = Farm(self.url)
        self.farm.settings(period=timing.period, heartbeat=timing.heartbeat, misses=timing.misses)
        self.nodes: list[NodeProcess] = []
        self.downed: dict[int, tuple[float, str]] = {}  # machine id -> (time, "killed" | "cut off")
        self.logs: dict[str, str] = {}
        self._ids: dict[int, int] = {}  # pid -> machine id

    # -- nodes ------------------------------------------------------------

    def start(self, name: str, url: str | None = None, http_base: str | None = None) -> NodeProcess:
        node = NodeProcess(
            url or self.url,
            name,
            http_base=http_base or self.target.base_url,
            extra=(
                "--capacity",
                str(self.capacity),
                "--allow-module",
                "tests.support.pyjobs",
                "--allow-module",
                UNRULY,
                "--allow-module",
                QUITS_ON_IMPORT,
                "--allow-command",
                "true",
                "--allow-command",
                sys.executable,
            ),
        )
        self.nodes.append(node)
        return node

    def commands(self, count: int, seconds: float, **options) -> list[int]:
        """`count` command jobs (tests/support/slow_command.py, run by this interpreter) that each hold one request
        to the service open for `seconds` with their job's headers: the service's record of it is the command's
        run, judged as an HTTP job's request is. Options as Farm.command_spec."""
        argv = [sys.executable, "-I", str(SLOW_COMMAND), self.target.base_url, f"{seconds:g}"]
        return self.farm.enqueue(self.farm.command_spec(argv, **options), count=count)

    def batches(self, count: int, path: str, base: str | None = None, **options) -> list[int]:
        """`count` jobs of a batch function (tests.support.pyjobs:batch_call, up to 8 a call) that each call the
        service at `path` (through `base`, default the service's own address) with their job's headers: the
        service's record judges them as it judges HTTP jobs (a write/... path is POSTed)."""
        method = "POST" if path.startswith("write/") else "GET"
        spec = {"url": (base or self.target.base_url) + path, "method": method, "body": "{}"}
        return self.farm.enqueue(self.farm.python_spec(BATCH_CALL, spec, **options), count=count)

    def machine_id(self, node: NodeProcess) -> int:
        if node.pid not in self._ids:
            rows = wait_for(
                lambda: query(self.url, "SELECT id FROM qp_machines WHERE pid = :pid", pid=node.pid),
                30,
                f"node {node.name} to register",
            )
            self._ids[node.pid] = rows[0][0]
        return self._ids[node.pid]

    def kill(self, node: NodeProcess) -> float:
        machine = self.machine_id(node)
        node.kill()
        killed = time.time()
        self.downed[machine] = (killed, "killed")
        return killed

    def requests_from(self, machine: int, prefix: str) -> list[dict]:
        return [r for r in self.target.requests(prefix) if r["machine"] == machine]

    def in_flight(self, machine: int, prefix: str = "/") -> list[dict]:
        """The machine's requests the service is still serving."""
        return [r for r in self.requests_from(machine, prefix) if r["ended"] is None]

    def twice(self) -> list[tuple[dict, dict]]:
        """Pairs of requests for one job, on different fences, that the service saw overlap: two runs at once."""
        return [(a, b) for a, b in self.target.concurrent_overlaps() if a["fence"] != b["fence"]]

    def wait_requests_ended(self, timeout: float) -> str | None:
        """Until the service has answered every request (a run nothing tracks any more ends on its own: its end is
        judged too); what was still open at the deadline, or None."""
        try:
            wait_for(lambda: all(r["ended"] for r in self.target.requests()), timeout, "every request to end")
        except TimeoutError as error:
            open_ = [(r["job"], r["fence"], r["machine"]) for r in self.target.requests() if not r["ended"]]
            return f"{error}: still open (job, fence, machine): {open_[:10]}"
        return None

    @contextmanager
    def paused(self, nodes: list[NodeProcess]):
        """Operators' pause on these nodes for the block (out of the turns), then resume; waits for both."""
        ids = [self.machine_id(n) for n in nodes]

        def steer(wish: str, state: str) -> None:
            for machine in ids:
                self.farm._store.machines.wish(machine, wish)
            wait_for(
                lambda: (
                    len(
                        query(
                            self.url, "SELECT id FROM qp_machines WHERE id = ANY(:ids) AND state = :s", ids=ids, s=state
                        )
                    )
                    == len(ids)
                ),
                30,
                f"{len(ids)} machines {state}",
            )

        steer("pause", "paused")
        try:
            yield
        finally:
            steer("resume", "active")

    def live(self) -> list[NodeProcess]:
        return [n for n in self.nodes if n.alive()]

    def wait_roster(self, nodes: list[NodeProcess] | None = None) -> list[int]:
        """Until every given node (default: every live one) is in every roster; their ids, sorted."""
        nodes = nodes or self.live()
        ids = sorted(self.machine_id(n) for n in nodes)
        settle = self.timing.join_delay + 2 * self.timing.heartbeat

        def ready():
            rows = query(
                self.url,
                "SELECT id, joined_at FROM qp_machines WHERE id = ANY(:ids) AND state = 'active'",
                ids=list(ids),
            )
            now = time.time()
            return len(rows) == len(ids) and all(now - joined > settle for _, joined in rows)

        wait_for(ready, 60, f"{len(ids)} machines in the roster")
        return ids

    def settle(self, timeout: float) -> None:
        """Until no job is queued or running."""

        def idle():
            counts = self.farm._store.jobs.counts()
            return counts["queued"] == 0 and counts["running"] == 0

        try:
            wait_for(idle, timeout, "the queue to drain", poll=0.25)
        except TimeoutError as error:
            stuck = query(
                self.url,
                "SELECT j.id, j.state, j.owner, j.lease_until - :now, m.name, m.now_seen "
                "FROM qp_jobs j LEFT JOIN (SELECT id, name, :now - last_seen AS now_seen "
                "FROM qp_machines) m ON m.id = j.owner WHERE j.state IN ('queued', 'running') "
                "LIMIT 10",
                now=time.time(),
            )
            alive = {f"{n.name}#{n.pid}": n.alive() for n in self.nodes}
            tails = "\n".join(f"--- {n.name}#{n.pid}\n" + "\n".join(n.output().splitlines()[-12:]) for n in self.nodes)
            raise TimeoutError(
                f"{error}: {self.farm._store.jobs.counts()}; unfinished (id, state, owner, lease left, "
                f"owner name, owner silent for): {stuck}; nodes alive: {alive}\n{tails}"
            ) from None

    def close(self) -> None:
        """Stop every node (drain), keep their logs for the password check, free the service."""
        for node in self.nodes:
            if node.alive():
                node.process.send_signal(signal.SIGTERM)
        for node in self.nodes:
            node.stop()
            self.logs[f"{node.name}#{node.pid}"] = node.output()
            node.discard_log()
        self.target.stop()
        self.farm.close()

    # -- figures ----------------------------------------------------------

    def tally(self) -> dict:
        """What every scenario reports: from the farm's history and the service's record."""
        jobs = query(self.url, "SELECT id, state, fence FROM qp_jobs WHERE kind <> 'singleton'")
        work = {job for job, _, _ in jobs}  # a singleton runs again and again by design: see its own figures
        batch = {job for (job,) in query(self.url, "SELECT id FROM qp_jobs WHERE target = :t", t=BATCH_CALL)}
        runs = [
            run
            for run in query(
                self.url,
                "SELECT job_id, machine_id, fence, started_at, finished_at, outcome, "
                "error FROM qp_runs ORDER BY job_id, fence",
            )
            if run[0] in work
        ]
        requests = [r for r in self.target.requests() if r["job"] in work]
        answered = {(r["job"], r["fence"]) for r in requests if r["status"] == 200}
        by_job: dict[int, list[tuple]] = {}
        for run in runs:
            by_job.setdefault(run[0], []).append(run)
        causes = Counter()
        stale_completions = 0
        odd = []
        for job_runs in by_job.values():
            for run in job_runs[:-1]:
                cause = self._cause(run, answered)
                causes[cause] += 1
                stale_completions += run[5] == "succeeded"
                if cause in (FALSE_DEATH, UNRECORDED):
                    odd.append(f"job {run[0]} runs {job_runs}; " + " | ".join(self.log_lines(f"job {run[0]} ")))
        per_job = Counter(r["job"] for r in requests)
        lost = sorted(job for job, state, _ in jobs if state not in ("succeeded", "cancelled"))
        cancelled = sum(state == "cancelled" for _, state, _ in jobs)  # an operator's choice, not a loss
        return {
            "jobs": len(jobs) - cancelled,
            "succeeded": len(jobs) - cancelled - len(lost),
            "cancelled": cancelled,
            "lost": len(lost),
            "lost_ids": lost[:20],
            "batch_jobs": len(batch),
            "batch_reruns": sum(len(by_job.get(job, ())) > 1 for job in batch),  # batch jobs the faults hit
            "overlaps": len(self.target.concurrent_overlaps()),
            "reruns": sum(causes.values()),
            "causes": dict(causes),
            "false_deaths": causes.get(FALSE_DEATH, 0),
            "stuck_runs": sum(1 for run in runs if run[5] == "running"),
            "stale_completions": stale_completions,
            "service_repeats": sum(n - 1 for n in per_job.values()),
            "password_in_logs": sum(self.server.password in text for text in self.logs.values()),
            "log_errors": self.log_errors(),
            "odd": odd[:5],
        }

    def log_errors(self) -> list[str]:
        """Every line of a node's log that shows an error no user caused (LOG_ERRORS), named by its node."""
        return [
            f"{name}: {line}"
            for name, text in self.logs.items()
            for line in text.splitlines()
            if LOG_ERRORS.search(line)
        ]

    def log_lines(self, needle: str) -> list[str]:
        return [f"{name}: {line}" for name, text in self.logs.items() for line in text.splitlines() if needle in line]

    def _cause(self, run: tuple, answered: set) -> str:
        job_id, machine, fence, _started, finished, outcome, error = run
        error = error or ""
        if outcome == "lost" and error.startswith(SELF_STOP):
            return "stopped by its own machine (no lease renewal for lease - margin)"
        if outcome == "lost" and error.startswith(RECLAIMED):
            when, how = self.downed.get(machine, (None, None))
            if when is not None and when <= (finished or time.time()):
                return f"its machine was {how}"
            if (job_id, fence) in answered:
                return UNRECORDED
            return FALSE_DEATH
        said = " ".join(URL.sub("<url>", error).split())  # one line, the same for every job of a kind
        return f"{outcome}: {said[:70]}"


FALSE_DEATH = "LEASE EXPIRED WHILE ITS MACHINE LIVED"
URL = re.compile(r"https?://\S+")
UNRECORDED = "finished, but its result was not recorded before its lease expired"


# -- PostgreSQL as a whole ----------------------------------------------------


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def wait_checked_in(rig: Rig, ids: list[int], since: float, timeout: float) -> float:
    """Seconds after `since` until every machine in `ids` has checked in after `since`."""
    wait_for(
        lambda: (
            len(
                query(
                    rig.url,
                    "SELECT id FROM qp_machines WHERE id = ANY(:ids) AND last_seen > :t",
                    ids=list(ids),
                    t=since,
                )
            )
            == len(ids)
        ),
        timeout,
        "every node to check in",
        poll=0.02,
    )
    return time.time() - since


def first_after(rig: Rig, sql: str, since: float) -> float | None:
    value = query(rig.url, sql, t=since)[0][0]
    return None if value is None else value - since


def turns_out_of_turn(rig: Rig, ids: list[int], since: float, until: float) -> tuple[int, int]:
    """(turns taken by a machine other than the slot's owner under the roster of all live machines, turns)."""
    rows = query(
        rig.url, "SELECT slot, machine_id FROM qp_turns WHERE taken_at >= :a AND taken_at < :b", a=since, b=until
    )
    return sum(machine != ids[slot % len(ids)] for slot, machine in rows), len(rows)


def secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


# -- scenarios ----------------------------------------------------------------


def kill_churn(server, quick: bool, seed: int = 5) -> Outcome:
    """A node SIGKILLed every few seconds (at random, or the singleton's holder) and started again under the same
    name, over thousands of HTTP, Python and command jobs, with a schedule ticking every second and a singleton
    always running."""
    timing = QUICK if quick else LONG
    count, every, size = (400, 2.0, 3) if quick else (4000, 3.0, 4)
    rng = random.Random(seed)
    rig = Rig(server, timing)
    try:
        for i in range(size):
            rig.start(f"churn-{i}")
        rig.wait_roster()
        started = time.time()
        rig.farm.schedule("tick", JobSpec("http", "/ok", priority=10), every=1.0)  # ahead of the backlog
        feed = rig.farm.singleton("feed", JobSpec("http", "/sleep/600"))  # continuous work, until removed
        for _ in range(20):  # a batch function's jobs among the others all along
            rig.farm.enqueue_http("/sleep/0.05", count=count // 20)
            # Each kill spends an attempt of every job its machine held (a crash counts, as in Oban or River): a
            # batch function's jobs, half a second a call, are held by one killed machine after another often
            # enough in the long form to use up 3 attempts; what is judged here is loss by the faults themselves.
            rig.batches(count // 80, "sleep/0.5", max_attempts=10)
        rig.farm.enqueue(rig.farm.python_spec("tests.support.pyjobs:noop"), count=count // 10)
        rig.farm.enqueue(rig.farm.command_spec(["true"]), count=count // 10)
        kills = []
        while rig.farm._store.jobs.counts()["queued"] > size * rig.capacity:
            time.sleep(every)
            live = rig.live()
            holder = query(rig.url, "SELECT owner FROM qp_jobs WHERE id = :f", f=feed)[0][0]
            victim = next((n for n in live if rig.machine_id(n) == holder), None) if len(kills) % 2 else None
            # every other kill takes the singleton's holder; the others, a machine amid a batch function's call
            batching = query(rig.url, "SELECT owner FROM qp_jobs WHERE target = :t AND state = 'running'", t=BATCH_CALL)
            victim = victim or rng.choice([n for n in live if (rig.machine_id(n),) in batching] or live)
            machine = rig.machine_id(victim)
            kills.append((machine, rig.kill(victim)))
            rig.start(victim.name)
        # The last kill may have taken the singleton's holder: it is handed over before it is removed.
        live = {rig.machine_id(n) for n in rig.live()}
        wait_for(
            lambda: (runs := [r for r in rig.target.requests() if r["job"] == feed]) and runs[-1]["machine"] in live,
            30,
            "the singleton to run on a live machine",
        )
        churned = time.time()
        rig.farm.remove_schedule("tick")
        singletons.remove(rig.farm._store, "feed")
        rig.settle(120)
        elapsed = time.time() - started
        takeovers = []
        for machine, killed in kills:
            rows = query(
                rig.url,
                "SELECT min(n.started_at) FROM qp_runs o JOIN qp_runs n ON n.job_id = o.job_id "
                "AND n.fence > o.fence WHERE o.machine_id = :m AND o.outcome = 'lost' "
                "GROUP BY o.job_id",
                m=machine,
            )
            takeovers += [start - killed for (start,) in rows]
        ticks = query(
            rig.url,
            "SELECT state, count(*) FROM qp_jobs WHERE key LIKE 'tick@%' AND run_at < :t GROUP BY state",
            t=churned - 2 * timing.period,
        )  # (later ones: cut off by removal)
        feeds = sorted((r for r in rig.target.requests() if r["job"] == feed), key=lambda r: r["started"])
        gaps = [b["started"] - a["ended"] for a, b in zip(feeds, feeds[1:]) if b["started"] < churned]
    finally:
        rig.close()
    tally = rig.tally()
    ticks = dict(ticks)
    return Outcome(
        "kill",
        f"SIGKILL a random node every {every:g} s and restart it ({size} nodes, {count} HTTP jobs, "
        f"{count // 4} jobs of a batch function calling the service, {2 * (count // 10)} Python and command jobs, "
        "a schedule every second, a singleton)",
        tally,
        recovery=(
            f"killed machines' jobs ran elsewhere after median {secs(statistics.median(takeovers))}, "
            f"max {secs(max(takeovers))} (lease {timing.lease:g} s); the singleton was back after at most "
            f"{secs(max(gaps, default=None))}"
            if takeovers
            else "no job was in flight"
        ),
        facts={
            "kills": len(kills),
            "takeovers": len(takeovers),
            "takeover_max": max(takeovers, default=0.0),
            "elapsed": elapsed,
            "lease": timing.lease,
            "period": timing.period,
            "churn": churned - started,
            "ticks": ticks,
            "singleton_runs": len(feeds),
            "singleton_gap_max": max(gaps, default=0.0),
            "singleton_holders": len({r["machine"] for r in feeds}),
        },
        notes=[
            (
                f"schedule every 1 s over {churned - started:.0f} s of churn: {sum(ticks.values())} occurrences, "
                f"{ticks.get('succeeded', 0)} succeeded, each once (unique key); singleton: {len(feeds)} runs on "
                f"{len({r['machine'] for r in feeds})} machines, never two at once, longest gap "
                f"{secs(max(gaps, default=None))}"
            )
        ],
    )


def postgres_restart(server, quick: bool) -> Outcome:
    """PostgreSQL restarted (fast shutdown: every connection cut) while jobs flow."""
    timing = QUICK if quick else LONG
    count = 300 if quick else 2000
    rig = Rig(server, timing)
    try:
        nodes = [rig.start(f"restart-{i}") for i in range(3)]
        ids = rig.wait_roster(nodes)
        rig.farm.enqueue_http("/sleep/0.05", count=count)
        wait_for(lambda: rig.farm._store.jobs.counts()["succeeded"] > count // 4, 60, "work to flow")
        down = time.time()
        server.restart()
        up = time.time()
        checked_in = wait_checked_in(rig, ids, up, 30)
        rig.settle(120)
        resumed = first_after(rig, "SELECT min(started_at) FROM qp_runs WHERE started_at > :t", up)
        alive = all(n.alive() for n in nodes)
    finally:
        rig.close()
    tally = rig.tally()
    return Outcome(
        "restart",
        f"PostgreSQL restarted mid-run (3 nodes, {count} jobs)",
        tally,
        recovery=f"down {secs(up - down)}; every node checked in {secs(checked_in)} and the first job started "
        f"{secs(resumed)} after it was back",
        facts={
            "down": up - down,
            "checked_in": checked_in,
            "resumed": resumed,
            "nodes_alive": alive,
            "heartbeat": timing.heartbeat,
        },
    )


class StatusWatcher:
    """Polls Farm.status() as an operator's screen would, noting every live machine it shows as dead."""

    def __init__(self, url: str, ids: list[int]):
        self.farm = Farm(url)
        self.ids = set(ids)
        self.dead_polls: list[tuple[float, int]] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="faults-status", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            try:
                report = self.farm.status()
            except OperationalError:  # the database is frozen or restarting: that is the point
                continue
            self.polls += 1
            for row in report["machines"]:
                if row["id"] in self.ids and row["status"] == "dead":
                    self.dead_polls.append((time.time(), row["id"]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.farm.close()


def postgres_freeze(server, quick: bool) -> Outcome:
    """Every PostgreSQL process SIGSTOPped for twice the dead timeout, then continued."""
    timing = QUICK if quick else LONG
    count = 300 if quick else 2000
    frozen_for = 2 * timing.lease + timing.heartbeat
    rig = Rig(server, timing)
    watcher = None
    try:
        nodes = [rig.start(f"freeze-{i}") for i in range(3)]
        ids = rig.wait_roster(nodes)
        formed = time.time()  # turns before this were taken under a roster still forming (join delays)
        watcher = StatusWatcher(rig.url, ids)
        rig.farm.enqueue_http(f"/sleep/{2 * timing.lease:g}", count=3)  # in flight across the stall
        rig.farm.enqueue_http("/sleep/0.05", count=count)
        wait_for(lambda: rig.farm._store.jobs.counts()["succeeded"] > count // 5, 60, "work to flow")
        before = time.time()
        pids = postgres_pids(server)
        signal_all(pids, signal.SIGSTOP)
        frozen = time.time()
        time.sleep(frozen_for)
        signal_all(reversed(pids), signal.SIGCONT)
        thawed = time.time()
        checked_in = wait_checked_in(rig, ids, thawed, 30)
        rig.settle(120)
        watcher.stop()
        first_turn = first_after(rig, "SELECT min(taken_at) FROM qp_turns WHERE taken_at > :t", thawed)
        resumed = first_after(rig, "SELECT min(started_at) FROM qp_runs WHERE started_at > :t", thawed)
        wrong_turns, turns = turns_out_of_turn(rig, ids, max(formed, before - 5 * timing.period), time.time())
        shown_dead = [(t, m) for t, m in watcher.dead_polls if t >= thawed]
        alive = all(n.alive() for n in nodes)
    finally:
        if watcher is not None:
            watcher.stop()
        rig.close()
    tally = rig.tally()
    return Outcome(
        "freeze",
        f"PostgreSQL frozen (SIGSTOP) for {frozen_for:g} s, dead timeout {timing.lease:g} s "
        f"(3 nodes, {count + 3} jobs)",
        tally,
        recovery=f"every node checked in {secs(checked_in)}, first turn {secs(first_turn)}, first job "
        f"{secs(resumed)} after the thaw (heartbeat {timing.heartbeat:g} s)",
        facts={
            "frozen_for": thawed - frozen,
            "checked_in": checked_in,
            "first_turn": first_turn,
            "resumed": resumed,
            "wrong_turns": wrong_turns,
            "turns": turns,
            "nodes_alive": alive,
            "status_dead_polls": len(shown_dead),
            "status_polls": watcher.polls,
            "status_dead_for": (max(t for t, _ in shown_dead) - thawed) if shown_dead else 0.0,
            "heartbeat": timing.heartbeat,
        },
    )


def long_jobs(server, quick: bool) -> Outcome:
    """Jobs that run for ten times the lease on live machines."""
    timing = QUICK if quick else LONG
    length = 10 * timing.lease
    rig = Rig(server, timing, capacity=2)
    try:
        for i in range(3):
            rig.start(f"long-{i}")
        rig.wait_roster()
        rig.farm.enqueue_http(f"/sleep/{length:g}", count=6)
        rig.settle(length * 3 + 30)
        requests = Counter(r["job"] for r in rig.target.requests("/sleep"))
    finally:
        rig.close()
    tally = rig.tally()
    return Outcome(
        "long",
        f"jobs of {length:g} s, ten times the {timing.lease:g} s lease (3 nodes, 6 jobs)",
        tally,
        recovery="nothing to recover",
        facts={"length": length, "max_requests_per_job": max(requests.values(), default=0)},
    )


def clock_step(server, quick: bool) -> Outcome:
    """One node's wall clock stepped forward an hour, then back, mid-run (through its injectable clock)."""
    timing = QUICK if quick else LONG
    phase = 8 * timing.period if quick else 20 * timing.period
    rig = Rig(server, timing, capacity=2)
    clock = SystemClock()
    stepped = None
    try:
        for i in range(2):
            rig.start(f"steady-{i}")
        stepped = rig.farm.node(name="stepped", capacity=2, http_base=rig.target.base_url, clock=clock).start()
        ids = rig.wait_roster()
        ids = sorted(ids + [stepped.id])
        wait_for(
            lambda: (
                time.time() - query(rig.url, "SELECT joined_at FROM qp_machines WHERE id = :i", i=stepped.id)[0][0]
                > timing.join_delay + 2 * timing.heartbeat
            ),
            30,
            "the stepped node to join",
        )
        jobs_per_phase = int(phase / timing.period) * 3
        phases = []
        for label, step in (("before", 0.0), ("wall clock +1 h", 3600.0), ("stepped back -1 h", -3600.0)):
            clock.step(step)
            begin = time.time()
            rig.farm.enqueue_http(f"/sleep/{timing.lease:g}", count=jobs_per_phase // 3)
            rig.farm.enqueue_http("/sleep/0.05", count=jobs_per_phase)
            time.sleep(phase)
            end = time.time()
            offset = query(rig.url, "SELECT clock_offset FROM qp_machines WHERE id = :m", m=stepped.id)[0][0]
            phases.append((label, begin, end, offset))
        rig.settle(120)
        rows = []
        for label, begin, end, offset in phases:
            lateness = [
                t - slot * timing.period
                for slot, t in query(
                    rig.url,
                    "SELECT slot, taken_at FROM qp_turns WHERE machine_id = :m AND taken_at >= :a AND taken_at < :b",
                    m=stepped.id,
                    a=begin,
                    b=end,
                )
            ]
            wrong, turns = turns_out_of_turn(rig, ids, begin, end)
            ran = query(
                rig.url,
                "SELECT count(*), sum(CASE WHEN outcome = 'lost' THEN 1 ELSE 0 END) FROM qp_runs "
                "WHERE machine_id = :m AND started_at >= :a AND started_at < :b",
                m=stepped.id,
                a=begin,
                b=end,
            )[0]
            rows.append(
                {
                    "phase": label,
                    "offset": offset,
                    "turns": len(lateness),
                    "wrong_turns": wrong,
                    "farm_turns": turns,
                    "late_max": max(lateness, default=0.0),
                    "runs": ran[0],
                    "lost": ran[1] or 0,
                }
            )
    finally:
        if stepped is not None:
            stepped.stop(drain=False)
        rig.close()
    tally = rig.tally()
    return Outcome(
        "clock",
        "a node's wall clock stepped +1 h then -1 h mid-run (3 nodes, one in-process)",
        tally,
        recovery="nothing to recover: its turns and leases run on database time anchored to its monotonic clock",
        facts={"phases": rows, "period": timing.period},
        notes=[
            f"{r['phase']}: published offset {r['offset']:+.3f} s, {r['turns']} turns by the stepped node, "
            f"latest {r['late_max'] * 1000:.0f} ms into its slot, {r['wrong_turns']} of {r['farm_turns']} farm "
            f"turns out of turn, {r['runs']} runs, {r['lost']} lost"
            for r in rows
        ],
    )


def cut_off(server, quick: bool, mode: str = "cut") -> Outcome:
    """One node's database link cut at a TCP proxy while it runs long jobs: connections reset (`cut`), or
    packets silently dropped (`blackhole`, the harder case: its statements hang instead of failing)."""
    timing = QUICK if quick else LONG
    length = 4 * timing.lease
    rig = Rig(server, timing, capacity=2)
    proxy = TcpProxy("127.0.0.1", server.port)
    proxy.start()
    try:
        victim = rig.start("cut-off", url=rig.url.replace(f":{server.port}/", f":{proxy.port}/"))
        peers = [rig.start(f"peer-{i}") for i in range(2)]
        ids = rig.wait_roster()
        machine = rig.machine_id(victim)
        with rig.paused(peers):  # so that the victim takes the jobs
            rig.farm.enqueue_http(f"/sleep/{length:g}", count=rig.capacity)
            wait_for(lambda: len(rig.requests_from(machine, "/sleep")) == rig.capacity, 30, "the node to be busy")
        held = {r["job"] for r in rig.requests_from(machine, "/sleep")}
        proxy.cut() if mode == "cut" else proxy.freeze()
        cut = time.time()
        rig.downed[machine] = (cut, "cut off")
        wait_for(
            lambda: all(
                any(r["job"] == job and r["machine"] != machine for r in rig.target.requests()) for job in held
            ),
            30,
            "its jobs to run elsewhere",
        )
        time.sleep(timing.lease)
        proxy.restore()
        restored = time.time()
        rejoined = wait_checked_in(rig, [machine], restored, 30)
        rig.settle(length * 4 + 30)
        stopped_after = max(r["ended"] for r in rig.requests_from(machine, "/sleep") if r["job"] in held) - cut
        taken_after = (
            min(r["started"] for r in rig.target.requests("/sleep") if r["job"] in held and r["machine"] != machine)
            - cut
        )
        wrong, _ = turns_out_of_turn(rig, ids, restored + rejoined + timing.join_delay, time.time())
    finally:
        rig.close()
        proxy.stop()
    tally = rig.tally()
    how = "connections reset" if mode == "cut" else "packets dropped, statements hang"
    return Outcome(
        mode,
        f"a node cut off from the database ({how}) while running {length:g} s jobs (3 nodes)",
        tally,
        recovery=f"the cut-off node stopped its {len(held)} jobs {secs(stopped_after)} after the cut (lease "
        f"{timing.lease:g} s); they ran elsewhere {secs(taken_after)} after it; it checked in again "
        f"{secs(rejoined)} after the link came back",
        facts={
            "held": len(held),
            "stopped_after": stopped_after,
            "taken_after": taken_after,
            "rejoined": rejoined,
            "lease": timing.lease,
            "wrong_turns_after_rejoin": wrong,
        },
    )


def partition(server, quick: bool) -> Outcome:
    """One node partitioned from both the database and the service with its writes in flight, then healed:
    the writes it sent before the partition arrive late, after other machines took its jobs over."""
    timing = QUICK if quick else LONG
    count = 300 if quick else 1000
    rig = Rig(server, timing)
    db_proxy = TcpProxy("127.0.0.1", server.port)
    web_proxy = TcpProxy("127.0.0.1", rig.target.port, up_delay=1.0)  # a slow link keeps its writes in flight
    db_proxy.start()
    web_proxy.start()
    try:
        victim = rig.start(
            "partitioned",
            url=rig.url.replace(f":{server.port}/", f":{db_proxy.port}/"),
            http_base=f"http://127.0.0.1:{web_proxy.port}/",
        )
        peers = [rig.start(f"peer-{i}") for i in range(2)]
        rig.wait_roster()
        machine = rig.machine_id(victim)

        def in_flight():
            """The node's running jobs whose write has not reached the service yet."""
            seen = {(r["job"], r["fence"]) for r in rig.requests_from(machine, "/write")}
            return [
                row
                for row in query(
                    rig.url, "SELECT id, fence FROM qp_jobs WHERE owner = :m AND state = 'running'", m=machine
                )
                if tuple(row) not in seen
            ]

        batch_ids: list[int] = []
        with rig.paused(peers):  # the victim does the work until the partition comes; then its peers take over
            for i in range(count):
                rig.farm.enqueue_http(f"/write/report-{i % 10}", method="POST", payload=f'{{"row": {i}}}')
                if i % 4 == 0:  # a batch function's jobs, writing through the same slow link
                    batch_ids += rig.batches(1, f"write/batch-{i % 10}", base=f"http://127.0.0.1:{web_proxy.port}/")
            wait_for(lambda: len(rig.requests_from(machine, "/write")) >= rig.capacity, 60, "the node to write")
            batch = set(batch_ids)
            wait_for(
                lambda: any(job in batch for job, _ in in_flight()),
                30,
                "a write of the node's in flight, a batch function's among them",
                poll=0.01,
            )
            db_proxy.freeze()
            web_proxy.freeze()
            frozen = time.time()
            rig.downed[machine] = (frozen, "partitioned")
        time.sleep(max(0.0, frozen + timing.lease + 4 * timing.period - time.time()))
        db_proxy.restore()
        web_proxy.restore()
        healed = time.time()
        rig.settle(120)
        time.sleep(timing.heartbeat)
        writes = rig.target.requests("/write")
        late = [
            r
            for r in rig.requests_from(machine, "/write")
            if r["started"] >= healed
            and any(o["job"] == r["job"] and o["fence"] > r["fence"] and o["started"] < r["started"] for o in writes)
        ]
        # Whether a write in flight arrives late depends on how its connection closed; a straggler that
        # does arrive is exactly such a request, so each job taken from the node is also sent once more
        # as it sent it, with its fence.
        taken = query(
            rig.url,
            "SELECT job_id, fence FROM qp_runs WHERE machine_id = :m AND outcome = 'lost' "
            "AND error LIKE 'lease expired%'",
            m=machine,
        )
        stragglers = [straggle(rig.target.base_url, job, fence, machine) for job, fence in taken]
        stopped_at = min(log_times(victim, "no contact with the database"), default=None)
        refused = len(log_times(victim, "refused by its fence"))
    finally:
        rig.close()
        db_proxy.stop()
        web_proxy.stop()
    tally = rig.tally()
    late_accepted = sum(bool(r["accepted"]) for r in late)
    return Outcome(
        "partition",
        f"a node partitioned from database and service for {healed - frozen:.1f} s with its writes "
        f"in flight, then healed (3 nodes, {count} POST /write jobs and {len(range(0, count, 4))} of a batch "
        "function writing likewise)",
        tally,
        recovery=f"the partitioned node stopped its jobs {secs(stopped_at and stopped_at - frozen)} into the "
        f"partition (lease {timing.lease:g} s); {len(late)} of its writes to the service arrived after the "
        f"heal with an old fence: {len(late) - late_accepted} refused (409), {late_accepted} accepted; "
        f"{refused} of its results reached the database late and were refused by the fence; "
        f"{len(stragglers)} stragglers replayed: {stragglers.count(409)} refused (409)",
        facts={
            "late_writes": len(late),
            "late_accepted": late_accepted,
            "late_results_refused": refused,
            "stragglers": stragglers,
            "self_stop_after": None if stopped_at is None else stopped_at - frozen,
            "lease": timing.lease,
        },
    )


def stalled_node(server, quick: bool) -> Outcome:
    """One node process frozen (SIGSTOP: a long GC pause, a suspended VM) for twice its lease while the service
    answers its calls: on waking it holds finished work whose leases other machines have taken over since, and
    every result it then tries to write must be refused by the fence."""
    timing = QUICK if quick else LONG
    length = timing.lease / 3  # shorter than the freeze: its calls are answered while it cannot record them
    rig = Rig(server, timing, capacity=3)
    try:
        victim = rig.start("stalled")
        peers = [rig.start(f"peer-{i}") for i in range(2)]
        rig.wait_roster()
        machine = rig.machine_id(victim)
        with rig.paused(peers):  # so that the victim takes the jobs
            rig.farm.enqueue_http(f"/sleep/{length:g}", count=rig.capacity)
            wait_for(lambda: len(rig.requests_from(machine, "/sleep")) == rig.capacity, 30, "the node to be busy")
            victim.process.send_signal(signal.SIGSTOP)
            frozen = time.time()
            rig.downed[machine] = (frozen, "frozen (SIGSTOP)")
        held = {r["job"] for r in rig.requests_from(machine, "/sleep")}
        wait_for(
            lambda: all(
                any(r["job"] == job and r["machine"] != machine and r["ended"] for r in rig.target.requests())
                for job in held
            ),
            60,
            "its jobs to run elsewhere",
        )
        taken_after = (
            max(r["started"] for r in rig.target.requests("/sleep") if r["job"] in held and r["machine"] != machine)
            - frozen
        )
        time.sleep(max(0.0, frozen + 2 * timing.lease - time.time()))
        victim.process.send_signal(signal.SIGCONT)
        woke = time.time()
        rejoined = wait_checked_in(rig, [machine], woke, 30)
        rig.settle(60)
        time.sleep(timing.heartbeat)
        answered = sum(1 for r in rig.requests_from(machine, "/sleep") if r["job"] in held and r["ended"] < woke)
        refused = len(log_times(victim, "refused by its fence"))
        alive = victim.alive()
    finally:
        rig.close()
    tally = rig.tally()
    return Outcome(
        "stall",
        f"a node process frozen (SIGSTOP) for {woke - frozen:.1f} s, twice its lease, with {len(held)} "
        f"jobs of {length:g} s in hand (3 nodes)",
        tally,
        recovery=f"its jobs ran elsewhere {secs(taken_after)} after the freeze (lease {timing.lease:g} s); it "
        f"checked in again {secs(rejoined)} after waking; of its {answered} calls answered while it was "
        f"frozen, {refused} results reached the database and were refused by the fence, the rest "
        f"were stopped by its own watchdog",
        facts={
            "held": len(held),
            "answered": answered,
            "late_results_refused": refused,
            "alive": alive,
            "taken_after": taken_after,
            "lease": timing.lease,
            "period": timing.period,
        },
    )


# -- work that must not outlive its lease: commands of real duration, killed and frozen nodes -----------------------

COMMAND_LENGTH = (4.0, 10.0)  # seconds a command job of these scenarios runs: (short form, long form)


def outlived(rig: Rig, machine: int, since: float, held: list[dict]) -> list[dict]:
    """For each run (a request to the service) `machine` had under way at `since`, its kill or freeze: how long it
    ran on after `since`, when the job's next run started (from `since`), and how long the two were at work at once
    as the service saw them (the record's own clock, so 0 exactly when they never overlapped)."""
    requests = rig.target.requests()
    rows = []
    for run in held:
        mine = next(r for r in requests if (r["job"], r["fence"], r["machine"]) == (run["job"], run["fence"], machine))
        ended = mine["ended"] or time.time()
        later = [r["started"] for r in requests if r["job"] == run["job"] and r["fence"] > run["fence"]]
        taken = min(later, default=None)
        rows.append(
            {
                "job": run["job"],
                "ran_on": ended - since,
                "taken": None if taken is None else taken - since,
                "together": 0.0 if taken is None else max(0.0, ended - taken),
            }
        )
    return rows


def outlived_text(rows: list[dict], what: str) -> str:
    """One sentence of `outlived`'s rows for the report."""
    if not rows:
        return f"no command was under way at the {what}"
    taken = [r["taken"] for r in rows if r["taken"] is not None]
    together = [r["together"] for r in rows if r["together"] > 0]
    return (
        f"{len(rows)} commands under way at the {what} ran on for up to {secs(max(r['ran_on'] for r in rows))} "
        f"after it; their jobs ran again after median {secs(statistics.median(taken) if taken else None)}; "
        f"{len(together)} were still at work when the next run started (up to {secs(max(together, default=None))} "
        "of two runs at once)"
    )


def command_kill_churn(server, quick: bool, seed: int = 7) -> Outcome:
    """Nodes SIGKILLed in the middle of command jobs of real duration (tests/support/slow_command.py, 4 s in the short
    form, 10 s in the long) and started again. Each kill takes a node whose command has been under way for a random
    while (the kill lands mid-command); a killed node's commands must end with it, never run on beside the run
    that takes their job over. Judged by the service's record of each command's run."""
    timing = QUICK if quick else LONG
    length = COMMAND_LENGTH[not quick]
    wanted, size, capacity = (3, 3, 2) if quick else (20, 3, 2)
    rng = random.Random(seed)
    rig = Rig(server, timing, capacity=capacity)
    kills: list[tuple[int, float, list[dict]]] = []  # (machine, killed at, its commands under way)
    stuck = None
    try:
        for i in range(size):
            rig.start(f"cmd-{i}")
        rig.wait_roster()
        started = time.time()
        rig.commands(2 * size * capacity, length, max_attempts=10)
        while len(kills) < wanted:
            lead = rng.uniform(0.15, 0.4) * length  # how far into its command the kill lands

            def mid_command(lead=lead):
                now = time.time()
                busy = [(n, rig.in_flight(rig.machine_id(n))) for n in rig.live()]
                busy = [(n, runs) for n, runs in busy if any(lead <= now - r["started"] < 0.5 * length for r in runs)]
                return rng.choice(busy) if busy else None

            victim, under_way = wait_for(mid_command, 60, "a node in the middle of a command", poll=0.05)
            machine = rig.machine_id(victim)
            kills.append((machine, rig.kill(victim), under_way))
            rig.start(victim.name)
            if rig.farm._store.jobs.counts()["queued"] < size * capacity:
                rig.commands(size * capacity, length, max_attempts=10)
            time.sleep(timing.lease)
        churned = time.time()
        try:
            rig.settle(4 * length + 60)
        except TimeoutError as error:  # a finding, judged below (a job not succeeded is lost), not a crash
            stuck = str(error).splitlines()[0]
        stuck = stuck or rig.wait_requests_ended(length + 30)
        time.sleep(timing.heartbeat)  # what a run's end makes a node log
        elapsed = time.time() - started
        rows = [row for machine, killed, held in kills for row in outlived(rig, machine, killed, held)]
        twice = rig.twice()
    finally:
        rig.close()
    tally = rig.tally()
    evidence = ([stuck] if stuck else []) + (
        trial_evidence(rig, twice, tally, started) if twice or tally["lost"] else []
    )
    return Outcome(
        "kill-commands",
        f"SIGKILL a node in the middle of its {length:g} s commands and restart it, {len(kills)} times "
        f"({size} nodes of {capacity} slots, {tally['jobs']} command jobs)",
        tally,
        recovery=outlived_text(rows, "kill"),
        facts={
            "kills": len(kills),
            "mid_command": len(rows),
            "twice": len(twice),
            "together_max": max((r["together"] for r in rows), default=0.0),
            "ran_on_max": max((r["ran_on"] for r in rows), default=0.0),
            "taken": [r["taken"] for r in rows if r["taken"] is not None],
            "elapsed": elapsed,
            "churn": churned - started,
            "lease": timing.lease,
            "stuck": stuck,
        },
        notes=[f"{len(twice)} pairs of runs of one job at once: " + " | ".join(evidence[:30])] if evidence else [],
    )


FREEZE_TRIALS = (2, 10)  # lone node freezes: (short form, long form)


def lone_freeze(server, quick: bool, trials: int | None = None, seed: int = 11) -> Outcome:
    """One node process alone SIGSTOPped (a debugger, a frozen cgroup, a paused VM) while it runs command jobs of real
    duration, for longer than its lease, then continued; its peers take its jobs over meanwhile. A frozen node can
    stop nothing itself, yet its commands must not be at work once their jobs' next runs start. Many trials, each on
    a fresh farm, of a random lead into the commands and a random freeze; judged by the service's record."""
    timing = QUICK if quick else LONG
    length = COMMAND_LENGTH[not quick]
    rng = random.Random(seed)
    count = trials or FREEZE_TRIALS[not quick]
    results = []
    for number in range(1, count + 1):
        lead = round(rng.uniform(0.08, 0.2) * length, 2)  # the takeover comes well within the command
        frozen_for = round(rng.uniform(2 * timing.lease, 3 * timing.lease), 1)
        began = time.monotonic()
        result = lone_freeze_trial(server, timing, length, lead, frozen_for)
        results.append(result)
        t = result["tally"]
        print(
            f"  lone-freeze {number}/{count} [{length:g} s commands, frozen {lead:g} s in for {frozen_for:g} s]: "
            f"{len(result['twice'])} twice at once, {t['lost']} lost, node alive: {result['alive']}, "
            f"{len(t['log_errors'])} log errors [{time.monotonic() - began:.0f} s]",
            flush=True,
        )
        for line in result["evidence"]:
            print(f"      {line}", flush=True)
    tally = {key: sum(r["tally"][key] for r in results) for key in SUMMED}
    tally.update(
        causes=dict(sum((Counter(r["tally"]["causes"]) for r in results), Counter())),
        lost_ids=[f"{n}:{job}" for n, r in enumerate(results, 1) for job in r["tally"]["lost_ids"]][:20],
        log_errors=[f"trial {n}: {line}" for n, r in enumerate(results, 1) for line in r["tally"]["log_errors"]],
        odd=[],
        overlaps=sum(len(r["twice"]) for r in results),
    )
    rows = [row for r in results for row in r["rows"]]
    failing = [(n, r) for n, r in enumerate(results, 1) if r["evidence"]]
    return Outcome(
        "lone-freeze",
        f"{count} trials: one node process alone frozen (SIGSTOP) for {timing.lease * 2:g}-{timing.lease * 3:g} s, "
        f"lease {timing.lease:g} s, in the first fifth of its {length:g} s commands (3 nodes)",
        tally,
        recovery=outlived_text(rows, "freeze"),
        facts={
            "trials": count,
            "twice": tally["overlaps"],
            "twice_trials": sum(bool(r["twice"]) for r in results),
            "held": len(rows),
            "taken": [r["taken"] for r in rows if r["taken"] is not None],
            "together_max": max((r["together"] for r in rows), default=0.0),
            "alive": all(r["alive"] for r in results),
            "lease": timing.lease,
        },
        notes=[f"trial {n}: " + " | ".join(r["evidence"][:30]) for n, r in failing[:3]],
    )


SUMMED = ("jobs", "succeeded", "cancelled", "lost", "reruns", "false_deaths", "stuck_runs", "stale_completions")
SUMMED += ("service_repeats", "password_in_logs", "batch_jobs", "batch_reruns")


def lone_freeze_trial(server, timing: Timing, length: float, lead: float, frozen_for: float) -> dict:
    """One node takes `capacity` commands of `length` s (its peers paused), is frozen `lead` s into them for
    `frozen_for` s and continued; the farm drains. What the service saw, judged."""
    rig = Rig(server, timing, capacity=2)
    stuck = None
    try:
        victim = rig.start("frozen")
        peers = [rig.start(f"peer-{i}") for i in range(2)]
        rig.wait_roster()
        machine = rig.machine_id(victim)
        with rig.paused(peers):  # so that the victim takes the jobs
            rig.commands(rig.capacity, length, max_attempts=10)
            wait_for(lambda: len(rig.in_flight(machine)) == rig.capacity, 30, "the node's commands to start")
            first = min(r["started"] for r in rig.in_flight(machine))
            time.sleep(max(0.0, first + lead - time.time()))
            held = rig.in_flight(machine)
            victim.process.send_signal(signal.SIGSTOP)
            frozen = time.time()
            rig.downed[machine] = (frozen, "frozen (SIGSTOP)")
        time.sleep(max(0.0, frozen + frozen_for - time.time()))
        victim.process.send_signal(signal.SIGCONT)
        woke = time.time()
        try:
            wait_checked_in(rig, [machine], woke, 30)
            rig.settle(2 * length + 30)
        except TimeoutError as error:  # a finding, judged below, not a crash
            stuck = str(error).splitlines()[0]
        stuck = stuck or rig.wait_requests_ended(length + 30)
        time.sleep(timing.heartbeat)  # what a run's end makes a node log
        alive = victim.alive()
        rows = outlived(rig, machine, frozen, held)
        twice = rig.twice()
    finally:
        rig.close()
    tally = rig.tally()
    failed = twice or tally["lost"] or tally["log_errors"] or tally["stuck_runs"] or not alive or stuck
    evidence = ([stuck] if stuck else []) + (trial_evidence(rig, twice, tally, frozen) if failed else [])
    return {"tally": tally, "twice": twice, "rows": rows, "alive": alive, "evidence": evidence}


# Jobs that end by a BaseException of their own (tests/support/unruly.py, exits_on_import.py): target -> what the
# error that fails each must name.
QUITTERS = {
    f"{UNRULY}:exits": "SystemExit",
    f"{UNRULY}:exits_async": "SystemExit",
    f"{UNRULY}:interrupts": "KeyboardInterrupt",
    f"{QUITS_ON_IMPORT}:run": "SystemExit",
}


def as_it_should(target: str, state: str, error: str | None) -> bool:
    """Whether a job of sys_exit_jobs ended as it should: a quitter failed naming what it raised, any other
    succeeded."""
    if target in QUITTERS:
        return state == "failed" and QUITTERS[target] in (error or "")
    return state == "succeeded"


def sys_exit_jobs(server, quick: bool) -> Outcome:
    """Python jobs that call sys.exit(3) (sync and async), raise KeyboardInterrupt, or whose module calls sys.exit
    as it is imported, mixed with HTTP jobs on one node: every job must end, the quitters failed with an error
    naming what they raised and the others succeeded; then the node, alive, must still claim and run new work, and
    a drain (SIGTERM) must end. The short form sends each quitter once, the long one five times."""
    timing = QUICK if quick else LONG
    rounds = 1 if quick else 5
    rig = Rig(server, timing)
    stuck, drained, drain_code = [], False, None
    try:
        node = rig.start("quits")
        rig.wait_roster()
        started = time.time()
        for _ in range(rounds):
            for target in QUITTERS:
                rig.farm.enqueue_http("/sleep/0.2", count=2)
                rig.farm.enqueue(rig.farm.python_spec(target, max_attempts=1))
        rig.farm.enqueue_http("/sleep/0.2", count=2)
        for phase in ("the quitters and the HTTP jobs among them", "HTTP jobs enqueued after them"):
            if phase.startswith("HTTP"):
                rig.farm.enqueue_http("/ok", count=2 * rig.capacity)
            try:
                rig.settle(15 + 5 * rounds)
            except TimeoutError as error:  # a finding, judged below, not a crash
                stuck.append(f"{phase}: {str(error).splitlines()[0]}")
                break
        alive = node.alive()
        node.process.send_signal(signal.SIGTERM)
        try:
            drain_code = node.process.wait(15)
            drained = True
        except subprocess.TimeoutExpired:
            node.kill()
        jobs = query(rig.url, "SELECT id, target, state, last_error FROM qp_jobs ORDER BY id")
    finally:
        rig.close()
    tally = rig.tally()
    wrong = [
        f"job {job} {target}: {state}, {error!r}"
        for job, target, state, error in jobs
        if not as_it_should(target, state, error)
    ]
    quitters = sum(target in QUITTERS for _, target, _, _ in jobs)
    tally.update(lost=len(wrong), lost_ids=wrong[:20], jobs=len(jobs), succeeded=len(jobs) - len(wrong))
    return Outcome(
        "sys-exit",
        f"{quitters} Python jobs that call sys.exit (sync, async, at import) or raise KeyboardInterrupt among "
        f"{len(jobs) - quitters} HTTP jobs on one node (*jobs run*: jobs that ended as they should, the quitters "
        "failed naming what they raised)",
        tally,
        recovery=(
            f"the node {'stayed alive' if alive else 'died'}; {'every job ended' if not stuck else stuck[0]}; "
            + (f"a drain ended (exit code {drain_code})" if drained else "a drain did not end within 15 s")
        ),
        facts={
            "quitters": quitters,
            "wrong": wrong,
            "stuck": stuck,
            "alive": alive,
            "drained": drained,
            "drain_code": drain_code,
            "elapsed": time.time() - started,
        },
        notes=stuck + wrong[:10],
    )


UNFINISHED = ("waiting", "queued", "running")


def dependency_races(server, quick: bool, seed: int = 13) -> Outcome:
    """Parents that fail once (GET /fails-once/N, one attempt) with children `after=` them and grandchildren after
    those, on three nodes, while bulk cancels (of a random pick of jobs, as the app's selection) and bulk retries
    (`retry --queue default`) are issued at random moments; in the end, failed and cancelled jobs are retried until
    none is left. Judged by the service's record: no child's request before its parent's successful request ended;
    and by the database: nothing waits for ever (every job ends)."""
    timing = QUICK if quick else LONG
    rounds, pairs = (2, 4) if quick else (10, 8)
    rng = random.Random(seed)
    rig = Rig(server, timing)
    actions: Counter = Counter()
    stuck = None
    everyone = JobFilter(queue="default")
    try:
        for i in range(3):
            rig.start(f"deps-{i}")
        rig.wait_roster()
        started = time.time()
        for _ in range(rounds):
            mine = []
            for _ in range(pairs):
                [parent] = rig.farm.enqueue_http(f"/fails-once/{rng.uniform(0.3, 1.5):.2f}", max_attempts=1)
                [child] = rig.farm.enqueue_http("/sleep/0.2", after=[parent])
                mine += [parent, child] + rig.farm.enqueue_http("/sleep/0.1", after=[child])
            for action in rng.sample(["cancel", "retry", "retry"], 3):
                time.sleep(rng.uniform(0.2, 1.5))
                if action == "cancel":
                    rig.farm.cancel_jobs(JobFilter(ids=tuple(rng.sample(mine, len(mine) // 4))))
                else:
                    rig.farm.retry_jobs(everyone)
                actions[action] += 1
        raced = time.time()
        deadline = time.monotonic() + (60 if quick else 180)
        while stuck is None:  # what is left failed or cancelled is retried, as an operator would, until none is
            try:
                rig.settle(max(1.0, deadline - time.monotonic()))
            except TimeoutError as error:  # a finding, judged below, not a crash
                stuck = str(error).splitlines()[0]
                break
            if not rig.farm.retry_jobs(everyone):
                break
            actions["final retry"] += 1
        left = dict(query(rig.url, "SELECT state, count(*) FROM qp_jobs GROUP BY state"))
        stuck = stuck or rig.wait_requests_ended(30)
        edges = query(rig.url, "SELECT parent_id, child_id FROM qp_deps WHERE NOT after_ended")
        time.sleep(timing.heartbeat)  # what a run's end makes a node log
    finally:
        rig.close()
    tally = rig.tally()
    early = too_early(rig.target.requests(), edges)
    waiting = sum(left.get(state, 0) for state in UNFINISHED)
    return Outcome(
        "dependency-races",
        f"{rounds * pairs} parents failing once, each with a child and a grandchild `after=` it, on 3 nodes, "
        f"{actions['cancel']} bulk cancels and {actions['retry']} bulk retries racing with them, "
        f"{actions['final retry']} retries of what was left",
        tally,
        recovery=(
            f"{len(early)} children ran before their parent's success; "
            + (f"{waiting} jobs never ended ({left})" if waiting or stuck else "every job ended")
        ),
        facts={
            "edges": len(edges),
            "early": early,
            "left": left,
            "waiting": waiting,
            "stuck": stuck,
            "actions": dict(actions),
            "cancelled_then_ran": tally["cancelled"],
            "elapsed": raced - started,
        },
        notes=([stuck] if stuck else []) + early[:10],
    )


def too_early(requests: list[dict], edges: list[tuple[int, int]]) -> list[str]:
    """Each child's request that the service saw start before its parent's successful request (200) had ended."""
    succeeded: dict[int, float] = {}
    for r in requests:
        if r["status"] == 200 and r["job"] not in succeeded:
            succeeded[r["job"]] = r["ended"]
    early = []
    for parent, child in edges:
        for r in requests:
            if r["job"] == child and not (parent in succeeded and succeeded[parent] <= r["started"]):
                done = succeeded.get(parent)
                when = "never succeeded" if done is None else f"succeeded {done - r['started']:.2f} s later"
                early.append(f"job {child} (fence {r['fence']}) started; its parent, job {parent}, {when}")
    return early


def straggle(base_url: str, job: int, fence: int, machine: int) -> int:
    """POST a write for `job` as the machine that held it under `fence` did; the service's answer."""
    headers = {"X-QP-Job": str(job), "X-QP-Fence": str(fence), "X-QP-Machine": str(machine)}
    request = urllib.request.Request(f"{base_url}write/straggler", data=b"{}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def log_times(node: NodeProcess, needle: str) -> list[float]:
    """When the node logged lines containing `needle` (each line's local time)."""
    times = []
    for line in node.output().splitlines():
        stamp = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ", line)
        if stamp and needle in line:
            times.append(datetime.strptime(stamp[1], "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return times


def same_name(server, quick: bool) -> Outcome:
    """Two processes started with the same machine name (a copy-pasted service file)."""
    timing = QUICK if quick else LONG
    count = 200 if quick else 1000
    rig = Rig(server, timing)
    try:
        twins = [rig.start("twin"), rig.start("twin")]
        rig.start("other")
        rig.wait_roster()
        rig.farm.enqueue_http("/sleep/0.05", count=count)
        rig.settle(120)
        twin_ids = [rig.machine_id(t) for t in twins]
        turns = dict(query(rig.url, "SELECT machine_id, count(*) FROM qp_turns GROUP BY machine_id"))
        runs = dict(query(rig.url, "SELECT machine_id, count(*) FROM qp_runs GROUP BY machine_id"))
        pause = subprocess.run(
            [sys.executable, "-m", "queueprocessor.cli", "--db", rig.url, "pause", "twin"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            check=False,
        )
    finally:
        rig.close()
    tally = rig.tally()
    tally["password_in_logs"] += server.password in pause.stdout + pause.stderr
    return Outcome(
        "twins",
        f"two processes with the same machine name (3 nodes, {count} jobs)",
        tally,
        recovery="nothing to recover",
        facts={
            "twin_ids": twin_ids,
            "twin_turns": [turns.get(i, 0) for i in twin_ids],
            "twin_runs": [runs.get(i, 0) for i in twin_ids],
            "pause_exit": pause.returncode,
            "pause_says": (pause.stdout + pause.stderr).strip(),
        },
        notes=[
            (
                f"machines {twin_ids[0]} and {twin_ids[1]} both named 'twin' took "
                f"{turns.get(twin_ids[0], 0)} and {turns.get(twin_ids[1], 0)} turns and ran "
                f"{runs.get(twin_ids[0], 0)} and {runs.get(twin_ids[1], 0)} jobs; `queueprocessor pause twin` "
                f"exits {pause.returncode}: {(pause.stdout + pause.stderr).strip()}"
            )
        ],
    )


# -- faults of random shapes, many trials each ------------------------------------------------------------------

FAULT_KINDS = {
    "freezes": "PostgreSQL frozen (SIGSTOP of the postmaster and every backend, then SIGCONT)",
    "stalls": "nodes' links to PostgreSQL stalled at TCP proxies (no byte moves either way, connections left open)",
    "resets": "nodes' links to PostgreSQL cut at TCP proxies (every connection reset, new ones refused)",
    "restarts": "PostgreSQL shut down (fast) and started again",
}
PARTITIONS = ("stalls", "resets")  # the kinds that put a proxy between each node and PostgreSQL
TRIALS = {"freezes": (4, 50), "stalls": (2, 10), "resets": (2, 6), "restarts": (2, 6)}  # (short form, long form)
CAPACITY = 4
FAULT_LENGTH = (2.0, 10.0)  # seconds a fault lasts
JOB_LENGTH = (1.0, 30.0)  # seconds an HTTP job takes


@dataclass(frozen=True)
class Shape:
    """One trial's farm and fault, drawn at random: races hide in shapes no fixed case has (which node holds what
    when the fault strikes, how long it lasts, which jobs end during it)."""

    kind: str  # a key of FAULT_KINDS
    nodes: int
    lengths: tuple[float, ...]  # one job calling GET /sleep/N of each length, seconds: HTTP, every other a batch's
    lead: float  # seconds from the first job's start to the fault
    length: float  # seconds the fault lasts
    cut: tuple[int, ...]  # the nodes (indexes) whose links fail: every node except in some partitions

    def __str__(self) -> str:
        cut = "all" if len(self.cut) == self.nodes else ",".join(map(str, self.cut))
        return (
            f"{self.nodes} nodes, {len(self.lengths)} jobs of {min(self.lengths):g}-{max(self.lengths):g} s, "
            f"fault of {self.length:g} s at {self.lead:g} s, nodes cut: {cut}"
        )


def random_shape(rng: random.Random, kind: str) -> Shape:
    """3-4 nodes, up to as many jobs as they have room for, all of one trial's jobs within a factor of 3 of each
    other and that top length log-uniform in JOB_LENGTH (short jobs as often as long ones: a trial lasts about as
    long as its longest job), a fault of FAULT_LENGTH while they run; half the partitions cut only some nodes."""
    nodes = rng.choice((3, 4))
    top = math.exp(rng.uniform(*map(math.log, JOB_LENGTH)))
    lengths = tuple(
        round(rng.uniform(max(JOB_LENGTH[0], top / 3), top), 1) for _ in range(rng.randint(nodes, nodes * CAPACITY))
    )
    cut = tuple(range(nodes))
    if kind in PARTITIONS and rng.random() < 0.5:
        cut = tuple(sorted(rng.sample(cut, rng.randint(1, nodes - 1))))
    return Shape(
        kind,
        nodes,
        lengths,
        lead=round(rng.uniform(0.2, min(lengths) + 0.5), 2),
        length=round(rng.uniform(*FAULT_LENGTH), 1),
        cut=cut,
    )


@dataclass
class Trial:
    """What the service saw in one trial, judged."""

    shape: Shape
    tally: dict
    twice: list[tuple[dict, dict]]  # pairs of requests for one job on different fences that overlapped in time
    takeovers: list[float]  # per job the fault stopped: seconds from the fault's end to its next run's start
    claimed_back: int  # of those, next run on the machine whose run was stopped
    evidence: list[str]

    @property
    def failed(self) -> bool:
        return bool(
            self.twice
            or self.tally["lost"]
            or self.tally["log_errors"]
            or self.tally["stuck_runs"]
            or self.tally["stale_completions"]
        )


def strike(server, shape: Shape, proxies: list[TcpProxy]):
    """Begin the fault; return what ends it."""
    if shape.kind == "freezes":
        pids = postgres_pids(server)
        signal_all(pids, signal.SIGSTOP)
        return lambda: signal_all(reversed(pids), signal.SIGCONT)
    if shape.kind == "restarts":
        server.halt("fast")
        return server.restart  # pg_ctl starts a server that is not running
    failing = [proxies[i] for i in shape.cut]
    for proxy in failing:
        proxy.freeze() if shape.kind == "stalls" else proxy.cut()
    return lambda: [proxy.restore() for proxy in failing]


def fault_trial(server, shape: Shape, timing: Timing) -> Trial:
    """A fresh farm runs the shape's jobs, the fault strikes, then the farm drains; judged by the service's record
    and the nodes' logs."""
    rig = Rig(server, timing, capacity=CAPACITY)
    proxies = [TcpProxy("127.0.0.1", server.port) for _ in range(shape.nodes if shape.kind in PARTITIONS else 0)]
    try:
        for i in range(shape.nodes):
            url = None
            if proxies:
                url = rig.url.replace(f":{server.port}/", f":{proxies[i].start()}/")
            rig.start(f"{shape.kind}-{i}", url=url)
        rig.wait_roster()
        ids = [rig.machine_id(node) for node in rig.nodes]
        for number, length in enumerate(shape.lengths):
            if number % 2:  # every other job is a batch function's (see Rig.batches)
                rig.batches(1, f"sleep/{length:g}", timeout=120)
            else:
                rig.farm.enqueue_http(f"/sleep/{length:g}", timeout=120)
        wait_for(lambda: len({r["job"] for r in rig.target.requests()}) == len(shape.lengths), 30, "every job to start")
        first = min(r["started"] for r in rig.target.requests())
        time.sleep(max(0.0, first + shape.lead - time.time()))
        began = time.time()
        for i in shape.cut:
            rig.downed[ids[i]] = (began, f"cut off by the fault ({shape.kind})")
        end = strike(server, shape, proxies)
        time.sleep(max(0.0, began + shape.length - time.time()))
        end()
        ended = time.time()
        stuck = None
        try:  # every job runs again at most once more from the fault's end, plus a take-over
            rig.settle(2 * max(shape.lengths) + 30)
            # A run nothing tracks any more ends on its own: wait for it, so that its end is judged too.
            wait_for(
                lambda: all(r["ended"] for r in rig.target.requests()),
                max(shape.lengths) + 30,
                "every request to the service to end",
            )
        except TimeoutError as error:  # a finding, judged below (a job not succeeded is lost), not a crash
            stuck = str(error).splitlines()[0]
        time.sleep(timing.heartbeat)  # what a run's end makes a node log (a refused result, an error)
    finally:
        rig.close()
        for proxy in proxies:
            proxy.stop()
    tally = rig.tally()
    requests = rig.target.requests()
    twice = rig.twice()
    takeovers, claimed_back = [], 0
    for job in {r["job"] for r in requests}:
        runs = sorted((r for r in requests if r["job"] == job), key=lambda r: r["started"])
        stopped = next(
            (i for i, r in enumerate(runs) if r["started"] < ended and r["ended"] > began and r["status"] != 200), None
        )
        if stopped is not None and stopped + 1 < len(runs):
            takeovers.append(runs[stopped + 1]["started"] - ended)
            claimed_back += runs[stopped + 1]["machine"] == runs[stopped]["machine"]
    evidence = ([stuck] if stuck else []) + trial_evidence(rig, twice, tally, began)
    return Trial(shape, tally, twice, takeovers, claimed_back, evidence)


def trial_evidence(rig: Rig, twice: list[tuple[dict, dict]], tally: dict, began: float) -> list[str]:
    """For a trial that failed: the service's rows of each job run twice at once or lost (times from the fault's
    start), what the nodes logged about those jobs, and every error line in their logs."""
    jobs = sorted({a["job"] for a, _ in twice} | set(tally["lost_ids"]))[:3]
    lines = []
    for job in jobs:
        for r in sorted((r for r in rig.target.requests() if r["job"] == job), key=lambda r: r["started"]):
            end = "-" if r["ended"] is None else f"{r['ended'] - began:+.2f}"
            lines.append(
                f"service: job {job} attempt {r['attempt']} fence {r['fence']} machine {r['machine']} "
                f"{r['started'] - began:+.2f} .. {end} s, HTTP {r['status']}"
            )
        lines += rig.log_lines(f"job {job} ")[:12]
    return lines + tally["log_errors"][:12]


def fault_trials(
    server, quick: bool, kind: str, trials: int | None = None, seed: int = 24, shapes: list[Shape] | None = None
) -> Outcome:
    """`trials` faults of `kind`, each of a random shape (or the given `shapes`), each on a fresh farm (a fresh
    database on the one server). The long form uses the short form's timing too (lease 1.5 s): every fault of 2 s
    or more outlasts that lease, and a trial takes about 5 s beside its fault and its longest job (about 26 s in
    all: the long form's 72 trials took 31 minutes)."""
    rng = random.Random(f"{seed}-{kind}")
    count = trials or TRIALS[kind][not quick]
    shapes = shapes or [random_shape(rng, kind) for _ in range(count)]
    results = []
    for number, shape in enumerate(shapes, 1):
        began = time.monotonic()
        trial = fault_trial(server, shape, QUICK)
        results.append(trial)
        t = trial.tally
        print(
            f"  {kind} {number}/{len(shapes)} [{shape}]: {len(trial.twice)} twice at once, {t['lost']} lost, "
            f"{t['service_repeats']} re-runs ({trial.claimed_back} claimed back by their machine), "
            f"{len(t['log_errors'])} log errors [{time.monotonic() - began:.0f} s]",
            flush=True,
        )
        for line in trial.evidence if trial.failed else []:
            print(f"      {line}", flush=True)
    return summarise(kind, results)


def summarise(kind: str, results: list[Trial]) -> Outcome:
    """One outcome for every trial of a kind: their tallies added up, the take-overs pooled."""
    tally = {
        "jobs": 0,
        "succeeded": 0,
        "cancelled": 0,
        "lost": 0,
        "overlaps": 0,
        "reruns": 0,
        "false_deaths": 0,
        "stuck_runs": 0,
        "stale_completions": 0,
        "service_repeats": 0,
        "password_in_logs": 0,
        "batch_jobs": 0,
        "batch_reruns": 0,
    }
    causes, lost_ids, log_errors, odd = Counter(), [], [], []
    for number, trial in enumerate(results, 1):
        for key in tally:
            tally[key] += trial.tally[key]
        causes.update(trial.tally["causes"])
        lost_ids += [f"{number}:{job}" for job in trial.tally["lost_ids"]]
        log_errors += [f"trial {number}: {line}" for line in trial.tally["log_errors"]]
    twice = sum(len(t.twice) for t in results)
    tally.update(
        causes=dict(causes),
        lost_ids=lost_ids[:20],
        log_errors=log_errors,
        odd=odd,
        same_fence_overlaps=tally["overlaps"] - twice,
        overlaps=twice,
    )
    takeovers = sorted(x for t in results for x in t.takeovers)
    failing = [(n, t) for n, t in enumerate(results, 1) if t.failed]
    shapes = [t.shape for t in results]
    stopped = len(takeovers)
    return Outcome(
        kind,
        (
            f"{len(results)} trials: {FAULT_KINDS[kind]} for {min(s.length for s in shapes):g}-"
            f"{max(s.length for s in shapes):g} s, {min(s.nodes for s in shapes)}-{max(s.nodes for s in shapes)} "
            f"nodes, jobs of {min(min(s.lengths) for s in shapes):g}-{max(max(s.lengths) for s in shapes):g} s"
        ),
        tally,
        recovery=(
            f"{stopped} runs stopped by the faults ran again {secs(statistics.median(takeovers))} (median), "
            f"max {secs(takeovers[-1])} after the fault ended ({sum(t.claimed_back for t in results)} on "
            f"the machine that had been stopped)"
            if takeovers
            else "no run was stopped"
        ),
        facts={
            "trials": len(results),
            "twice": twice,
            "twice_trials": sum(bool(t.twice) for t in results),
            "failed_trials": [n for n, _ in failing],
            "takeovers": takeovers,
            "claimed_back": sum(t.claimed_back for t in results),
            "reruns_per_fault": tally["service_repeats"] / len(results),
        },
        notes=[f"trial {n} [{t.shape}]: " + " | ".join(t.evidence[:40]) for n, t in failing[:3]],
    )


SCENARIOS = {
    "kill": kill_churn,
    "restart": postgres_restart,
    "freeze": postgres_freeze,
    "long": long_jobs,
    "clock": clock_step,
    "cut": cut_off,
    "blackhole": lambda server, quick: cut_off(server, quick, mode="blackhole"),
    "partition": partition,
    "stall": stalled_node,
    "twins": same_name,
    "kill-commands": command_kill_churn,
    "lone-freeze": lone_freeze,
    "sys-exit": sys_exit_jobs,
    "dependency-races": dependency_races,
    **{kind: lambda server, quick, kind=kind: fault_trials(server, quick, kind) for kind in FAULT_KINDS},
}


# -- report -------------------------------------------------------------------


def causes_text(causes: dict) -> str:
    return "; ".join(f"{n} {cause}" for cause, n in sorted(causes.items(), key=lambda kv: -kv[1])) or "-"


# What these scenarios found in the core, and the fixes (the short form would fail again without them).
FOUND = [
    "PostgreSQL freeze: a job the watchdog stopped before its asyncio task first ran stayed 'running', its lease "
    "renewed forever (a job stuck in processing); the queue never drained. Fixed in 8d9b459 (runner.py).",
    "Black-holed database link: the watchdog ran on the turn thread, so a turn stuck on a dead connection kept a "
    "cut-off node running its jobs 3.2 s into a 1.5 s lease: 2 jobs ran twice at once. Fixed in 32fbb91 "
    "(node.py: a watchdog thread of its own).",
    "PostgreSQL restart: a result that could not be written during a 0.3 s restart was given up, so the lease "
    "expired and 7 of 300 finished jobs ran again elsewhere. Fixed in 5f782b1 (runner.py: retry the write).",
    "PostgreSQL freeze: a claim the frozen database held up took, when it thawed, leases that had run out during "
    "the stall, from a live machine; and after the thaw the watchdog stopped jobs claimed a moment earlier. Fixed "
    "in 4de41b6 (store.py, node.py, runner.py).",
    "SIGKILL churn under a backlog: killed machines' jobs waited up to 48 s (lease 3 s) for a turn whose holder "
    "had room, as expired leases were taken back by a turn's claim only. Fixed in 70c4b58 (a full turn-holder "
    "still puts expired leases back in the queue).",
    "PostgreSQL freezes, stalled links and restarts of 2-10 s: on 9718429 a node claimed back (new fence) a job whose "
    "stopped run it was still handing back; the runner kept runs by job id, so the old run's end removed the new "
    "one, which was then neither renewed nor stoppable: its lease ran out and the job ran twice at once (on another "
    "machine, or beside a third run on the same one), and the result writer died of a KeyError, leaving jobs "
    "'running' for ever. On 9718429: twice at once in 1 of 10 random freezes, 2 of 10 stalls (and a job failed for "
    "good), 2 of 10 restarts; tests/test_faults.py's freeze failed 14 of 18 trials (10 or 11 pairs twice at once in "
    "each run of 6). Fixed in 1784ea0 (runner.py, node.py, store.py: each run held under its job and fence).",
]


def takeover_text(takeovers: list[float] | None) -> str:
    if not takeovers:
        return "-"
    return f"{percentile(takeovers, 50):.2f} / {max(takeovers):.2f} s"


OUTLIVES = ("kill-commands", "lone-freeze", "sys-exit", "dependency-races")  # work that must not outlive its lease


def outlives_failed(o: Outcome) -> bool:
    """Whether a scenario of OUTLIVES found what it hunts: two runs at once, a job lost or never ended, a child
    before its parent, an error in a log, a node that died or would not drain."""
    t, f = o.tally, o.facts
    return bool(
        t["overlaps"]
        or t["lost"]
        or t["log_errors"]
        or f.get("stuck")
        or f.get("early")
        or f.get("waiting")
        or f.get("alive") is False
        or f.get("drained") is False
    )


def outlives_extra(o: Outcome) -> list[str]:
    """The figures of a scenario of OUTLIVES for its line under the table."""
    f = o.facts
    if o.name == "kill-commands":
        return [f"{f['kills']} kills, {f['mid_command']} commands under way at them, {f['twice']} pairs at once"]
    if o.name == "lone-freeze":
        return [f"twice at once in {f['twice_trials']} of {f['trials']} trials; the frozen node lived on: {f['alive']}"]
    if o.name == "sys-exit":
        return [f"node alive: {f['alive']}; drain ended: {f['drained']} (exit code {f['drain_code']})"]
    if o.name == "dependency-races":
        return [
            f"{len(f['early'])} child runs started before their parent's success, over {f['edges']} `after=` links; "
            f"bulk actions: {causes_text(f['actions'])}; jobs left unfinished: {f['waiting']}"
        ]
    return []


def render(outcomes: list[Outcome], command: str) -> str:
    lines = [
        "## Faults",
        "",
        SECTION_BEGIN,
        (
            f"`{command}` on {load_average()}, {datetime.now():%Y-%m-%d}. Real PostgreSQL 15, real node processes, "
            "a real HTTP service recording every request. *Lost*: jobs that did not end succeeded. *Twice at once*: "
            "pairs of requests for one job that the service saw overlap (in the many-trial rows: on different fences). "
            '*Re-runs*: runs of a job after its first, by cause; "lease expired while its machine lived" would be a '
            "live machine declared dead. The rows of many trials run each trial on a fresh farm and use the "
            f"short form's timing (heartbeat {QUICK.heartbeat:g} s, lease {QUICK.lease:g} s), so that every fault of "
            "2 s or more outlasts the lease and the whole long form stays under an hour. *Error lines*: lines of "
            "a node's log with a traceback, an exception nobody retrieved or an ERROR (target 0)."
        ),
        "",
        "| scenario | jobs run | lost | twice at once | re-runs (cause) | time to recover |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        t = o.tally
        lines.append(
            f"| {o.title} | {t['succeeded']} / {t['jobs']} | {t['lost']} | {t['overlaps']} | "
            f"{t['reruns']} ({causes_text(t['causes'])}) | {o.recovery} |"
        )
    lines.append("")
    for o in outcomes:
        extra = [
            f"stale completions accepted: {o.tally['stale_completions']}",
            f"runs left 'running': {o.tally['stuck_runs']}",
            f"password in node logs: {o.tally['password_in_logs']}",
            f"error lines in node logs: {len(o.tally['log_errors'])}",
        ]
        if o.name == "freeze":
            f = o.facts
            extra += [
                f"turns out of turn (a live machine skipped): {f['wrong_turns']} of {f['turns']}",
                (
                    f"live machines shown dead by `status` after the thaw: {f['status_dead_polls']} of "
                    f"{f['status_polls']} polls, for {f['status_dead_for']:.2f} s"
                ),
            ]
        if o.name in FAULT_KINDS:
            f = o.facts
            takeovers = f["takeovers"]
            extra += [
                f"twice at once in {f['twice_trials']} of {f['trials']} trials",
                f"re-runs per fault {f['reruns_per_fault']:.2f} (the service's count)",
                (
                    f"{len(takeovers)} stopped runs ran again after the fault's end: median "
                    f"{secs(percentile(takeovers, 50))}, 90th percentile {secs(percentile(takeovers, 90))}, max "
                    f"{secs(takeovers[-1])} (negative: during the fault, on a machine it did not cut off); "
                    f"{f['claimed_back']} on the machine that had been stopped"
                )
                if takeovers
                else "no stopped run ran again",
            ]
        extra += outlives_extra(o)
        lines.append(f"- **{o.name}**: " + "; ".join(extra + o.notes) + ".")
    for o in outcomes:
        if o.name in OUTLIVES and outlives_failed(o):
            lines += ["", f"**Open** ({o.name}): {o.recovery}."]
    for o in outcomes:
        if o.name == "kill" and o.facts["takeover_max"] > o.facts["lease"] + 3 * o.facts["period"]:
            lines += [
                "",
                (
                    f"**Open**: under a backlog, a killed machine's jobs waited up to "
                    f"{o.facts['takeover_max']:.0f} s (lease {o.facts['lease']:g} s) to run elsewhere: expired "
                    "leases are taken back by a turn's claim only, and the holder of a turn has no room when "
                    "every node is busy. DESIGN 3 wants them back in the queue on the next turn."
                ),
            ]
    lines += ["", "Found by these scenarios and fixed:", ""] + [f"- {found}" for found in FOUND]
    lines += ["", SECTION_END]
    return "\n".join(lines) + "\n"


def write_section(text: str) -> None:
    """Replace only the Faults section of docs/benchmarks.md (other sections belong to other benchmarks)."""
    BENCHMARKS.parent.mkdir(exist_ok=True)
    old = BENCHMARKS.read_text() if BENCHMARKS.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(SECTION_BEGIN) + r".*?" + re.escape(SECTION_END) + r"\n", re.DOTALL)
    if pattern.search(old):  # the marked block only: the section's heading and the prose above it are kept
        new = pattern.sub(lambda _: text[text.index(SECTION_BEGIN) :], old)
    else:
        new = old.rstrip("\n") + "\n\n" + text
    BENCHMARKS.write_text(new)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short form, about two minutes")
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), help="run only these scenarios")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    parser.add_argument(
        "--trials",
        type=int,
        help=f"trials of each of {', '.join(FAULT_KINDS)} and lone-freeze (default: "
        f"{', '.join(f'{k} {v[1]}' for k, v in TRIALS.items())}, lone-freeze {FREEZE_TRIALS[1]}; short "
        f"form {', '.join(str(v[0]) for v in TRIALS.values())}, {FREEZE_TRIALS[0]})",
    )
    parser.add_argument("--seed", type=int, default=24, help="draws the trials' shapes")
    args = parser.parse_args()
    names = args.only or list(SCENARIOS)
    print(f"faults ({'short' if args.quick else 'long'} form): {', '.join(names)}; {load_average()}", flush=True)
    server = start_postgres()
    outcomes = []
    try:
        for name in names:
            began = time.monotonic()
            if name in FAULT_KINDS:
                outcome = fault_trials(server, args.quick, name, trials=args.trials, seed=args.seed)
            elif name == "lone-freeze":
                outcome = lone_freeze(server, args.quick, trials=args.trials)
            else:
                outcome = SCENARIOS[name](server, args.quick)
            outcomes.append(outcome)
            t = outcome.tally
            print(
                f"{name}: {t['succeeded']}/{t['jobs']} run, {t['lost']} lost, {t['overlaps']} twice at once, "
                f"{t['reruns']} re-runs ({causes_text(t['causes'])}), {len(t['log_errors'])} log errors; "
                f"{t['batch_jobs']} batch-function jobs, {t['batch_reruns']} of them run again; {outcome.recovery} "
                f"[{time.monotonic() - began:.0f} s]",
                flush=True,
            )
            for note in outcome.notes:
                print(f"    {note}", flush=True)
    finally:
        server.stop()
    print()
    print_table(
        [
            "scenario",
            "trials",
            "run",
            "lost",
            "twice",
            "re-runs",
            "service re-runs/fault",
            "false deaths",
            "stale completions",
            "stuck",
            "password",
            "log errors",
            "take-over median/max",
        ],
        [
            [
                o.name,
                o.facts.get("trials", 1),
                f"{o.tally['succeeded']}/{o.tally['jobs']}",
                o.tally["lost"],
                o.tally["overlaps"],
                o.tally["reruns"],
                f"{o.facts['reruns_per_fault']:.2f}" if o.name in FAULT_KINDS else "-",
                o.tally["false_deaths"],
                o.tally["stale_completions"],
                o.tally["stuck_runs"],
                o.tally["password_in_logs"],
                len(o.tally["log_errors"]),
                takeover_text(o.facts["takeovers"]) if o.name in FAULT_KINDS else "-",
            ]
            for o in outcomes
        ],
    )
    if not args.quick and not args.only and not args.no_write:
        write_section(render(outcomes, "python bench/faults.py"))
        print(f"\nwrote the Faults section of {BENCHMARKS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
