"""Pruning finished jobs on PostgreSQL: main's DELETE path beside dropping partitions of two candidate layouts,
with the tables' and indexes' sizes after a simulated week of traffic and what each layout costs a claim and a
finish (WAL bytes per job).

Each layout gets a database of its own on one server, filled with the same week: `--jobs` finished jobs (default
10,000,000), their finish times spread evenly over the 7 days before yesterday, one run row each, 1 in 100 failed,
1 in 20 with a key, and 1 in 100,000 still queued (a job scheduled far ahead: what keeps an old partition from
being dropped whole). Then every finished job is pruned (all are past retention):

- `delete`: this checkout's schema and `JobStore.prune` (what a node's housekeeping runs: batches of PRUNE_BATCH
  jobs, each with its runs, deps and flow places, one transaction each) until it finds none, or for at most
  `--budget` seconds (the rate is then what it did meanwhile); then the VACUUM that the dead rows owe.
- `by id`: qp_jobs partitioned by range of id (`--ids` per partition), qp_runs by range of job_id on the same
  bounds, keys unique through a side table (a partitioned table's unique index must hold the partition key). A
  partition is pruned by detaching it, moving its live rows into the default partition, deleting its keys from
  the side table and dropping it (and its runs').
- `by state, then day`: Oban Pro's layout. qp_jobs partitioned by list of state: queued and running in one
  partition, finished jobs in another partitioned by range of finished_at, a day each; qp_runs by range of
  finished_at, a day each; keys through the same side table. A day is pruned by deleting its keys and dropping it.

Beside each: WAL bytes per job of claiming and finishing `--hot` queued jobs in batches of 1,000 (the same plain
statements on every layout), so a layout's cost on the hot path is seen beside its saving in pruning.

    python bench/prune.py                # 10,000,000 jobs; main's DELETE for at most 600 s
    python bench/prune.py --quick        # 200,000 jobs
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import farm, load_average, postgres, print_table, query  # noqa: E402

from queueprocessor.store.jobs import PRUNE_BATCH  # noqa: E402

DAY = 86400
FINISHED = "('succeeded', 'failed', 'cancelled')"
# The week: job i finished at start + i * step (start: 8 days ago), one run each. Written in chunks of a million.
FILL_JOBS = """
INSERT INTO {table} (id, executor, target, method, state, priority, run_at, created_at, started_at, finished_at,
                     attempts, max_attempts, fence, cancel_requested, kind, queue, key, gated, has_children, pending)
SELECT i, 'python', 'bench.jobs:noop', 'GET',
       CASE WHEN i % 100000 = 0 THEN 'queued' WHEN i % 100 = 0 THEN 'failed' ELSE 'succeeded' END, 0,
       CASE WHEN i % 100000 = 0 THEN t + 365 * 86400 ELSE t - 1 END, t - 1, t - 0.5,
       CASE WHEN i % 100000 = 0 THEN NULL ELSE t END,
       1, 1, 1, false, 'job', 'default', CASE WHEN i % 20 = 0 THEN 'k-' || i END, false, false, 0
