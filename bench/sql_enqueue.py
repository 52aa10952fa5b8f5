"""Enqueue from SQL: `qp_enqueue` called from 8 concurrent connections, beside the Python API's enqueue from 8
threads, one job per call and per transaction (as a trigger enqueues a log record), on one throwaway PostgreSQL
server, in the same run.

Each round, on a fresh database each, N jobs go in by:

- qp_enqueue: 8 psycopg connections in autocommit, each calling `SELECT qp_enqueue('python', 'bench.jobs:noop',
  payload, 'default', order_key)` N/8 times: one statement, one transaction a job;
- qp_enqueue from a trigger: the same connections inserting N/8 rows each into a log table whose row trigger
  calls qp_enqueue with the row's request as the order key (docs/sql-enqueue.md's seed workload): the row and its
  job in one transaction;
- Farm.enqueue: 8 threads, each with its own Farm, calling `farm.enqueue(spec)` N/8 times: the API's door, which
  also reads the live machines to check their allow-lists (none here: every job is admitted).

The rounds take the ways in turn, in the opposite order every other round; the median and the range of each are
printed, with the load average (2 cores shared with other work skew every figure).

    python bench/sql_enqueue.py                  # 4,000 jobs a way, 3 rounds
    python bench/sql_enqueue.py --quick          # 800 jobs, one round: proves it works

With --push it measures push instead: `count` single-job qp_enqueue commits from 8 and from 32 connections, by
--before's code (its schema and qp_enqueue, made by it) and by this tree's, with the farm's trigger (push on) and
with it dropped (push off: the floor), each on a fresh database, and the notices a LISTENing connection hears
(target: at most a tenth of the commits).

    python bench/sql_enqueue.py --push --jobs 2000 --rounds 3 --before 409d36d
"""

import argparse
import statistics
import threading
import time
from collections.abc import Callable

CONNECTIONS = 8
LOG_TABLE = """
CREATE TABLE esb_log (id bigserial PRIMARY KEY, request_id text NOT NULL, seq integer NOT NULL, message text);
CREATE FUNCTION esb_log_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM qp_enqueue('python', 'bench.jobs:noop',
        jsonb_build_object('id', NEW.id, 'request', NEW.request_id, 'seq', NEW.seq), 'default', NEW.request_id);
    RETURN NEW;
END $$;
CREATE TRIGGER esb_log_enqueue AFTER INSERT ON esb_log FOR EACH ROW EXECUTE FUNCTION esb_log_enqueue();
"""


def in_parallel(work: Callable[[int], Callable[[], None]], connections: int = CONNECTIONS) -> float:
    """Seconds for `connections` threads to each run what `work(n)` made for it (made before the clock starts), from
    a common start."""
    ready = [work(n) for n in range(connections)]
    start = threading.Barrier(connections + 1)

    def run(each: Callable[[], None]) -> None:
        start.wait()
        each()

    threads = [threading.Thread(target=run, args=(each,)) for each in ready]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began


def dsn_of(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def by_sql(url: str, count: int, statement: str, writers: int = CONNECTIONS, made: bool = False) -> float:
    """`statement` (with parameters n and request) count/writers times on each of `writers` connections (the farm's
    schema made first by this tree's code, unless `made`)."""
    import psycopg

    from queueprocessor.farm import Farm

    if not made:
        Farm(url).close()  # the schema, and qp_enqueue with it
    per = count // writers
    connections = [psycopg.connect(dsn_of(url), autocommit=True) for _ in range(writers)]
    try:
        if "esb_log" in statement:
            connections[0].execute(LOG_TABLE)

        def work(c: int) -> Callable[[], None]:
            conn = connections[c]
            conn.execute(statement, dict(n=0, request="warm"))  # the plan and the function's first call: not timed

            def each() -> None:
                for n in range(per):
                    conn.execute(statement, dict(n=n, request=f"req-{c}-{n % 50}"))

            return each

        return in_parallel(work, writers)
    finally:
        for conn in connections:
            conn.close()


def by_api(url: str, count: int) -> float:
    from queueprocessor.farm import Farm

    per = count // CONNECTIONS
    farms = [Farm(url) for _ in range(CONNECTIONS)]
    try:

        def work(c: int) -> Callable[[], None]:
            farm = farms[c]
            spec = farm.python_spec("bench.jobs:noop", {"n": 0}, order_key="warm")
            farm.enqueue(spec)  # the connection and the first plan: not timed

            def each() -> None:
                for n in range(per):
                    farm.enqueue(farm.python_spec("bench.jobs:noop", {"n": n}, order_key=f"req-{c}-{n % 50}"))

            return each

        return in_parallel(work)
    finally:
        for farm in farms:
            farm.close()


CALL = "SELECT qp_enqueue('python', 'bench.jobs:noop', jsonb_build_object('n', %(n)s), 'default', %(request)s)"
TRIGGERED = "INSERT INTO esb_log (request_id, seq, message) VALUES (%(request)s, %(n)s, 'a log record')"


MADE = """import sys
from queueprocessor.farm import Farm
Farm(sys.argv[1]).close()
"""
PUSH_OFF = "DROP TRIGGER IF EXISTS qp_jobs_notify ON qp_jobs; DROP TRIGGER IF EXISTS qp_jobs_push ON qp_jobs"


class Heard:
    """A LISTENing connection on the jobs channel, counting the notices it hears while the block runs (and for
    `settle` seconds after, for those still on their way)."""

    def __init__(self, url: str, settle: float = 0.5):
        import psycopg

        self.conn = psycopg.connect(dsn_of(url), autocommit=True)
        self.conn.execute("LISTEN qp_jobs")
        self.settle, self.count = settle, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._count)

    def _count(self) -> None:
        while not self._stop.is_set():
            self.count += sum(1 for _ in self.conn.notifies(timeout=0.05))

    def __enter__(self) -> "Heard":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        time.sleep(self.settle)
        self._stop.set()
        self._thread.join()
        self.conn.close()


