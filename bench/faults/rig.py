"""The fault harness's rig: one scenario's farm on the bench harness, the service that records every request, and
the timing and outcome every scenario shares."""

import os
import signal
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from common import ROOT, NodeProcess, farm, query, wait_for

from tests.support.httptarget import HttpTarget

BENCHMARKS = ROOT / "docs" / "benchmarks.md"
SECTION_BEGIN = "<!-- faults:begin (written by bench/faults) -->"
SECTION_END = "<!-- faults:end -->"
SELF_STOP = "stopped: this machine lost its lease"
BATCH_CALL = "tests.support.pyjobs:batch_call"  # a batch function whose jobs call the service (see Rig.batches)
SLOW_COMMAND = ROOT / "tests" / "support" / "slow_command.py"  # a command the service judges (see Rig.commands)
UNRULY = "tests.support.unruly"  # jobs that exit or interrupt, as argparse or click inside a job would
QUITS_ON_IMPORT = "tests.support.exits_on_import"  # a job module that calls sys.exit as it is imported
RECLAIMED = "lease expired"
COMMAND_LENGTH = (4.0, 10.0)  # seconds a command job of these scenarios runs: (short form, long form)


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
    """One scenario's farm (the bench harness's: a fresh database, node processes), the recording service, and what
    the harness did to it."""

    def __init__(self, server, timing: Timing, capacity: int = 4):
        self.server = server
        self.timing = timing
        self.capacity = capacity
        self._harness = ExitStack()
        settings = dict(period=timing.period, heartbeat=timing.heartbeat, misses=timing.misses)
        self.run = self._harness.enter_context(farm(server=server, prefix="faults", settings=settings))
        self.url = self.run.url
        self.farm = self.run.farm
        try:
            self.target = HttpTarget()
        except BaseException:
            self._harness.close()
            raise
        self.nodes: list[NodeProcess] = self.run.nodes
        self.downed: dict[int, tuple[float, str]] = {}  # machine id -> (time, "killed" | "cut off")
        self.logs: dict[str, str] = {}
        self._ids: dict[int, int] = {}  # pid -> machine id

    # -- nodes ------------------------------------------------------------

    def start(self, name: str, url: str | None = None, http_base: str | None = None) -> NodeProcess:
        return self.run.start(
            name,
            url=url,
            http_base=http_base or self.target.base_url,
            capacity=self.capacity,
            allow_module=("tests.support.pyjobs", UNRULY, QUITS_ON_IMPORT),
            allow_command=("true", sys.executable),
        )

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
        self._harness.close()  # the farm closed


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
