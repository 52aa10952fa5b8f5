"""Nodes SIGKILLed: at random over thousands of jobs of every kind, and in the middle of their commands."""

import random
import statistics
import time

from common import RUNS, query, wait_for

from queueprocessor import singletons
from queueprocessor.rules.job import JobSpec

from .judge import outlived, outlived_text, tally_of, trial_evidence
from .rig import BATCH_CALL, COMMAND_LENGTH, LONG, QUICK, Outcome, Rig, secs


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
                f"SELECT min(n.started_at) FROM qp_runs o JOIN {RUNS} n ON n.job_id = o.job_id "
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
    tally = tally_of(rig)
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
    tally = tally_of(rig)
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