FROM generate_series(:lo, :hi) AS i, LATERAL (SELECT :start + i * :step AS t) AS at_
"""
FILL_RUNS = """
INSERT INTO {table} (job_id, attempt, machine_id, fence, started_at, finished_at, outcome)
SELECT i, 1, 1, 1, t - 0.5, t, CASE WHEN i % 100 = 0 THEN 'failed' ELSE 'succeeded' END
FROM generate_series(:lo, :hi) AS i, LATERAL (SELECT :start + i * :step AS t) AS at_ WHERE i % 100000 <> 0
"""
FILL_KEYS = (
    "INSERT INTO qp_job_keys (key, job_id) SELECT 'k-' || i, i FROM generate_series(:lo, :hi) AS i WHERE i % 20 = 0"
)
CHUNK = 1_000_000


def wal(url: str) -> int:
    return int(query(url, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])


def sizes(url: str, tables: tuple[str, ...]) -> tuple[int, int]:
    """Heap (with TOAST) and index bytes of `tables` and every partition under them."""
    rows = query(
        url,
        "SELECT sum(pg_table_size(leaf)), sum(pg_indexes_size(leaf)) FROM unnest(CAST(:tables AS regclass[])) AS t, "
        "LATERAL (SELECT relid FROM pg_partition_tree(t) WHERE isleaf UNION SELECT t WHERE NOT EXISTS "
        "(SELECT 1 FROM pg_partition_tree(t))) AS leaves (leaf)",
        tables=list(tables),
    )
    return int(rows[0][0] or 0), int(rows[0][1] or 0)


def fill(url: str, count: int, jobs: str = "qp_jobs", runs: str = "qp_runs", keys: bool = False) -> None:
    start, step = time.time() - 8 * DAY, 7 * DAY / count
    for lo in range(1, count + 1, CHUNK):
        bounds = dict(lo=lo, hi=min(count, lo + CHUNK - 1), start=start, step=step)
        query(url, FILL_JOBS.format(table=jobs), **bounds)
        query(url, FILL_RUNS.format(table=runs), **bounds)
        if keys:
            query(url, FILL_KEYS, lo=bounds["lo"], hi=bounds["hi"])
    query(url, f"SELECT setval('qp_jobs_id_seq', {count})")
    query(url, "VACUUM ANALYZE")


def hot_path(url: str, jobs: str, runs: str, count: int, first: int) -> float:
    """WAL bytes per job of claiming and finishing `count` new queued jobs (ids from `first`), 1,000 a statement."""
    query(
        url,
        f"INSERT INTO {jobs} (id, executor, target, method, state, priority, run_at, created_at, attempts, "
        "max_attempts, fence, cancel_requested, kind, queue, gated, has_children, pending) "
        "SELECT i, 'python', 'bench.jobs:noop', 'GET', 'queued', 0, 0, 0, 0, 1, 0, false, 'job', 'default', false, "
        "false, 0 FROM generate_series(:a, :b) AS i",
        a=first,
        b=first + count - 1,
    )
    query(url, "CHECKPOINT")  # every layout starts with no page logged whole since a checkpoint
    before = wal(url)
    for lo in range(first, first + count, 1000):
        ids = dict(a=lo, b=min(first + count, lo + 1000) - 1)
        query(
            url,
            f"UPDATE {jobs} SET state = 'running', owner = 1, fence = fence + 1, attempts = attempts + 1, "
            "lease_until = extract(epoch from now()) + 60, started_at = extract(epoch from now()) "
            "WHERE id BETWEEN :a AND :b AND state = 'queued'",
            **ids,
        )
        query(
            url,
            f"WITH done AS (UPDATE {jobs} SET state = 'succeeded', owner = NULL, lease_until = NULL, "
            "finished_at = extract(epoch from now()) WHERE id BETWEEN :a AND :b AND state = 'running' AND owner = 1 "
            "RETURNING id, attempts, fence, started_at, finished_at) "
            f"INSERT INTO {runs} (job_id, attempt, machine_id, fence, started_at, finished_at, outcome) "
            "SELECT id, attempts, 1, fence, started_at, finished_at, 'succeeded' FROM done",
            **ids,
        )
    return (wal(url) - before) / count


def index_definitions(url: str, table: str) -> list[str]:
    """The current `table`'s indexes as CREATE INDEX statements on table {t}: its key as a plain index on id (a
    partitioned table's key must hold the partition key: the sequence keeps ids unique), none of its unique
    partial ones (a key's uniqueness moves to a side table; see _key_table)."""
    unique_partial = "indexdef NOT LIKE '%UNIQUE%WHERE%'"
    rows = query(url, f"SELECT indexdef FROM pg_indexes WHERE tablename = :t AND {unique_partial}", t=table)
    return [
        row[0].replace(f" ON public.{table} ", " ON {t} ").replace("INDEX ", "INDEX {t}_", 1).replace("UNIQUE ", "")
        for row in rows
    ]


def case_delete(server, count: int, hot: int, budget: float) -> dict:
    with farm(server=server, prefix="delete", drop=True) as run:
        url = run.url
        fill(url, count)
        week = sizes(url, ("qp_jobs", "qp_runs"))
        hot_wal = hot_path(url, "qp_jobs", "qp_runs", hot, count + 1)
        before, started, pruned = wal(url), time.perf_counter(), 0
        while time.perf_counter() - started < budget:
            went = run.farm._store.jobs.prune(3600.0)  # not the hot path's jobs
            pruned += went
            if went < PRUNE_BATCH:
                break
        took = time.perf_counter() - started
        written = wal(url) - before
        after = sizes(url, ("qp_jobs", "qp_runs"))
        vacuum_started = time.perf_counter()
        query(url, "VACUUM qp_jobs, qp_runs")
        return dict(
            layout="delete (main)",
            week=week,
            hot=hot_wal,
            pruned=pruned,
            took=took,
            wal=written,
            after=after,
            vacuum=time.perf_counter() - vacuum_started,
            keys=0.0,
        )


def finished_jobs(url: str, table: str) -> int:
    """Finished jobs in `table`: counted before and after a prune, outside its timing."""
    return int(query(url, f"SELECT count(*) FROM {table} WHERE state IN {FINISHED}")[0][0])


def _timed(url: str, sql: str) -> float:
    started = time.perf_counter()
    query(url, sql)
    return time.perf_counter() - started


def _key_table(url: str) -> None:
    query(url, "CREATE TABLE qp_job_keys (key varchar(400) PRIMARY KEY, job_id bigint NOT NULL)")
    query(url, "CREATE INDEX ix_qp_job_keys_job ON qp_job_keys (job_id)")


def case_by_id(server, count: int, hot: int, per: int) -> dict:
    with farm(server=server, prefix="byid", drop=True) as run:
        url = run.url
        indexes = index_definitions(url, "qp_jobs")
        query(url, "CREATE TABLE p_jobs (LIKE qp_jobs INCLUDING DEFAULTS, PRIMARY KEY (id)) PARTITION BY RANGE (id)")
        query(url, "CREATE TABLE p_runs (LIKE qp_runs INCLUDING DEFAULTS) PARTITION BY RANGE (job_id)")
        top = count + hot + per
        for n, lo in enumerate(range(1, top, per)):
            for table in ("p_jobs", "p_runs"):
                query(url, f"CREATE TABLE {table}_{n} PARTITION OF {table} FOR VALUES FROM ({lo}) TO ({lo + per})")
        query(url, "CREATE TABLE p_jobs_default PARTITION OF p_jobs DEFAULT")
        query(url, "CREATE TABLE p_runs_default PARTITION OF p_runs DEFAULT")
        for definition in indexes:
            if "_pkey" not in definition:
                query(url, definition.format(t="p_jobs"))
        for definition in index_definitions(url, "qp_runs"):
            query(url, definition.format(t="p_runs"))
        _key_table(url)
        fill(url, count, "p_jobs", "p_runs", keys=True)
        week = sizes(url, ("p_jobs", "p_runs", "qp_job_keys"))
        hot_wal = hot_path(url, "p_jobs", "p_runs", hot, count + 1)
        finished, keys = finished_jobs(url, "p_jobs"), 0.0
        before, started = wal(url), time.perf_counter()
        for n, lo in enumerate(range(1, count + 2 - per, per)):  # every partition of the week's ids
            keys += _drop_id_range(url, n, lo, lo + per)
        took = time.perf_counter() - started
        return dict(
            layout=f"by id ({per:,} a partition)",
            week=week,
            hot=hot_wal,
            pruned=finished - finished_jobs(url, "p_jobs"),
            took=took,
            keys=keys,
            wal=wal(url) - before,
            after=sizes(url, ("p_jobs", "p_runs", "qp_job_keys")),
            vacuum=0.0,
        )


def _drop_id_range(url: str, n: int, lo: int, hi: int) -> float:
    """Prune partition `n` (ids lo..hi-1): its finished jobs' keys leave the side table (timed apart: the
    seconds returned), then its live rows go to the default partition and it goes whole, with its runs'."""
    live = f"state NOT IN {FINISHED}"
    keys = _timed(
        url,
        f"DELETE FROM qp_job_keys WHERE job_id >= {lo} AND job_id < {hi} "
        f"AND job_id NOT IN (SELECT id FROM p_jobs_{n} WHERE {live})",
    )
    query(
        url,
        f"""DO $$ BEGIN
ALTER TABLE p_jobs DETACH PARTITION p_jobs_{n};
ALTER TABLE p_runs DETACH PARTITION p_runs_{n};
INSERT INTO p_jobs SELECT * FROM p_jobs_{n} WHERE {live};
INSERT INTO p_runs SELECT r.* FROM p_runs_{n} AS r JOIN p_jobs_{n} AS j ON j.id = r.job_id WHERE j.{live};
DROP TABLE p_jobs_{n}, p_runs_{n};
END $$""",
    )
    return keys


def case_by_state(server, count: int, hot: int) -> dict:
    with farm(server=server, prefix="bystate", drop=True) as run:
        url = run.url
        indexes = index_definitions(url, "qp_jobs")
        query(url, "CREATE TABLE s_jobs (LIKE qp_jobs INCLUDING DEFAULTS) PARTITION BY LIST (state)")
        query(url, "CREATE TABLE s_jobs_live PARTITION OF s_jobs FOR VALUES IN ('queued', 'running')")
        query(
            url,
            f"CREATE TABLE s_jobs_done PARTITION OF s_jobs FOR VALUES IN {FINISHED} PARTITION BY RANGE (finished_at)",
        )
        query(url, "CREATE TABLE s_runs (LIKE qp_runs INCLUDING DEFAULTS) PARTITION BY RANGE (finished_at)")
        today = int(time.time() // DAY * DAY)
        for day in range(today - 9 * DAY, today + 2 * DAY, DAY):
            query(url, f"CREATE TABLE s_jobs_{day} PARTITION OF s_jobs_done FOR VALUES FROM ({day}) TO ({day + DAY})")
            query(url, f"CREATE TABLE s_runs_{day} PARTITION OF s_runs FOR VALUES FROM ({day}) TO ({day + DAY})")
        query(url, "CREATE TABLE s_jobs_done_default PARTITION OF s_jobs_done DEFAULT")
        query(url, "CREATE TABLE s_runs_default PARTITION OF s_runs DEFAULT")
        for definition in indexes:
            # No key on the parent: it would have to hold state and finished_at, which is NULL until a job ends.
            query(url, definition.format(t="s_jobs"))
        query(url, "CREATE UNIQUE INDEX ux_s_jobs_live_id ON s_jobs_live (id)")
        for definition in index_definitions(url, "qp_runs"):
            query(url, definition.format(t="s_runs"))
        _key_table(url)
        fill(url, count, "s_jobs", "s_runs", keys=True)
        week = sizes(url, ("s_jobs", "s_runs", "qp_job_keys"))
        hot_wal = hot_path(url, "s_jobs", "s_runs", hot, count + 1)
        finished, keys = finished_jobs(url, "s_jobs"), 0.0
        before, started = wal(url), time.perf_counter()
        for day in range(today - 9 * DAY, today, DAY):  # every day before today's
            keys += _timed(
                url, f"DELETE FROM qp_job_keys WHERE job_id IN (SELECT id FROM s_jobs_{day} WHERE key IS NOT NULL)"
            )
            query(url, f"DROP TABLE s_jobs_{day}, s_runs_{day}")
        took = time.perf_counter() - started
        return dict(
            layout="by state, then day",
            week=week,
            hot=hot_wal,
            pruned=finished - finished_jobs(url, "s_jobs"),
            took=took,
            keys=keys,
            wal=wal(url) - before,
            after=sizes(url, ("s_jobs", "s_runs", "qp_job_keys")),
            vacuum=0.0,
        )


def mb(size: int) -> str:
    return f"{size / 2**20:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000_000)
    parser.add_argument("--ids", type=int, default=1_000_000, help="ids per partition of the by-id layout")
    parser.add_argument("--hot", type=int, default=20_000, help="jobs claimed and finished for the WAL figure")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds main's DELETE path may take at most")
    parser.add_argument("--layouts", default="delete,id,state")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.ids, args.hot, args.budget = 200_000, 20_000, 5_000, 120.0
    print(f"load before: {load_average()}")
    chosen = args.layouts.split(",")
    results = []
    with postgres() as server:
        if "delete" in chosen:
            results.append(case_delete(server, args.jobs, args.hot, args.budget))
        if "id" in chosen:
            results.append(case_by_id(server, args.jobs, args.hot, args.ids))
        if "state" in chosen:
            results.append(case_by_state(server, args.jobs, args.hot))
    print(f"\n{args.jobs:,} finished jobs over a simulated week; every finished one pruned. MB, seconds, bytes.")
    print_table(
        [
            "layout",
            "heap",
            "indexes",
            "claim+finish WAL/job",
            "pruned",
            "took",
            "of which keys",
            "jobs/s",
            "WAL",
            "heap+ix after",
            "VACUUM owed",
        ],
        [
            [
                r["layout"],
                mb(r["week"][0]),
                mb(r["week"][1]),
                f"{r['hot']:,.0f}",
                f"{r['pruned']:,}",
                f"{r['took']:.2f}",
                f"{r['keys']:.2f}",
                f"{r['pruned'] / r['took']:,.0f}",
                mb(r["wal"]),
                mb(sum(r["after"])),
                f"{r['vacuum']:.1f}",
            ]
            for r in results
        ],
    )
    print(f"load after: {load_average()}")


if __name__ == "__main__":
    main()
