"""Pruning finished jobs on PostgreSQL: this checkout's ranges of job ids dropped whole (schema 14) beside main's
DELETE path (`--before`), in one run, with the tables' and indexes' sizes after a simulated week of traffic and
after the prune.

Each side gets a database of its own on one throwaway server and a process of its own importing its tree's code
(bench/common.py's run_on). Both are filled with the same week: `--jobs` finished jobs (default 10,000,000), their
finish times spread evenly over the 7 days before yesterday, one run row each, 1 in 100 failed, 1 in 20 with a key,
and with `--held N` 1 in N still queued (a job scheduled a year ahead, which holds its range: its other jobs then
pay the DELETE). On schema 14 the week is written a day at a time, each day after the node's upkeep of that day
(job_partitions.upkeep at the day's start): the ranges are what a farm enqueueing that week would have made, about
a day of ids each; then the sequence is moved past the week's last range (today's ids). Then every finished job is
pruned (all are past a keep of an hour) as a node's housekeeping does: `JobStore.prune_ranges` (schema 14 only),
then `JobStore.prune` (batches of PRUNE_BATCH jobs, each with its runs, deps and flow places, one transaction
each) until it finds fewer than a batch, or for at most `--budget` seconds (the rate is then what it did
meanwhile); then the VACUUM the dead rows owe. WAL is the server's between the prune's start and its end.

    python bench/prune.py                          # 10,000,000 jobs beside main (073a0ca)
    python bench/prune.py --quick                  # 200,000 jobs
    python bench/prune.py --held 100000            # 1 in 100,000 jobs scheduled far ahead: every range held
    python bench/prune.py --upgrade                # first, the upgrade of --before's week to this schema, timed
"""

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

DAY = 86400
KEEP = 3600.0  # every job of the week is past it
FINISHED = "('succeeded', 'failed', 'cancelled')"
# The week: job i finished at start + i * step (start: 8 days ago), one run each. Written in chunks of a million.
FILL_JOBS = """
INSERT INTO qp_jobs (id, executor, target, method, state, priority, run_at, created_at, started_at, finished_at,
                     attempts, max_attempts, fence, cancel_requested, kind, queue, key, gated, has_children, pending)
SELECT i, 'python', 'bench.jobs:noop', 'GET',
       CASE WHEN i % :held = 0 THEN 'queued' WHEN i % 100 = 0 THEN 'failed' ELSE 'succeeded' END, 0,
       CASE WHEN i % :held = 0 THEN t + 365 * 86400 ELSE t - 1 END, t - 1, t - 0.5,
       CASE WHEN i % :held = 0 THEN NULL ELSE t END,
       1, 1, 1, false, 'job', 'default', CASE WHEN i % 20 = 0 THEN 'k-' || i END, false, false, 0
FROM generate_series(CAST(:lo AS bigint), :hi) AS i, LATERAL (SELECT :start + i * :step AS t) AS at_
"""
FILL_RUNS = """
INSERT INTO qp_runs (job_id, attempt, machine_id, fence, started_at, finished_at, outcome)
SELECT i, 1, 1, 1, t - 0.5, t, CASE WHEN i % 100 = 0 THEN 'failed' ELSE 'succeeded' END
FROM generate_series(CAST(:lo AS bigint), :hi) AS i, LATERAL (SELECT :start + i * :step AS t) AS at_
WHERE i % :held <> 0
"""
CHUNK = 1_000_000
TABLES = ("qp_jobs", "qp_runs", "qp_payloads", "qp_job_keys")
# The tables holding rows among :tables: each partition of a partitioned one, or the table itself.
LEAVES = """
SELECT leaf FROM unnest(CAST(:tables AS regclass[])) AS t, LATERAL (SELECT relid FROM pg_partition_tree(t)
WHERE isleaf UNION SELECT t WHERE NOT EXISTS (SELECT FROM pg_partition_tree(t))) AS found (leaf)
"""


