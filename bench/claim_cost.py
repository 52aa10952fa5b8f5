"""The claim's cost to PostgreSQL per job: server time (pg_stat_statements), buffers and the plan of the claim a node
makes while it drains a backlog of batch-function jobs, beside another tree's code in the same run.

Each tree gets a fresh database on one throwaway PostgreSQL server that counts its statements, and a process of
its own importing the code measured. It first writes `--days` days of `--finished` succeeded jobs a day, as a farm
keeping a week of them has: on schema 14's partitioned qp_jobs, a range each (docs/design.md §11), so that the
claim runs with ten ranges present (a week's, the open one and two ahead). Then it enqueues `--backlog` batch no-op
jobs (bench.jobs:noop_batch), analyses the table, then claims and finishes them `--batch` at a time as a node's
claims of a backlog do (no take-over of expired leases, leases that ran out before now), until none is left.
Autovacuum is off for the jobs' tables, as in bench/wal.py: a drain outruns it, so every claim walks the dead
entries the claims before it left. Halfway, one claim runs under EXPLAIN (ANALYZE, BUFFERS) (rolled back) and its
plan is printed with --plan.

Server time per job (mean_exec_time / rows) moves with the machine's load; buffers per job do not.

    python bench/claim_cost.py                     # 100,000 jobs, claims of 1,000, beside main (--before REF)
    python bench/claim_cost.py --quick --plan      # 20,000 jobs, and the halfway claim's plan
    python bench/claim_cost.py --before ''         # this tree only
"""

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

FILLED = (
    "INSERT INTO qp_jobs (executor, target, method, state, priority, run_at, created_at, started_at, finished_at, "
    "attempts, max_attempts, fence, cancel_requested, kind, queue, gated) SELECT 'python', 'bench.jobs:noop_batch', "
    "'GET', 'succeeded', 0, t, t, t, t, 1, 1, 1, false, 'job', 'default', false "
    "FROM generate_series(1, :n), extract(epoch FROM now()) AS t"
)


def a_week_kept(store: Any, engine: Any, days: int, finished: int) -> None:
    """`days` days of `finished` succeeded jobs each, kept (a week's retention): on a partitioned qp_jobs (schema
    14) each day fills a range whose end the sequence then passes, as a day's enqueues would (setval), and the
    node's housekeeping (prune_ranges) makes the ranges ahead: `days` closed, the open one and AHEAD more."""
    from sqlalchemy import text

    for _ in range(days):
        with engine.begin() as conn:
            conn.execute(text(FILLED), dict(n=finished))
        if hasattr(store.jobs, "prune_ranges"):
            from queueprocessor.store.job_partitions import next_id, parts

            with engine.begin() as conn:
                at = next_id(conn)
                [open_range] = [part for part in parts(conn) if part.lo is not None and part.lo <= at < part.hi]
                conn.execute(text("SELECT setval('qp_jobs_id_seq', :last)"), dict(last=open_range.hi - 1))
            store.jobs.prune_ranges(7 * 86400.0)


