"""Turn discipline: does the farm poll exactly once per period, on time, whatever the clocks say?

For 1, 2, 4, 8 and 16 real node processes on PostgreSQL, each with a random
clock skew in +-1 s, this runs side by side in the same window:

- QueueProcessor: `queueprocessor node` processes taking turns in database
  time; the truth is the qp_turns table (one row per slot, written at the
  moment of the poll, in database time);
- a naive baseline: as many processes, each told "you are i of n", polling
  when floor(local_wall_time / period) % n == i on its own skewed clock, with
  the same 10 ms timer, logging every poll (database time) into a table
  without a unique key, so its double polls and holes show.

Both are judged the same way, on the database's clock: each poll falls in
the slot floor(at / period), some way into it (a node waits until its error
bound says it is surely inside its slot). Double polls are slots polled more
than once (target 0), missed slots are slots nobody polled (target at most
0.5%), and the gap between consecutive polls should stay near the period
(target |gap - period| p99 at most 15 ms).

The server is left at PostgreSQL's default max_connections of 100: a node
holds one connection for its statements and, with push, one to LISTEN, so 64
nodes fit only without push (64 connections), and the naive baseline (one
connection per poller) only beside farms of up to 16 nodes. The sizes that do
not fit both say so in the table. The resident memory (RSS) of each idle node
is shown too (target: at most 60 MB).

    python bench/turn_discipline.py                     # 1, 2, 4, 8, 16 nodes, 30 s each
    python bench/turn_discipline.py --nodes 32 64       # the farm alone, push off where it does not fit
    python bench/turn_discipline.py --quick             # 3 nodes, 8 s
"""

import argparse
import math
import random
import signal
import subprocess
import sys
import time
from collections import Counter

from common import (
    ROOT,
    WakeProbe,
    farm,
    load_average,
    ms,
    percentile,
    postgres,
    print_table,
    query,
    rss_mb,
    wait_for,
)

HEARTBEAT = 1.0
JOIN_DELAY = 1.5 * HEARTBEAT
TICK = 0.01
NAIVE_TABLES = (
    "CREATE TABLE bench_naive_polls (slot BIGINT NOT NULL, machine TEXT NOT NULL, at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE bench_naive_ready (machine TEXT NOT NULL)",
)
DB_NOW = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
MAX_CONNECTIONS = 100  # PostgreSQL's default
SPARE = 8  # for PostgreSQL's superuser reserve and this script's own connections


def fits(nodes: int) -> tuple[bool, bool]:
    """(push, naive baseline): what fits in MAX_CONNECTIONS beside `nodes` nodes."""
    push = 2 * nodes + SPARE <= MAX_CONNECTIONS
    return push, (2 if push else 1) * nodes + nodes + SPARE <= MAX_CONNECTIONS


# -- the naive baseline, one process per machine ---------------------------


def naive_node(url: str, index: int, count: int, skew: float, period: float, name: str) -> None:
    """Poll when it is my slot on my own (skewed) wall clock; log each poll; until SIGTERM."""
    from sqlalchemy import text

    from queueprocessor.rules.clock import SystemClock
    from queueprocessor.store.database import open_engine

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    clock = SystemClock(skew)
    engine = open_engine(url).execution_options(isolation_level="AUTOCOMMIT")
    poll = text(f"INSERT INTO bench_naive_polls (slot, machine, at) VALUES (:slot, :machine, {DB_NOW})")
    with engine.connect() as conn:
        conn.execute(text("INSERT INTO bench_naive_ready (machine) VALUES (:m)"), {"m": name})
    last = None
    next_tick = time.monotonic()
    while not stopping:
        slot = math.floor(clock.time() / period)
        if slot != last and slot % count == index:
            last = slot
            with engine.connect() as conn:
                conn.execute(poll, {"slot": slot, "machine": name})
        next_tick += TICK
        time.sleep(max(0.0, next_tick - time.monotonic()))
    engine.dispose()


# -- measuring ------------------------------------------------------------


