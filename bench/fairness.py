"""Fair share and limits per key (issue 35, docs/design.md §9): what a fair queue gives a small tenant beside a
flood, a tenant that shards itself, and what fair share and a limit per key cost, on real node processes.

Every case gets a fresh database on one throwaway PostgreSQL server and its own `queueprocessor node` processes
(`--capacity C`, the farm's default timing: the period is printed). Jobs are bench/jobs.py's no-op Python function
unless said otherwise; every wait and rate is read from the database (qp_jobs' created_at, started_at and
finished_at, database time), never from this script's clock.

- fairness: 3 nodes; tenant A enqueues --flood jobs at once (fair key "a", one call), then tenant B enqueues 100
  jobs one at a time, one every 50 ms (fair key "b") while A's flood drains. B's wait, enqueue (created_at) to
  start (started_at), p50/p99/max, with the queue fair, beside the same workload with the queue plain (priority,
  then age: the flood first), and beside B alone on an empty farm (the queue fair, and plain). Goal: fair B's p99
  within 2 periods of the empty farm's.
- shards: tenant S enqueues 1,000 jobs over 1,000 order keys, all of fair key "s", one call each; tenant T then
  1,000 of fair key "t" in one call; then 2 nodes start. By started_at order, up to the start of the last job of
  whichever tenant ran out first (both had work waiting until then): the fraction of starts each got. Goal: 0.5
  each (S gets no more than its weight for all its order keys); with T of weight 2: 1/3 and 2/3.
- throughput: --jobs no-op jobs of 100 fair keys (k0..k99, 100 calls) drained by 2 nodes, the queue fair, plain,
  or plain with a farm-wide limit set high (--limit: a guarded queue, the claim locks its row: the cost a fair
  queue's claim had to match before this issue). The jobs are enqueued before the nodes start; the rate is
  jobs / (last finished_at - first started_at). Cases interleaved over --rounds,
  each round in a rotated order; reported: median (min-max) and the median of each round's ratio to plain. Goal:
  fair / plain >= 0.9.
- limit: the queue with key_limit=3, 20 keys of HTTP jobs `/sleep/0.2?key=K` to a recording HTTP target
  (tests/support/httptarget.py, nodes given `--http-base`), 3 nodes of capacity C; every --kill-every seconds the
  oldest node is killed with SIGKILL and a new one started, for --churn seconds; then the same without kills.
  Reported by the target's record: the most requests of any one key in flight at once (must be <= 3), of all keys
  together, and the jobs done (a killed node's jobs hold their keys' room until their leases run out).

    python bench/fairness.py                    # the issue's figures: 100,000-job flood, 100,000 jobs x 3 rounds
    python bench/fairness.py --quick            # 10,000-job flood, 20,000 jobs, 10 s of churn
    python bench/fairness.py --parts fairness,shards --quick
    python bench/fairness.py --parts throughput --rounds 6
"""

import argparse
import math
import time
from statistics import median

from common import farm, load_average, ms, percentile, postgres, print_table, query, rotated, wait_for

from tests.support.httptarget import HttpTarget, most_at_once

PARTS = ("fairness", "shards", "throughput", "limit")
NOOP = "bench.jobs:noop"
B_JOBS = 100
B_EVERY = 0.05  # seconds between B's enqueues
KEYS = 100  # fair keys of the throughput backlog
LIMIT_KEYS = 20
KEY_LIMIT = 3


def idle_farm(server, nodes: int, capacity: int, **options):
    """A fresh farm with `nodes` node processes of `capacity`, allowed bench.jobs, its database dropped at the end."""
    return farm(nodes, server=server, prefix="fair", drop=True, capacity=capacity, allow_module="bench.jobs", **options)


def joined(run, nodes: int) -> None:
    """Until `nodes` machines are in the farm and take turns (the join delay), and have read the queue settings."""
    run.wait_joined(nodes)
    time.sleep(2.5)


def drained(url: str, timeout: float = 900) -> None:
    """Until no job is queued or running."""
    wait_for(
        lambda: not query(url, "SELECT EXISTS (SELECT 1 FROM qp_jobs WHERE state IN ('queued', 'running'))")[0][0],
        timeout,
        "the backlog to drain",
        poll=0.2,
    )
    failed = query(url, "SELECT count(*) FROM qp_jobs WHERE state <> 'succeeded'")[0][0]
    if failed:
        raise RuntimeError(f"{failed} jobs did not succeed")


