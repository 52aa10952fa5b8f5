"""Searches at 1,000,000 jobs on PostgreSQL: p50 and p95 of `Farm.find_jobs` (the app's and `jobs --search`'s query,
newest 500 that match), with the payload index (ix_qp_payloads) and, in the same run, without it; and what the
index costs: its size, a bulk enqueue of 100,000 jobs with a payload, and one node's drain of 50,000 such jobs
(each claim and finish enters the index again), each with and without it.

The jobs are written by one INSERT ... SELECT (payloads {"customer": {"id": "c-<i mod 100,000>"}, "day": <one of
seven>, "n": <i>}; one in ten of queue `reports`; order keys req-<i mod 200,000>; one in a hundred failed), then
VACUUM ANALYZE.

    python bench/search.py            # 1,000,000 jobs, 40 runs of each search
    python bench/search.py --quick    # 100,000 jobs, 10 runs
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import farm, fresh_database, load_average, percentile, postgres, print_table, query, wait_for  # noqa: E402

from queueprocessor import JobFilter  # noqa: E402
from queueprocessor.farm import Farm  # noqa: E402

FILL = """
INSERT INTO qp_jobs (executor, target, method, payload, state, priority, run_at, created_at, finished_at, attempts,
                     max_attempts, fence, cancel_requested, kind, queue, order_key, gated)
SELECT 'python', 'bench.jobs:noop', 'GET',
       json_build_object('customer', json_build_object('id', 'c-' || (i % 100000)),
                         'day', (ARRAY['monday', 'tuesday', 'wednesday', 'thursday', 'friday', 'saturday',
                                        'sunday'])[1 + i % 7],
                         'n', i)::text,
       CASE WHEN i % 100 = 0 THEN 'failed' ELSE 'succeeded' END, 0, t, t, t, 1, 1, 1, false, 'job',
       CASE WHEN i % 10 = 0 THEN 'reports' ELSE 'default' END, 'req-' || (i % 200000), false
FROM generate_series(1, :count) AS i, (SELECT EXTRACT(EPOCH FROM now()) AS t) AS now_
"""
SEARCHES = [
    ("customer.id=c-4242", "a nested field, 10 matches in 1,000,000"),
    ("n=999999", "a field, 1 match"),
    ("customer.id=c-4242 queue:reports", "a field and a queue"),
    ("day=monday", "a field, 1 in 7 match (the newest 500)"),
    ("day=monday state-less words", "a field and text that matches nothing"),
    ("key:req-4242", "an order key, 5 matches"),
    ("boom", "plain text (the last error), 1 in 100 match"),
]


DRAIN = 50_000  # jobs of each drain (a fifth with --quick)


def timed(farm: Farm, search: str, runs: int) -> list[float]:
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        farm.find_jobs(JobFilter(search=search), limit=500)
        took.append(time.perf_counter() - started)
    return took


def enqueue_cost(server, count: int, indexed: bool) -> float:
    url = fresh_database(server)
    with Farm(url) as farm:
        if not indexed:
            query(url, "DROP INDEX ix_qp_payloads")
        spec = farm.python_spec("bench.jobs:noop", {"customer": {"id": "c-1"}, "day": "monday"})
        farm.enqueue(spec)
        started = time.perf_counter()
        farm.enqueue(spec, count=count)
        return time.perf_counter() - started


def drain_seconds(server, count: int, indexed: bool) -> float:
    """One node (`--capacity 256`) draining `count` no-op `async def` jobs with a payload: each claim and finish
    writes a new row version, which enters the payload index too (a GIN index takes no HOT update)."""
    with farm(server=server, open=False) as run:
        url = run.url
        with Farm(url) as jobs:
            if not indexed:
                query(url, "DROP INDEX ix_qp_payloads")
            jobs.enqueue(
                jobs.python_spec("bench.jobs:noop_async", {"customer": {"id": "c-1"}, "day": "monday"}), count=count
            )
        query(url, "VACUUM ANALYZE qp_jobs, qp_payloads")
        run.start("drainer", capacity=256, allow_module="bench.jobs")
        started = time.perf_counter()
        wait_for(
            lambda: query(url, "SELECT count(*) FROM qp_jobs WHERE state = 'succeeded'")[0][0] >= count,
            300,
            "the drain",
        )
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.runs = 100_000, 10
    print(f"load before: {load_average()}")
    rows = []
    with postgres() as server:
        url = fresh_database(server)
        with Farm(url) as farm:
            started = time.perf_counter()
            query(url, FILL, count=args.jobs)
            query(url, "VACUUM ANALYZE qp_jobs, qp_payloads")
            print(f"{args.jobs:,} jobs written and analysed in {time.perf_counter() - started:.1f} s")
            size = query(url, "SELECT pg_relation_size('ix_qp_payloads')")[0][0]
            with_index = {search: timed(farm, search, args.runs) for search, _ in SEARCHES}
            query(url, "DROP INDEX ix_qp_payloads")
            without = {search: timed(farm, search, max(3, args.runs // 10)) for search, _ in SEARCHES}
        for search, what in SEARCHES:
            a, b = with_index[search], without[search]
            rows.append(
                [
                    search,
                    what,
                    f"{percentile(a, 50) * 1000:.1f}",
                    f"{percentile(a, 95) * 1000:.1f}",
                    f"{percentile(b, 50) * 1000:.1f}",
                ]
            )
        enqueue = {indexed: enqueue_cost(server, 100_000, indexed) for indexed in (True, False)}
        drains: dict[bool, list[float]] = {True: [], False: []}
        for order in ((True, False), (False, True))[: 1 if args.quick else 2]:
            for indexed in order:
                drains[indexed].append(drain_seconds(server, DRAIN // (5 if args.quick else 1), indexed))
    print(f"find_jobs at {args.jobs:,} jobs, {args.runs} runs each (ms):")
    print_table(["search", "what", "p50", "p95", "p50 without the index"], rows)
    print(f"ix_qp_payloads: {size / 2**20:.0f} MB for {args.jobs:,} jobs with a payload")
    print(
        f"enqueue of 100,000 jobs with a payload: {enqueue[True]:.2f} s with the index, {enqueue[False]:.2f} s without"
    )
    drained = DRAIN // (5 if args.quick else 1)
    print(
        f"drain of {drained:,} jobs with a payload, one node: "
        + ", ".join(
            f"{'with' if k else 'without'} the index {statistics.median(drained / t for t in v):,.0f} jobs/s"
            for k, v in drains.items()
        )
    )
    print(f"load after: {load_average()}")


if __name__ == "__main__":
    main()