def judge(times: list[float], first_slot: int, last_slot: int, period: float) -> dict:
    """Double polls, missed slots and gaps of polls made at `times` (database time), over slots first..last."""
    inside = sorted(t for t in times if first_slot <= math.floor(t / period) <= last_slot)
    per_slot = Counter(math.floor(t / period) for t in inside)
    slots = last_slot - first_slot + 1
    gaps = [b - a for a, b in zip(inside, inside[1:])]
    late = [t - math.floor(t / period) * period for t in inside]
    return {
        "slots": slots,
        "polls": len(inside),
        "double": sum(1 for n in per_slot.values() if n > 1),
        "missed": slots - len(per_slot),
        "gap_p50": percentile(gaps, 50),
        "gap_p99": percentile(gaps, 99),
        "dev_p50": percentile([abs(g - period) for g in gaps], 50),
        "dev_p99": percentile([abs(g - period) for g in gaps], 99),
        "dev_max": max((abs(g - period) for g in gaps), default=math.nan),
        "late_p50": percentile(late, 50),
        "late_p99": percentile(late, 99),
    }


def run_size(server, nodes: int, seconds: float, period: float, rng: random.Random) -> list[dict]:
    skews = [rng.uniform(-1.0, 1.0) for _ in range(nodes)]
    push, baseline = fits(nodes)
    with farm(server=server, prefix="turns", open=False, period=period, heartbeat=HEARTBEAT, push=push) as run:
        url = run.url
        for statement in NAIVE_TABLES:
            query(url, statement)
        started = [run.start(f"qp-{i}", skew=s) for i, s in enumerate(skews)]
        return judged(url, started, skews, push, baseline, nodes, seconds, period)