# -- fairness: a small tenant beside a flood -------------------------------------------------------------------


def b_waits(server, flood: int, fair: bool, capacity: int) -> dict:
    """B's waits (seconds) with a flood of A's jobs (`flood`, 0: none) in the queue, fair or plain; and A's drain."""
    with idle_farm(server, 3, capacity) as run:
        if fair:
            run.farm.set_queue("default", fair=True)
        joined(run, 3)
        period = run.farm.current_settings()["period"]
        if flood:
            run.farm.enqueue_python(NOOP, fair_key="a", count=flood)
        for _ in range(B_JOBS):
            run.farm.enqueue_python(NOOP, fair_key="b")
            time.sleep(B_EVERY)
        drained(run.url)
        waits, during = [], []  # during: B's jobs enqueued while some of A's had not started
        for wait, amid in query(
            run.url,
            "SELECT started_at - created_at, created_at < (SELECT max(started_at) FROM qp_jobs WHERE fair_key = 'a') "
            "FROM qp_jobs WHERE fair_key = 'b'",
        ):
            waits.append(wait)
            if amid:
                during.append(wait)
        [(a_drain,)] = query(run.url, "SELECT max(finished_at) - min(created_at) FROM qp_jobs WHERE fair_key = 'a'")
    return dict(waits=waits, during=during, period=period, a_drain=a_drain)


def part_fairness(server, flood: int, capacity: int) -> list[str]:
    cases = [("fair", flood, True), ("plain", flood, False), ("empty, fair", 0, True), ("empty, plain", 0, False)]
    rows, found = [], {}
    for name, n, fair in cases:
        print(f"  fairness: {name} ({n} flood jobs); {load_average()}", flush=True)
        found[name] = got = b_waits(server, n, fair, capacity)
        waits = got["waits"]
        a = "-" if got["a_drain"] is None else f"{got['a_drain']:.1f} s ({n / got['a_drain']:.0f} jobs/s)"
        amid = got["during"]
        rows.append(
            [
                name,
                f"{n:,}",
                ms(percentile(waits, 50)),
                ms(percentile(waits, 99)),
                ms(max(waits)),
                len(waits),
                f"{len(amid)}: {ms(percentile(amid, 50))} / {ms(percentile(amid, 99))}" if n else "-",
                a,
            ]
        )
    period = found["fair"]["period"]
    print(f"B: {B_JOBS} jobs, one every {B_EVERY * 1000:.0f} ms after A's flood; 3 nodes; period {period:g} s")
    print_table(
        [
            "queue",
            "A's flood",
            "B p50 ms",
            "B p99 ms",
            "B max ms",
            "B jobs",
            "B's during the flood: p50 / p99 ms",
            "A's drain",
        ],
        rows,
    )
    gap = percentile(found["fair"]["waits"], 99) - percentile(found["empty, fair"]["waits"], 99)
    verdict = "met" if gap <= 2 * period else "NOT met"
    return [
        f"fairness: fair B p99 - the empty farm's p99 = {gap * 1000:.1f} ms; goal <= 2 periods "
        f"({2 * period:g} s): {verdict}"
    ]


# -- shards: a tenant that spreads its work over many order keys -----------------------------------------------


def start_shares(server, capacity: int, t_weight: float | None, per: int) -> tuple[float, float, int]:
    """S's and T's fractions of the starts while both had work waiting, and how many starts that was."""
    with idle_farm(server, 0, capacity) as run:
        run.farm.set_queue("default", fair=True)
        for i in range(per):
            run.farm.enqueue_python(NOOP, fair_key="s", order_key=f"o{i}")
        run.farm.enqueue_python(NOOP, fair_key="t", fair_weight=t_weight, count=per)
        run.start("node-0")
        run.start("node-1")
        drained(run.url)
        order = [k for (k,) in query(run.url, "SELECT fair_key FROM qp_jobs ORDER BY started_at, id")]
    last = {key: max(i for i, k in enumerate(order) if k == key) for key in ("s", "t")}
    both = order[: min(last.values()) + 1]
    return both.count("s") / len(both), both.count("t") / len(both), len(both)