def pushed(tree, url: str, count: int, writers: int, push: bool) -> tuple[float, int]:
    """`count` single-job qp_enqueue commits from `writers` connections on a farm database made by the code of
    `tree` (its trigger dropped without `push`): the seconds they took, and the notices a listener heard (the
    writers' first, untimed, commits included)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run([sys.executable, "-c", MADE, url], cwd=tree, env=env, check=True, capture_output=True)
    if not push:
        import psycopg

        with psycopg.connect(dsn_of(url), autocommit=True) as conn:
            conn.execute(PUSH_OFF)
    with Heard(url) as heard:
        seconds = by_sql(url, count, CALL, writers, made=True)
    return seconds, heard.count


def push_main(args) -> None:
    """The commits of single-job enqueues and the notices they send: --before's tree and this one, push on and
    off, 8 and 32 writers, each case on a fresh database, the rounds in turn."""
    import tempfile
    from pathlib import Path

    from common import ROOT, fresh_database, load_average, postgres, print_table, source_tree

    print(f"push: {args.jobs:,} qp_enqueue commits, {args.rounds} rounds; {load_average()}", flush=True)
    cases = [(side, push, writers) for side in ("before", "after") for push in (True, False) for writers in (8, 32)]
    timed: dict[tuple, list[tuple[float, int]]] = {case: [] for case in cases}
    with tempfile.TemporaryDirectory() as tmp, postgres(max_connections=100) as server:
        trees = {"before": source_tree(args.before, Path(tmp)), "after": ROOT}
        for round_ in range(args.rounds):
            for side, push, writers in cases[:: 1 if round_ % 2 == 0 else -1]:
                url = fresh_database(server, "sqlpush")
                timed[(side, push, writers)].append(pushed(trees[side], url, args.jobs, writers, push))
    rows = []
    for side, push, writers in cases:
        runs = timed[(side, push, writers)]
        count = args.jobs // writers * writers
        notices = sorted(n for _, n in runs)
        rows.append(
            [
                f"{side} ({args.before if side == 'before' else 'this tree'})",
                "on" if push else "off (no trigger)",
                writers,
                rate(count, [seconds for seconds, _ in runs]),
                f"{statistics.median(notices):,.0f} ({notices[0]:,}-{notices[-1]:,}) of {count + writers:,}",
            ]
        )
    print_table(["code", "push", "writers", "commits/s, median (range)", "notices, median (range)"], rows)
    print(load_average())


def rate(count: int, seconds: list[float]) -> str:
    rates = sorted(count / s for s in seconds)
    return f"{statistics.median(rates):,.0f} ({rates[0]:,.0f}-{rates[-1]:,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4_000, help="jobs a way and round (default 4,000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each way once a round (default 3)")
    parser.add_argument("--quick", action="store_true", help="800 jobs, one round: proves it works")
    parser.add_argument("--push", action="store_true", help="notices and commits/s, push on and off, beside --before")
    parser.add_argument("--before", default="409d36d", help="with --push: the git ref beside this tree (%(default)s)")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.rounds = 800, 1
    if args.push:
        return push_main(args)
    count = args.jobs // CONNECTIONS * CONNECTIONS

    from common import fresh_database, load_average, postgres, print_table

    print(
        f"enqueue of {count:,} jobs one a transaction from {CONNECTIONS} connections, rounds: {args.rounds}; "
        f"{load_average()}",
        flush=True,
    )
    ways = {
        "qp_enqueue(...) from 8 connections": lambda url: by_sql(url, count, CALL),
        "a log row whose trigger calls qp_enqueue, 8 connections": lambda url: by_sql(url, count, TRIGGERED),
        "Farm.enqueue(spec) from 8 threads, a Farm each": lambda url: by_api(url, count),
    }
    timed: dict[str, list[float]] = {name: [] for name in ways}
    with postgres() as server:
        for round_ in range(args.rounds):
            turn = 1 if round_ % 2 == 0 else -1
            for name, way in list(ways.items())[::turn]:
                timed[name].append(way(fresh_database(server, "sqlenqueue")))
    print_table(
        ["enqueue, one job a transaction", "jobs/s, median (range)"], [[n, rate(count, s)] for n, s in timed.items()]
    )
    print(load_average())


if __name__ == "__main__":
    main()
