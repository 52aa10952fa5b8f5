"""Bulk enqueue (target: at least 100,000 jobs/s in bulk), beside PgQueuer's and a plain COPY of
the same rows, on one throwaway PostgreSQL server, in the same run.

Each round, on a fresh database each, N jobs go in by:

- ours: one `Farm.enqueue(spec, count=N)` (the API's; the CLI's `enqueue ... --count N`: one INSERT ... SELECT
  FROM generate_series), timed around the call in this process, on a Farm opened (and its schema made) before;
- pgqueuer: one `Queries.enqueue(entrypoints, payloads, priorities)` of N jobs, PgQueuer 1.6.0 on asyncpg in the
  peers' virtualenv that bench/throughput.py makes, timed around the call: the same payload N times, and N
  distinct payloads (our API has no bulk call with a payload per job);
- copy: the same N rows sent into qp_jobs by one COPY (psycopg), plain rows with no queue logic: what
  writing them and their index entries costs without ours.

The rounds take the systems in turn, in the opposite order every other round; the median and the range of each
are printed. With --drain, a bulk enqueue and the drain that follows are timed together (one node, `--capacity
256`, `async def` no-ops, from the call to the last job seen done): with the table's statistics as autovacuum
leaves them (stale for a minute), and with `ANALYZE qp_jobs` run at once after the enqueue (its time counted).

    python bench/enqueue.py                      # 100,000 jobs, 3 rounds
    python bench/enqueue.py --drain              # and the drain after it, with and without ANALYZE
    python bench/enqueue.py --quick              # 10,000 jobs, one round
"""

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
CAPACITY = 256


async def pgqueuer_enqueue(dsn: str, count: int, distinct: bool) -> None:
    """In the peers' virtualenv: install PgQueuer's schema, enqueue `count` jobs in one call, print the seconds."""
    import asyncpg
    from pgqueuer import Queries
    from pgqueuer.db import AsyncpgDriver

    queries = Queries(AsyncpgDriver(await asyncpg.connect(dsn)))
    await queries.install()
    payloads = [str(i).encode() for i in range(count)] if distinct else [None] * count
    started = time.perf_counter()
    await queries.enqueue(["job"] * count, payloads, [0] * count)
    print(time.perf_counter() - started, flush=True)


def ours(url: str, count: int) -> float:
    from queueprocessor.farm import Farm

    with Farm(url) as farm:
        spec = farm.python_spec("bench.jobs:noop_async")
        farm.enqueue(spec)  # the first statement's planning and the connection: not the bulk's cost
        started = time.perf_counter()
        farm.enqueue(spec, count=count)
        return time.perf_counter() - started


def copy(url: str, count: int) -> float:
    """N rows of the job ours enqueues, sent by one COPY: plain rows, no queue logic."""
    import psycopg
    from sqlalchemy.engine import make_url

    from queueprocessor.farm import Farm

    Farm(url).close()  # the schema
    parts = make_url(url)
    columns = (
        "executor",
        "target",
        "method",
        "priority",
        "max_attempts",
        "kind",
        "origin",
        "queue",
        "state",
        "attempts",
        "fence",
        "cancel_requested",
        "created_at",
        "run_at",
    )
    now = time.time()
    row = ("python", "bench.jobs:noop_async", "GET", 0, 3, "job", "bench", "default", "queued", 0, 0, False, now, now)
    with psycopg.connect(
        host=parts.host, port=parts.port, user=parts.username, password=parts.password, dbname=parts.database
    ) as conn:
        started = time.perf_counter()
        with conn.cursor().copy(f"COPY qp_jobs ({', '.join(columns)}) FROM STDIN") as writer:
            for _ in range(count):
                writer.write_row(row)
        conn.commit()
        return time.perf_counter() - started


def pgqueuer(url: str, count: int, distinct: bool) -> float | None:
    from throughput import dsn_of, peers_python

    python = peers_python()
    if python is None:
        return None
    done = subprocess.run(
        [python, str(HERE), "--pgqueuer", dsn_of(url), str(count), str(int(distinct))],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.split()[-1])


def drain(server, count: int, analyze: bool) -> float:
    """Seconds from a bulk enqueue of `count` jobs (and an ANALYZE after it, if asked for) until one node has run
    them."""
    from common import farm, query, wait_for

    with farm(server=server, prefix="drain") as run:
        url, farm_ = run.url, run.farm
        run.start("n0", capacity=CAPACITY, allow_module="bench.jobs")
        wait_for(lambda: farm_.status()["machines"], 60, "the node to join")
        time.sleep(2.5)  # the join delay: it takes turns
        started = time.perf_counter()
        farm_.enqueue(farm_.python_spec("bench.jobs:noop_async"), count=count)
        if analyze:
            query(url, "ANALYZE qp_jobs")
        wait_for(
            lambda: query(url, "SELECT count(*) FROM qp_jobs WHERE state = 'succeeded'")[0][0] >= count,
            300,
            f"{count} jobs drained",
            poll=0.05,
        )
        return time.perf_counter() - started


def rate(count: int, seconds: list[float]) -> str:
    if not seconds:
        return "-"
    rates = sorted(count / s for s in seconds)
    return f"{statistics.median(rates):,.0f} ({rates[0]:,.0f}-{rates[-1]:,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per enqueue (default 100,000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each system once a round (default 3)")
    parser.add_argument("--drain", action="store_true", help="also time one node's drain, with and without ANALYZE")
    parser.add_argument("--quick", action="store_true", help="10,000 jobs, one round: proves it works")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.rounds = 10_000, 1

    from common import fresh_database, load_average, postgres, print_table

    print(f"bulk enqueue of {args.jobs:,} jobs, rounds: {args.rounds}; {load_average()}", flush=True)
    cases = {
        "ours: Farm.enqueue(spec, count=N)": lambda url: ours(url, args.jobs),
        "PgQueuer 1.6.0: Queries.enqueue, one payload": lambda url: pgqueuer(url, args.jobs, False),
        "PgQueuer 1.6.0: Queries.enqueue, N distinct payloads": lambda url: pgqueuer(url, args.jobs, True),
        "COPY of the same rows into qp_jobs": lambda url: copy(url, args.jobs),
    }
    timed: dict[str, list[float]] = {name: [] for name in cases}
    drains: dict[str, list[float]] = {
        "as shipped (statistics stale until autovacuum)": [],
        "ANALYZE qp_jobs after the enqueue": [],
    }
    with postgres() as server:
        for round_ in range(args.rounds):
            turn = 1 if round_ % 2 == 0 else -1  # each case goes first in every other round
            for name, case in list(cases.items())[::turn]:
                seconds = case(fresh_database(server, "enqueue"))
                if seconds is not None:
                    timed[name].append(seconds)
            if args.drain:
                for analyze, name in list(enumerate(drains))[::turn]:
                    drains[name].append(drain(server, args.jobs, bool(analyze)))
    print_table(["bulk enqueue", "jobs/s, median (range)"], [[name, rate(args.jobs, s)] for name, s in timed.items()])
    if args.drain:
        print()
        print_table(
            [
                f"bulk enqueue of {args.jobs:,} `async def` no-ops and one node's drain (capacity {CAPACITY})",
                "jobs/s, median (range)",
            ],
            [[name, rate(args.jobs, s)] for name, s in drains.items()],
        )
    print(load_average())


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--pgqueuer":
        asyncio.run(pgqueuer_enqueue(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"))
    else:
        main()
