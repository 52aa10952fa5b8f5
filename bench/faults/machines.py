"""The machines themselves: jobs ten times the lease, a node's wall clock stepped an hour, two processes of one
name."""

import subprocess
import sys
import time
from collections import Counter

from common import ROOT, RUNS, query, wait_for

from queueprocessor.rules.clock import SystemClock

from .judge import tally_of
from .rig import LONG, QUICK, Outcome, Rig, turns_out_of_turn


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
    tally = tally_of(rig)
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
                f"SELECT count(*), sum(CASE WHEN outcome = 'lost' THEN 1 ELSE 0 END) FROM {RUNS} r "
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
    tally = tally_of(rig)
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
        runs = dict(query(rig.url, f"SELECT machine_id, count(*) FROM {RUNS} r GROUP BY machine_id"))
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
    tally = tally_of(rig)
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