def drain(url: str, backlog: int, batch: int, days: int, finished: int) -> dict:
    """In the child: the drain, its statements' figures from pg_stat_statements, and the halfway claim's plan."""
    from sqlalchemy import text

    from queueprocessor.farm import Farm
    from queueprocessor.rules.job import Ending, JobSpec
    from queueprocessor.rules.states import Outcome
    from queueprocessor.store.sql.claim import claim_statement
    from queueprocessor.store.types import ClaimRequest

    with Farm(url) as farm:
        store, engine = farm._store, farm._engine
        a_week_kept(store, engine, days, finished)
        with engine.begin() as conn:  # each partition's own (PostgreSQL refuses it on a partitioned table)
            tables = conn.execute(
                text("SELECT relname FROM pg_class WHERE relname LIKE 'qp\\_jobs%' AND relkind = 'r'")
            )
            for table in tables.scalars().all():
                conn.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = off)"))
            partitions = conn.execute(text("SELECT count(*) FROM pg_inherits WHERE inhparent = 'qp_jobs'::regclass"))
            present = partitions.scalar_one()
        store.jobs.enqueue(JobSpec(executor="python", target="bench.jobs:noop_batch"), count=backlog)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
            conn.execute(text("ANALYZE qp_jobs"))
            conn.execute(text("SELECT pg_stat_statements_reset()"))
        me = store.machines.register(
            name="c", host="h", instance=f"c-{os.getpid()}", pid=1, version="t", capacity=batch
        )
        plan, done, batches = "", 0, 0
        while True:
            request = ClaimRequest(me, batch, lease=300, take_expired=False, expired_before=store.ask_time())
            if batches == backlog // batch // 2:
                shape = store.claim_shape(request.limit, **request.shape())
                compiled = claim_statement(shape).compile(dialect=engine.dialect)
                raw = engine.raw_connection()
                try:
                    with raw.cursor() as cursor:
                        cursor.execute(
                            "EXPLAIN (ANALYZE, BUFFERS) " + compiled.string, compiled.construct_params(request.params())
                        )
                        plan = "\n".join(row[0] for row in cursor.fetchall())
                    raw.rollback()
                finally:
                    raw.close()
            claimed = store.jobs.claim(request)
            if not claimed:
                break
            store.runs.finish_many(me, [Ending(job, Outcome.SUCCEEDED) for job in claimed])
            done += len(claimed)
            batches += 1
        with engine.connect() as conn:
            stats = conn.execute(
                text(
                    "SELECT query, calls, rows, total_exec_time, shared_blks_hit + shared_blks_read "
                    "FROM pg_stat_statements WHERE query NOT LIKE 'EXPLAIN%' ORDER BY total_exec_time DESC LIMIT 3"
                )
            ).all()
    figures: dict = {"jobs": done, "plan": plan, "partitions": present}
    for sql, calls, rows, total, blocks in stats:
        step = "claim" if "FOR UPDATE SKIP LOCKED" in sql else "finish" if "finished_at" in sql else sql[:60]
        figures.setdefault(step, dict(calls=calls, rows=rows, ms=total, blocks=blocks))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a backlog of 20,000")
    parser.add_argument("--backlog", type=int, help="jobs enqueued and drained (default 100,000)")
    parser.add_argument("--batch", type=int, default=1000, help="jobs per claim and per finish")
    parser.add_argument("--plan", action="store_true", help="print the halfway claim's plan of each tree")
    parser.add_argument("--before", metavar="REF", default="main", help="also measure the code at this git ref")
    parser.add_argument("--days", type=int, default=7, help="days of finished jobs kept before the backlog")
    parser.add_argument("--finished", type=int, default=10000, help="finished jobs a day")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.backlog = args.backlog or (20000 if args.quick else 100000)
    if args.child:  # figures, and the code that made them (see common.run_on)
        import queueprocessor

        found = drain(args.child[1], args.backlog, args.batch, args.days, args.finished)
        print(json.dumps(found | {"code": queueprocessor.__file__}))
        return
    from common import ROOT, fresh_database, load_average, postgres, print_table, run_on, source_tree

    print(f"{args.backlog:,} batch no-op jobs, claimed and finished {args.batch:,} at a time; {load_average()}")
    with tempfile.TemporaryDirectory(prefix="qp-before-") as old:
        trees = [("this tree", ROOT)] + ([(args.before, source_tree(args.before, Path(old)))] if args.before else [])
        with postgres(stat_statements=True) as server:
            common = ["--backlog", str(args.backlog), "--batch", str(args.batch), "--days", str(args.days)]
            common += ["--finished", str(args.finished)]
            found = {
                label: run_on(root, __file__, *common, "--child", "drain", fresh_database(server, "claim"))
                for label, root in trees
            }
    rows = []
    for label, f in found.items():
        for step in ("claim", "finish"):
            s = f.get(step)
            if s:
                per_job = s["ms"] / max(s["rows"], 1)
                rows.append(
                    [
                        label,
                        f["partitions"],
                        step,
                        s["calls"],
                        s["rows"],
                        f"{per_job * 1000:.1f}",
                        f"{s['blocks'] / max(s['rows'], 1):.2f}",
                    ]
                )
    print_table(["code", "partitions", "step", "calls", "rows", "server us/job (ms/1,000)", "buffers/job"], rows)
    if args.plan:
        for label, f in found.items():
            print(f"\n{label}: the halfway claim\n{f['plan']}")


if __name__ == "__main__":
    main()