def sizes(conn: Any) -> tuple[int, int]:
    """Heap (with TOAST) and index bytes of the jobs' tables (each partition's) and the keys' side table."""
    from sqlalchemy import text

    present = [name for name in TABLES if conn.execute(text("SELECT to_regclass(:t)"), dict(t=name)).scalar()]
    row = conn.execute(
        text(f"SELECT sum(pg_table_size(leaf)), sum(pg_indexes_size(leaf)) FROM ({LEAVES}) AS leaves"),
        dict(tables=present),
    ).one()
    return int(row[0] or 0), int(row[1] or 0)


def fill(store: Any, engine: Any, count: int, held: int) -> None:
    """The week, a day at a time; on schema 14 each day after its upkeep, and the sequence past the last range."""
    from sqlalchemy import text

    ranges = hasattr(store.jobs, "prune_ranges")
    start, step = time.time() - 8 * DAY, 7 * DAY / count
    day = -(-count // 7)
    for first in range(1, count + 1, day):
        if ranges:
            from queueprocessor.store.job_partitions import upkeep

            upkeep(engine, start + (first - 1) * step)
        for lo in range(first, min(count, first + day - 1) + 1, CHUNK):
            bounds = dict(lo=lo, hi=min(count, first + day - 1, lo + CHUNK - 1), start=start, step=step, held=held)
            with engine.begin() as conn:
                conn.execute(text(FILL_JOBS), bounds)
                conn.execute(text(FILL_RUNS), bounds)
                conn.execute(text("SELECT setval('qp_jobs_id_seq', :hi)"), bounds)
    if ranges:
        from queueprocessor.store.job_partitions import next_id, parts

        with engine.begin() as conn:
            at = next_id(conn)
            [last] = [part for part in parts(conn) if (part.lo or 0) <= at < part.hi]
            conn.execute(text("SELECT setval('qp_jobs_id_seq', :last)"), dict(last=last.hi - 1))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))


def prune(url: str, count: int, held: int, budget: float) -> dict:
    """In the child: fill, measure, prune as the node's housekeeping does, measure again."""
    from sqlalchemy import text

    from queueprocessor.farm import Farm
    from queueprocessor.store.jobs import PRUNE_BATCH

    with Farm(url) as farm:
        store, engine = farm._store, farm._engine
        fill(store, engine, count, held)

        def wal() -> int:
            with engine.connect() as conn:
                return int(conn.execute(text("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")).scalar_one())

        with engine.connect() as conn:
            week = sizes(conn)
            finished = conn.execute(text(f"SELECT count(*) FROM qp_jobs WHERE state IN {FINISHED}")).scalar_one()
            leaves = conn.execute(text(f"SELECT count(*) FROM ({LEAVES}) AS leaves"), dict(tables=["qp_jobs"])).scalar()
        drops: list[float] = []
        if hasattr(store.jobs, "prune_ranges"):  # each drop's part under the lock timed: what a claim may wait for
            from queueprocessor.store import job_partitions

            detaching = job_partitions._detach

            def timed(*args: Any) -> bool:
                began = time.perf_counter()
                try:
                    return detaching(*args)
                finally:
                    drops.append(time.perf_counter() - began)

            job_partitions._detach = timed
        before, started = wal(), time.perf_counter()
        dropped = store.jobs.prune_ranges(KEEP) if hasattr(store.jobs, "prune_ranges") else 0
        dropping_took, deleted = time.perf_counter() - started, 0
        while time.perf_counter() - started < budget:
            went = store.jobs.prune(KEEP)
            deleted += went
            if went < PRUNE_BATCH:
                break
        took, written = time.perf_counter() - started, wal() - before
        with engine.connect() as conn:
            after = sizes(conn)
        vacuum_started = time.perf_counter()
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM qp_jobs, qp_runs"))
            vacuumed = time.perf_counter() - vacuum_started
            left = conn.execute(text(f"SELECT count(*) FROM qp_jobs WHERE state IN {FINISHED}")).scalar_one()
            clean = sizes(conn)
    return dict(
        partitions=leaves,
        week=week,
        finished=finished,
        dropped=dropped,
        deleted=deleted,
        left=left,
        dropping=dropping_took,
        longest_drop=max(drops, default=0.0),
        took=took,
        wal=written,
        after=after,
        vacuum=vacuumed,
        vacuumed=clean,
    )


def filled(url: str, count: int, held: int) -> dict:
    """In the child (an older tree's code): the week written, nothing pruned: a farm to upgrade."""
    from queueprocessor.farm import Farm

    with Farm(url) as farm:
        fill(farm._store, farm._engine, count, held)
    return {}