def judged(
    url: str, started: list, skews: list[float], push: bool, baseline: bool, nodes: int, seconds: float, period: float
) -> list[dict]:
    """Run the naive pollers beside the farm's nodes (`started`) over the window; both judged."""
    naive = [
        subprocess.Popen(
            [sys.executable, __file__, "naive-node", url, str(i), str(nodes), repr(s), str(period), f"naive-{i}"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
        )
        for i, s in enumerate(skews)
        if baseline
    ]
    try:
        joined = wait_for(lambda: _all_joined(url, nodes), 90 + 2 * nodes, f"{nodes} nodes to join")
        wait_for(
            lambda: query(url, "SELECT count(*) FROM bench_naive_ready")[0][0] >= len(naive),
            60,
            f"{nodes} naive pollers to start",
        )
        # The steady state: every node in every roster (joined long enough ago and read by everyone's
        # heartbeat), and every node past its first turn (start-up work: first statements, a busy machine).
        settle_until = joined + JOIN_DELAY + 2 * HEARTBEAT
        wait_for(
            lambda: (
                query(url, "SELECT count(DISTINCT machine_id) FROM qp_turns WHERE taken_at > :t", t=settle_until)[0][0]
                >= nodes
            ),
            30 + 2 * nodes * period,
            f"{nodes} first turns",
        )
        start = query(url, f"SELECT {DB_NOW}")[0][0]
        first_slot = math.ceil(start / period)
        last_slot = first_slot + round(seconds / period) - 1
        with WakeProbe() as probe:
            time.sleep(max(0.0, (last_slot + 2) * period - start))
        bound = query(url, "SELECT max(error_bound) FROM qp_machines WHERE state = 'active'")[0][0]
        memory = [rss_mb(node.pid) for node in started]
        dead = [n.name for n in started if not n.alive()] + [f"naive-{i}" for i, p in enumerate(naive) if p.poll()]
        if dead:
            raise RuntimeError(f"processes died during the window: {dead}")
    finally:
        for process in naive:
            process.terminate()
        for process in naive:
            process.wait(10)
    turns = query(
        url, "SELECT slot, taken_at FROM qp_turns WHERE slot BETWEEN :a AND :b", a=first_slot - 1, b=last_slot + 1
    )
    polls = [row[0] for row in query(url, "SELECT at FROM bench_naive_polls")]
    ours = judge([taken_at for _, taken_at in turns], first_slot, last_slot, period)
    ours["bound"] = bound
    ours["outside"] = sum(
        1 for slot, taken_at in turns if first_slot <= slot <= last_slot and math.floor(taken_at / period) != slot
    )
    ours["rss"] = f"{percentile(memory, 50):.0f} / {max(memory):.0f}"
    spread = f"{min(skews):+.2f}..{max(skews):+.2f} s"
    machine = {"nodes": nodes, "skews": spread, "wake_p99": percentile(probe.late, 99), "wake_max": max(probe.late)}
    rows = [dict(ours, system="QueueProcessor" + ("" if push else " (push off)"), **machine)]
    if baseline:
        theirs = judge(polls, first_slot, last_slot, period)
        theirs["outside"] = theirs["bound"] = math.nan
        rows.append(dict(theirs, system="naive local clock", rss="-", **machine))
    return rows


def _all_joined(url: str, nodes: int) -> float | None:
    """The latest join time once `nodes` machines are active, else None."""
    try:
        count, latest = query(url, "SELECT count(*), max(joined_at) FROM qp_machines WHERE state = 'active'")[0]
    except Exception:  # the tables do not exist until the first node created them
        return None
    return latest if count >= nodes else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 nodes for 8 s (under a minute)")
    parser.add_argument("--nodes", type=int, nargs="+", help="farm sizes (default 1 2 4 8 16)")
    parser.add_argument("--seconds", type=float, help="measuring window per size (default 30)")
    parser.add_argument("--period", type=float, default=1.0, help="turn period, seconds (default 1)")
    parser.add_argument("--seed", type=int, default=2, help="seed of the random skews")
    args = parser.parse_args()
    sizes = args.nodes or ([3] if args.quick else [1, 2, 4, 8, 16])
    seconds = args.seconds or (8.0 if args.quick else 30.0)
    rng = random.Random(args.seed)

    print(
        f"turn discipline: period {args.period:g} s, heartbeat {HEARTBEAT:g} s, skews uniform in +-1 s, "
        f"{seconds:g} s window per size, max_connections {MAX_CONNECTIONS}; {load_average()}"
    )
    with postgres(max_connections=MAX_CONNECTIONS) as server:
        results = [row for n in sizes for row in run_size(server, n, seconds, args.period, rng)]
    print_table(
        [
            "nodes",
            "skews",
            "system",
            "slots",
            "polls",
            "double polls",
            "missed slots",
            "outside slot",
            "into slot p50 ms",
            "p99 ms",
            "max error bound ms",
            "gap p50 ms",
            "gap p99 ms",
            "|gap-period| p50 ms",
            "|gap-period| p99 ms",
            "max ms",
            "targets met",
            "RSS per node median / max MB",
            "machine wake-up delay p99 / max ms",
        ],
        [
            [
                r["nodes"],
                r["skews"],
                r["system"],
                r["slots"],
                r["polls"],
                r["double"],
                f"{r['missed']} ({100 * r['missed'] / r['slots']:.1f}%)",
                "-" if math.isnan(r["outside"]) else r["outside"],
                ms(r["late_p50"]),
                ms(r["late_p99"]),
                ms(r["bound"]),
                ms(r["gap_p50"]),
                ms(r["gap_p99"]),
                ms(r["dev_p50"]),
                ms(r["dev_p99"]),
                ms(r["dev_max"]),
                _verdict(r),
                r["rss"],
                f"{ms(r['wake_p99'])} / {ms(r['wake_max'])}",
            ]
            for r in results
        ],
    )
    print(
        "\ntargets: 0 double polls, missed slots <= 0.5%, |gap - period| p99 <= 15 ms, RSS <= 60 MB. "
        "Wake-up delay: how\nlate a thread sleeping 10 ms woke during the window "
        "(the machine's load, not the farm's code)"
    )
    print(load_average())


def _verdict(r: dict) -> str:
    failed = [
        name
        for name, ok in (
            ("double", r["double"] == 0),
            ("missed", r["missed"] <= 0.005 * r["slots"]),
            ("gap", r["dev_p99"] <= 0.015),
        )
        if not ok
    ]
    return "yes" if not failed else "NO: " + ", ".join(failed)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "naive-node":
        _, _, url, index, count, skew, period, name = sys.argv
        naive_node(url, int(index), int(count), float(skew), float(period), name)
    else:
        main()