def part_shards(server, capacity: int, per: int) -> list[str]:
    rows, notes = [], []
    for t_weight, goal in ((None, 0.5), (2.0, 1 / 3)):
        print(f"  shards: T of weight {t_weight or 1:g}; {load_average()}", flush=True)
        s, t, n = start_shares(server, capacity, t_weight, per)
        rows.append([f"{t_weight or 1:g}", f"{s:.3f}", f"{t:.3f}", n, f"{goal:.3f} / {1 - goal:.3f}"])
        notes.append(f"shards: T of weight {t_weight or 1:g}: S {s:.3f} (goal {goal:.3f}), T {t:.3f}")
    print(f"S: {per} jobs over {per} order keys, fair key s; T: {per} jobs, fair key t; 2 nodes; queue fair")
    print_table(["T's weight", "S's share", "T's share", "starts while both waited", "goal S / T"], rows)
    return notes


# -- throughput: fair share on and off -------------------------------------------------------------------------


def drain_rate(server, case: str, count: int, capacity: int, limit: int) -> tuple[float, float]:
    """Jobs/s, and the seconds its enqueue took, of `count` no-ops of KEYS fair keys enqueued before any node runs,
    drained by 2 nodes started together, from the first start to the last end. (Not jobs due at a moment set
    ahead while the nodes idle: the plain queue drained those slower, the guarded ones not; docs/benchmarks.md.)"""
    with idle_farm(server, 0, capacity) as run:
        if case == "fair":
            run.farm.set_queue("default", fair=True)
        elif case == "limited":
            run.farm.set_queue("default", limit=limit)
        began = time.monotonic()
        for k in range(KEYS):
            run.farm.enqueue_python(NOOP, fair_key=f"k{k}", count=count // KEYS)
        took = time.monotonic() - began
        run.start("node-0")
        run.start("node-1")
        drained(run.url)
        [(first, last, n)] = query(run.url, "SELECT min(started_at), max(finished_at), count(*) FROM qp_jobs")
    rate = n / (last - first)
    print(
        f"  throughput: {case:8} {rate:8.0f} jobs/s (drain {last - first:.2f} s, enqueue {took:.2f} s); "
        f"{load_average()}",
        flush=True,
    )
    return rate, took


def part_throughput(server, count: int, capacity: int, limit: int, rounds: int) -> list[str]:
    cases = ["fair", "plain", "limited"]
    rates: dict[tuple[str, int], float] = {}
    enqueues: dict[str, list[float]] = {case: [] for case in cases}
    for r in range(rounds):
        print(f"  throughput round {r + 1}: {load_average()}", flush=True)
        for case in rotated(cases, r):
            rates[case, r], took = drain_rate(server, case, count, capacity, limit)
            enqueues[case].append(took)
    rows, notes = [], []
    for case in cases:
        own = [rates[case, r] for r in range(rounds)]
        ratios = [rates[case, r] / rates["plain", r] for r in range(rounds)]
        cell = f"{median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
        took = enqueues[case]
        rows.append(
            [case, f"{median(own):.0f} ({min(own):.0f}-{max(own):.0f})", cell, f"{median(took):.2f} ({max(took):.2f})"]
        )
        if case != "plain":
            notes.append(f"throughput: {case} / plain = {cell}, median (min-max) of {rounds} rounds")
    print(f"{count:,} no-op jobs of {KEYS} fair keys, 2 nodes of capacity {capacity}, limited: limit {limit}")
    print_table(
        ["queue", "jobs/s median (min-max)", "/ plain, median of rounds (min-max)", "enqueue s, median (max)"], rows
    )
    ratio = median(rates["fair", r] / rates["plain", r] for r in range(rounds))
    notes.append(f"throughput: goal fair / plain >= 0.9: {'met' if ratio >= 0.9 else 'NOT met'} ({ratio:.2f})")
    return notes


# -- limit: a limit per key under kill churn -------------------------------------------------------------------


def limit_case(server, capacity: int, per_key: int, seconds: float, kill_every: float | None) -> list:
    """A row of the limit part: `seconds` from the first request, with a node killed and one started every
    `kill_every` seconds (None: none), judged by the target's record once every request has ended."""
    target = HttpTarget()
    try:
        with idle_farm(server, 0, capacity, http_base=target.base_url) as run:
            run.farm.set_queue("default", key_limit=KEY_LIMIT)
            for k in range(LIMIT_KEYS):
                run.farm.enqueue_http(f"/sleep/0.2?key=k{k}", fair_key=f"k{k}", count=per_key)
            started = 0
            for _ in range(3):
                run.start(f"node-{started}")
                started += 1
            wait_for(lambda: target.requests("/sleep"), 60, "the first request")
            end, kills = time.monotonic() + seconds, 0
            while time.monotonic() < end:
                time.sleep(min(kill_every or seconds, max(0.0, end - time.monotonic())))
                if time.monotonic() >= end or kill_every is None:
                    break
                run.kill(run.live()[0])
                kills += 1
                run.start(f"node-{started}")
                started += 1
            [(done,)] = query(run.url, "SELECT count(*) FROM qp_jobs WHERE state = 'succeeded'")
    finally:
        target.stop()  # ends what is still in flight, so every record has its end
    records = target.requests("/sleep")
    by_key: dict[str, list[dict]] = {}
    for record in records:
        by_key.setdefault(record["path"].partition("?key=")[2], []).append(record)
    most = max(most_at_once(r) for r in by_key.values())
    cut = sum(1 for r in records if r["status"] != 200)
    what = f"a kill every {kill_every:g} s" if kill_every else "no kill"
    return [what, kills, done, f"{done / seconds:.0f}", len(records), cut, most, most_at_once(records)]


def part_limit(server, capacity: int, per_key: int, churn: float, kill_every: float) -> list[str]:
    rows = []
    for every in (kill_every, None):
        print(f"  limit: {'churn' if every else 'steady'}; {load_average()}", flush=True)
        rows.append(limit_case(server, capacity, per_key, churn, every))
    print(
        f"key_limit {KEY_LIMIT}, {LIMIT_KEYS} keys x {per_key} jobs of /sleep/0.2 (at most "
        f"{KEY_LIMIT * LIMIT_KEYS / 0.2:.0f} jobs/s), 3 nodes of capacity {capacity}, {churn:g} s from the first "
        "request; with churn, the oldest node killed (SIGKILL) and a new one started"
    )
    print_table(
        [
            "nodes",
            "kills",
            "jobs done",
            "jobs/s",
            "requests",
            "cut short by a kill",
            "most of one key at once",
            "most of all at once",
        ],
        rows,
    )
    most = max(row[6] for row in rows)
    return [
        f"limit: most requests of one key in flight at once {most} (must be <= {KEY_LIMIT}): "
        f"{'held' if most <= KEY_LIMIT else 'BROKEN'}; jobs done {rows[0][2]} with {rows[0][1]} kills, "
        f"{rows[1][2]} without"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10,000-job flood, 20,000 jobs, 10 s of churn")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--capacity", type=int, default=32, help="jobs each node runs at once")
    parser.add_argument("--flood", type=int, help="A's jobs (default 100,000; 10,000 with --quick)")
    parser.add_argument("--jobs", type=int, help="the throughput backlog (default 100,000; 20,000 with --quick)")
    parser.add_argument("--per-tenant", type=int, default=1000, help="S's and T's jobs in shards")
    parser.add_argument("--limit", type=int, default=100_000, help="the farm-wide limit of the limited case")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds, interleaved")
    parser.add_argument("--churn", type=float, help="seconds of kill churn (default 30; 10 with --quick)")
    parser.add_argument("--kill-every", type=float, default=3.0, help="seconds between kills")
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",")]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    flood = args.flood or (10_000 if args.quick else 100_000)
    count = args.jobs or (20_000 if args.quick else 100_000)
    churn = args.churn or (10.0 if args.quick else 30.0)
    print(f"parts {', '.join(parts)}, capacity {args.capacity}; {load_average()}", flush=True)
    notes: list[str] = []
    with postgres() as server:
        if "fairness" in parts:
            notes += part_fairness(server, flood, args.capacity)
        if "shards" in parts:
            notes += part_shards(server, args.capacity, args.per_tenant)
        if "throughput" in parts:
            notes += part_throughput(server, count, args.capacity, args.limit, args.rounds)
        if "limit" in parts:
            per_key = math.ceil(churn * 400 / LIMIT_KEYS)  # more than the keys limits let 3 nodes finish (300/s)
            notes += part_limit(server, args.capacity, per_key, churn, args.kill_every)
    for note in notes:
        print(note)
    print(load_average())


if __name__ == "__main__":
    main()