def upgraded(url: str) -> dict:
    """In the child (this tree's code): the farm's upgrade to this schema timed, as the first node to start runs it."""
    from sqlalchemy import text

    started = time.perf_counter()
    from queueprocessor.farm import Farm

    with Farm(url) as farm:
        took = time.perf_counter() - started
        with farm._engine.connect() as conn:
            leaves = conn.execute(text(f"SELECT count(*) FROM ({LEAVES}) AS leaves"), dict(tables=["qp_jobs"])).scalar()
            keys = conn.execute(text("SELECT count(*) FROM qp_job_keys")).scalar()
    return dict(took=took, partitions=leaves, keys=keys)


def mb(size: int) -> str:
    return f"{size / 2**20:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000_000)
    parser.add_argument("--held", type=int, default=0, help="1 in N jobs scheduled a year ahead (0: none)")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds the DELETE path may take at most")
    parser.add_argument("--before", metavar="REF", default="073a0ca", help="also measure the code at this git ref")
    parser.add_argument("--quick", action="store_true", help="200,000 jobs")
    parser.add_argument("--upgrade", action="store_true", help="first time the upgrade of --before's filled week")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.budget = 200_000, 120.0
    held = args.held or 2**62
    if args.child:  # figures, and the code that made them (see common.run_on)
        import queueprocessor

        what, url = args.child
        figures = (
            prune(url, args.jobs, held, args.budget)
            if what == "prune"
            else filled(url, args.jobs, held)
            if what == "fill"
            else upgraded(url)
        )
        print(json.dumps(figures | {"code": queueprocessor.__file__}))
        return
    from common import ROOT, fresh_database, load_average, postgres, print_table, run_on, source_tree

    print(f"load before: {load_average()}", flush=True)
    found = {}
    with tempfile.TemporaryDirectory(prefix="qp-before-") as old:
        trees = [("this tree", ROOT)] + ([(args.before, source_tree(args.before, Path(old)))] if args.before else [])
        with postgres() as server:
            common = ["--jobs", str(args.jobs), "--held", str(args.held), "--budget", str(args.budget)]
            if args.upgrade and args.before:  # the older tree's week, then this tree's first node upgrading it
                url = fresh_database(server, "upgrade")
                run_on(trees[1][1], __file__, *common, "--child", "fill", url)
                up = run_on(ROOT, __file__, *common, "--child", "upgrade", url)
                print(
                    f"upgrade of {args.before}'s week of {args.jobs:,} jobs: {up['took']:.1f} s, "
                    f"{up['partitions']} partitions of qp_jobs, {up['keys']:,} keys copied; {load_average()}",
                    flush=True,
                )
            for label, root in trees:
                found[label] = run_on(root, __file__, *common, "--child", "prune", fresh_database(server, "prune"))
    held_note = f", 1 in {args.held:,} held a year ahead" if args.held else ""
    print(f"\n{args.jobs:,} jobs over a simulated week{held_note}; every finished one pruned. MB, seconds.")
    print_table(
        [
            "code",
            "partitions",
            "heap",
            "indexes",
            "finished",
            "dropped",
            "deleted",
            "left",
            "took",
            "of which drops",
            "longest lock",
            "jobs/s",
            "WAL MB",
            "heap+ix after",
            "VACUUM owed",
            "after VACUUM",
        ],
        [
            [
                label,
                r["partitions"],
                mb(r["week"][0]),
                mb(r["week"][1]),
                f"{r['finished']:,}",
                f"{r['dropped']:,}",
                f"{r['deleted']:,}",
                f"{r['left']:,}",
                f"{r['took']:.2f}",
                f"{r['dropping']:.2f}",
                f"{r['longest_drop']:.3f}",
                f"{(r['dropped'] + r['deleted']) / r['took']:,.0f}",
                mb(r["wal"]),
                mb(sum(r["after"])),
                f"{r['vacuum']:.1f}",
                mb(sum(r["vacuumed"])),
            ]
            for label, r in found.items()
        ],
    )
    print(f"load after: {load_average()}")


if __name__ == "__main__":
    main()
