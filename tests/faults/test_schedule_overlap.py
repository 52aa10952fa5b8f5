"""A schedule with `overlap="skip"` never runs beside itself, whatever happens to the machine running it
(docs/design.md §6): it recurs every second and each run takes three, so every occurrence but those falling
between two runs must be skipped. Five times in a row, in the middle of a run, the node running it is SIGKILLed
(and started again), or its link to PostgreSQL stalled at a TCP proxy for twice the lease, or PostgreSQL itself
frozen (every server process SIGSTOPped) for twice the lease and a heartbeat: the run is taken over by another
node (or claimed back by the same after the thaw) after its lease, and the occurrences due meanwhile are skipped
too. Judged by what the real HTTP service saw (each run is one request of its own, with its job and
fence, from its start to its end or its caller's hang-up): no two requests of the schedule at once; and the
skipped occurrences are listed by `Farm.schedule_runs` as cancelled, with their reason.

One farm of three real node processes on the suite's PostgreSQL, each node through its own proxy; about 27 s.
"""

import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from common import postgres_pids, wait_for
from faults.judge import tally_of
from faults.rig import QUICK, Rig, signal_all

from tests.support.tcpproxy import TcpProxy

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

NAME = "report"
EVERY = 1.0  # seconds between occurrences
LENGTH = 3.0  # seconds a run takes: three occurrences come due while one runs
FAULTS = ("kill", "freeze", "stall", "kill", "freeze")
NODES = 3
PAUSED = f"schedule {NAME} was removed or paused"  # why the pause at the end cancels what waits


def at_once(requests: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs of requests the service was serving at the same moment (one still open counts until now)."""
    now = time.time()
    ordered = sorted(requests, key=lambda r: r["started"])
    return [
        (a, b)
        for i, a in enumerate(ordered)
        for b in ordered[i + 1 :]
        if b["started"] < (a["ended"] or now) and a["started"] < (b["ended"] or now)
    ]


class Trials:
    """The farm under test: its nodes, each behind a proxy of its own, and the faults struck at it."""

    def __init__(self, rig: Rig, server):
        self.rig, self.server = rig, server
        self.proxies: list[TcpProxy] = []
        self.struck: list[dict] = []  # the runs each fault hit: their request's record and the fault

    def start(self, index: int) -> None:
        """Node `index` through proxy `index` (a new proxy the first time)."""
        if index == len(self.proxies):
            self.proxies.append(TcpProxy("127.0.0.1", self.server.port))
            self.proxies[index].start()
        port = self.proxies[index].port
        self.rig.start(f"sched-{index}", url=self.rig.url.replace(f":{self.server.port}/", f":{port}/"))

    def running(self, since: float) -> dict:
        """A run of the schedule that began after `since` and has been under way for a third of its length."""

        def ripe():
            return next(
                (
                    r
                    for r in self.rig.target.requests()
                    if r["ended"] is None and since < r["started"] < time.time() - LENGTH / 3
                ),
                None,
            )

        return wait_for(ripe, 30, "a run of the schedule under way")

    def strike(self, fault: str, since: float) -> float:
        """`fault` at the node running the schedule, a third of the way into a run that began after `since`; when
        the run it hit began (the next fault strikes a later one: its job's next run, or a later occurrence's)."""
        run = self.running(since)
        node = next(n for n in self.rig.nodes if n.alive() and self.rig.machine_id(n) == run["machine"])
        index = int(node.name.rsplit("-", 1)[1])
        self.struck.append(run | {"fault": fault})
        if fault == "kill":
            self.rig.kill(node)
            self.start(index)
        elif fault == "stall":
            self.proxies[index].freeze()
            time.sleep(2 * self.rig.timing.lease)
            self.proxies[index].restore()
        else:  # the whole database, for every node
            pids = postgres_pids(self.server)
            signal_all(pids, signal.SIGSTOP)
            time.sleep(2 * self.rig.timing.lease + self.rig.timing.heartbeat)
            signal_all(list(reversed(pids)), signal.SIGCONT)
        return run["started"]

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.stop()


def test_a_schedule_that_skips_overlaps_never_runs_twice_at_once_through_kills_stalls_and_freezes(pg_server):
    rig = Rig(pg_server, QUICK)
    trials = Trials(rig, pg_server)
    try:
        for index in range(NODES):
            trials.start(index)
        rig.wait_roster()
        spec = rig.farm.http_spec(f"/sleep/{LENGTH:g}", max_attempts=len(FAULTS) + 2)
        rig.farm.schedule(NAME, spec, every=EVERY, overlap="skip")
        since = 0.0
        for fault in FAULTS:
            since = trials.strike(fault, since)
        over = time.time()
        wait_for(lambda: any(r["started"] > over for r in rig.target.requests()), 30, "a run after the last fault")
        rig.farm.pause_schedule(NAME)
        problem = rig.wait_requests_ended(LENGTH + 10)
        rig.settle(30)
        listed = rig.farm.schedule_runs(NAME, limit=1000)
        jobs = {row["job"] for row in listed}
    finally:
        try:
            rig.close()
        finally:
            trials.close()
    requests = rig.target.requests()
    assert problem is None, problem
    assert {r["job"] for r in requests} <= jobs, "the service saw a request of no occurrence of the schedule"
    both = at_once(requests)
    assert not both, "two runs of the schedule at once: " + "; ".join(
        f"job {a['job']} fence {a['fence']} on machine {a['machine']} [{a['started']:.2f}, {a['ended'] or 0:.2f}] "
        f"beside job {b['job']} fence {b['fence']} on machine {b['machine']} [{b['started']:.2f}, "
        f"{b['ended'] or 0:.2f}]"
        for a, b in both[:5]
    )
    for run in trials.struck:  # each fault hit a run, and that job ran again (taken over or claimed back)
        after = [r for r in requests if r["job"] == run["job"] and r["fence"] > run["fence"]]
        assert after, f"the {run['fault']} of job {run['job']}'s run: the job never ran again"
    cancelled = [row for row in listed if row["outcome"] == "cancelled"]
    skipped = [row for row in cancelled if row["error"].startswith("skipped: overlap=skip, job ")]
    assert {row["error"] for row in cancelled if row not in skipped} <= {PAUSED}, (
        "cancelled, but neither skipped nor paused"
    )
    ran = {row["job"] for row in listed if row["started_at"] is not None}
    assert len(skipped) >= len(ran), f"{len(skipped)} occurrences skipped for {len(ran)} runs of three periods each"
    named = {int(row["error"].split("job ", 1)[1].split()[0]) for row in skipped}  # the run each names
    assert named <= ran, f"skipped for jobs that never ran: {named - ran}"
    tally = tally_of(rig)
    assert tally["lost"] == 0, f"occurrences that never ended: {tally['lost_ids']}"
    assert tally["stuck_runs"] == 0 and tally["stale_completions"] == 0 and tally["password_in_logs"] == 0, tally
    assert not tally["log_errors"], "a node logged an error no user caused:\n" + "\n".join(tally["log_errors"][:20])
