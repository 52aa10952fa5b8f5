"""Faults of random shapes, many trials each on a fresh farm: PostgreSQL frozen or restarted, the nodes' links
stalled or reset at TCP proxies."""

import math
import random
import signal
import statistics
import time
from collections import Counter
from dataclasses import dataclass

from common import postgres_pids, wait_for

from tests.support.tcpproxy import TcpProxy

from .judge import tally_of, trial_evidence
from .rig import QUICK, Outcome, Rig, Timing, secs, signal_all

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
    tally = tally_of(rig)
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
