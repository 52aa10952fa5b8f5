"""A node process frozen (SIGSTOP) past its lease: with HTTP jobs in hand, and alone with its commands under way."""

import random
import signal
import time
from collections import Counter

from common import wait_for

from .judge import SUMMED, log_times, outlived, outlived_text, tally_of, trial_evidence
from .rig import COMMAND_LENGTH, LONG, QUICK, Outcome, Rig, Timing, secs, wait_checked_in


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
    tally = tally_of(rig)
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
    tally = tally_of(rig)
    failed = twice or tally["lost"] or tally["log_errors"] or tally["stuck_runs"] or not alive or stuck
    evidence = ([stuck] if stuck else []) + (trial_evidence(rig, twice, tally, frozen) if failed else [])
    return {"tally": tally, "twice": twice, "rows": rows, "alive": alive, "evidence": evidence}
