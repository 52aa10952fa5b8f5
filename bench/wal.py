"""WAL per job: what PostgreSQL writes, and the CPU it spends, to claim and to finish a job: figures that do not move
with the machine's load.

Each run gets a fresh database on one throwaway PostgreSQL 15 server (fsync and full-page writes off, as every
bench's) and a process of its own importing the code measured (this tree, or with --before the tree at a git ref,
in the same run). It enqueues `--jobs` batch-function no-op jobs (bench.jobs:noop_batch) in one go, with no payload,
with a 6-key JSON payload (a log record), and with an order key each, then drives the store's own statements as a
node with batch functions does: a claim of `--batch` jobs, then the finish of that batch (each a success), until none
is left. Between the statements it reads the WAL position: the bytes each wrote, and with pg_waldump its records, by
resource manager (heap, btree, GIN...). PostgreSQL's CPU is that of every process of the server (/proc, user +
system), a tick is 10 ms: read it over a whole run, not a batch. Autovacuum is off for the run's tables (each
partition's), so that nothing else writes.

Then the finish's time: `--backlog` jobs enqueued, never analysed, `--timed` batches claimed and finished, the
finish timed; then ANALYZE and as many again. A timed figure: on a busy machine, say its load.

    python bench/wal.py                  # 20,000 jobs, batches of 1,000, beside main (073a0ca)
    python bench/wal.py --quick          # 4,000 jobs, a backlog of 20,000
    python bench/wal.py --before REF     # beside the code at git REF ('' for none)
"""

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

LOG_RECORD = (
    '{"ts": "2025-06-01T12:00:00.%06dZ", "host": "web-3", "level": "info", "service": "checkout", '
    '"message": "order placed", "request_id": "req-%06d"}'
)
KINDS = ("Heap", "Heap2", "Btree", "Gin", "Transaction")
# The jobs measured: no payload; a 6-key JSON payload (a log record); an order key each (schema 14 keeps the running
# job of each order key in a side table, written by a trigger on the claim and on the finish).
KINDS_OF_JOB = {"none": "none", "payload": "6-key JSON", "order": "an order key"}


def server_cpu(postmaster: int) -> float:
    """Seconds of CPU (user + system) of the postmaster's children alive now: the backends, the WAL writer..."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


class Wal:
    """The WAL written between two positions, read back with pg_waldump: records and bytes by resource manager."""

    def __init__(self, bindir: str, pgdata: str):
        self.waldump, self.wal = str(Path(bindir) / "pg_waldump"), str(Path(pgdata) / "pg_wal")

    def records(self, start: str, end: str) -> dict[str, int]:
        out = subprocess.run(
            [self.waldump, "-p", self.wal, "-s", start, "-e", end, "--stats"], capture_output=True, text=True
        ).stdout
        found: dict[str, int] = {}
        for line in out.splitlines():
            m = re.match(r"^(\w+)\s+(\d+) \(\s*[\d.]+\)\s+(\d+)", line)
            if m:
                found[m[1]] = int(m[2])
            m = re.match(r"^Total\s+(\d+)", line)
            if m:
                found["records"] = int(m[1])
        return found


def no_autovacuum(engine: Any) -> None:
    """Autovacuum off for every table of the farm that holds rows (each partition of a partitioned one: schema 14
    partitions qp_jobs, whose own setting PostgreSQL refuses), so that nothing but the statements measured writes."""
    from sqlalchemy import text

    with engine.begin() as conn:
        tables = conn.execute(text("SELECT relname FROM pg_class WHERE relname LIKE 'qp_%' AND relkind = 'r'"))
        for table in tables.scalars().all():
            conn.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = off)"))


def measure(url: str, jobs: int, batch: int, kind: str, wal: Wal, postmaster: int) -> dict[str, float]:
    """In the child: claim and finish `jobs` jobs (`kind`: no payload, a 6-key payload, an order key each), `batch`
    at a time; WAL bytes, records and server CPU per job."""
    import psycopg
    from sqlalchemy import text

    from queueprocessor.farm import Farm
    from queueprocessor.rules.job import Ending, JobSpec
    from queueprocessor.rules.states import Outcome
    from queueprocessor.store.types import ClaimRequest

    spec = JobSpec(executor="python", target="bench.jobs:noop_batch")
    with Farm(url) as farm:
        store, engine = farm._store, farm._engine
        no_autovacuum(engine)
        if kind != "none":  # each job its own log record or order key, through the farm's door (qp_enqueue)
            with engine.begin() as conn:
                conn.execute(
                    text(
                        "SELECT count(qp_enqueue(:executor, :target, "
                        + ("format(:record, i, i)::jsonb)) " if kind == "payload" else "NULL, 'default', 'o-' || i)) ")
                        + "FROM generate_series(1, :jobs) AS i"
                    ),
                    dict(
                        executor=spec.executor, target=spec.target, record=LOG_RECORD.replace("%06d", "%s"), jobs=jobs
                    ),
                )
        else:
            store.jobs.enqueue(spec, count=jobs)
        with engine.begin() as conn:
            conn.execute(text("CHECKPOINT"))
        me = store.machines.register(
            name="wal", host="h", instance=f"wal-{os.getpid()}", pid=1, version="t", capacity=batch
        )
        # A session of its own, outside the farm's pool: the position is read between the store's statements.
        with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:

            def lsn() -> str:
                return conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]

            def diff(a: str, b: str) -> int:
                return int(conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (b, a)).fetchone()[0])

            spans: dict[str, list[tuple[str, str]]] = {"claim": [], "finish": []}
            cpu = {"claim": 0.0, "finish": 0.0}
            done = 0
            while True:
                c0, t0 = lsn(), server_cpu(postmaster)
                claimed = store.jobs.claim(ClaimRequest(me, batch, lease=300))
                c1, t1 = lsn(), server_cpu(postmaster)
                if not claimed:
                    break
                store.runs.finish_many(me, [Ending(job, Outcome.SUCCEEDED) for job in claimed])
                c2, t2 = lsn(), server_cpu(postmaster)
                spans["claim"].append((c0, c1))
                spans["finish"].append((c1, c2))
                cpu["claim"] += t1 - t0
                cpu["finish"] += t2 - t1
                done += len(claimed)
            time.sleep(0.5)  # the WAL writer flushes what the last commits wrote (synchronous_commit is off)
            conn.execute("SELECT pg_switch_wal()")
            figures: dict[str, float] = {"jobs": done}
            for step, ranges in spans.items():
                figures[f"{step} bytes"] = sum(diff(a, b) for a, b in ranges) / done
                counts: dict[str, int] = {}
                for a, b in ranges:
                    for kind, n in wal.records(a, b).items():
                        counts[kind] = counts.get(kind, 0) + n
                for kind, n in counts.items():
                    figures[f"{step} {kind}"] = n / done
                figures[f"{step} cpu us"] = cpu[step] / done * 1e6
    return figures


def finish_time(url: str, backlog: int, batch: int, timed: int) -> dict[str, float]:
    """In the child: ms per 1,000 jobs of the finish, on a never-analysed table of `backlog` jobs, then analysed."""
    from sqlalchemy import text

    from queueprocessor.farm import Farm
    from queueprocessor.rules.job import Ending, JobSpec
    from queueprocessor.rules.states import Outcome
    from queueprocessor.store.types import ClaimRequest

    with Farm(url) as farm:
        store, engine = farm._store, farm._engine
        no_autovacuum(engine)
        store.jobs.enqueue(JobSpec(executor="python", target="bench.jobs:noop_batch"), count=backlog)
        me = store.machines.register(
            name="t", host="h", instance=f"t-{os.getpid()}", pid=1, version="t", capacity=batch
        )
        figures: dict[str, float] = {}
        for label in ("never analysed", "analysed"):
            if label == "analysed":
                with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    conn.execute(text("ANALYZE qp_jobs"))
            spent = 0.0
            for _ in range(timed):
                claimed = store.jobs.claim(ClaimRequest(me, batch, lease=300))
                started = time.perf_counter()
                store.runs.finish_many(me, [Ending(job, Outcome.SUCCEEDED) for job in claimed])
                spent += time.perf_counter() - started
            figures[label] = spent / (timed * batch) * 1000 * 1000
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4,000 jobs, a backlog of 20,000")
    parser.add_argument("--jobs", type=int, help="jobs claimed and finished per run (default 20,000)")
    parser.add_argument("--batch", type=int, default=1000, help="jobs per claim and per finish")
    parser.add_argument("--backlog", type=int, help="jobs enqueued for the finish's time (default 100,000)")
    parser.add_argument("--timed", type=int, default=10, help="batches timed, never analysed and analysed")
    parser.add_argument("--before", metavar="REF", default="073a0ca", help="also measure the code at this git ref")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # figures, and the code that made them (see common.run_on)
        what, url, *rest = args.child
        import queueprocessor

        code = {"code": queueprocessor.__file__}
        if what == "wal":
            bindir, pgdata, postmaster, kind = rest
            wal = Wal(bindir, pgdata)
            print(json.dumps(measure(url, args.jobs, args.batch, kind, wal, int(postmaster)) | code))
        else:
            print(json.dumps(finish_time(url, args.backlog, args.batch, args.timed) | code))
        return
    from common import ROOT, fresh_database, load_average, postgres, print_table, run_on, source_tree

    args.jobs = args.jobs or (4000 if args.quick else 20000)
    args.backlog = args.backlog or (20000 if args.quick else 100000)
    print(f"{args.jobs} batch no-op jobs, claimed and finished {args.batch} at a time; {load_average()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="qp-before-") as old:
        trees = [("this tree", ROOT)] + ([(args.before, source_tree(args.before, Path(old)))] if args.before else [])
        with postgres() as server:
            where = [str(server.bin_dir), str(server.data_dir), str(server.pid)]
            common = ["--jobs", str(args.jobs), "--batch", str(args.batch)]
            wal = {
                (label, kind): run_on(
                    root, __file__, *common, "--child", "wal", fresh_database(server, "wal"), *where, kind
                )
                for kind in KINDS_OF_JOB
                for label, root in trees
            }
            timing = ["--backlog", str(args.backlog), "--batch", str(args.batch), "--timed", str(args.timed)]
            timed = {
                label: run_on(root, __file__, *timing, "--child", "time", fresh_database(server, "wal"))
                for label, root in trees
            }
    rows = []
    for (label, kind), f in wal.items():
        for step in ("claim", "finish", "both"):
            steps = ("claim", "finish") if step == "both" else (step,)

            def per(name: str) -> float:
                return sum(f.get(f"{s} {name}", 0.0) for s in steps)

            rows.append(
                [
                    label,
                    KINDS_OF_JOB[kind],
                    step,
                    f"{per('bytes'):.0f}",
                    f"{per('records'):.2f}",
                    *(f"{per(kind):.2f}" for kind in KINDS),
                    f"{per('cpu us'):.1f}",
                ]
            )
    print_table(
        ["code", "jobs", "step", "WAL B/job", "records/job", *(f"{k}/job" for k in KINDS), "server CPU us/job"],
        rows,
    )
    print(f"\nThe finish's time, ms per {args.batch:,} jobs, {args.timed} batches from a backlog of {args.backlog:,}:")
    print_table(
        ["code", "never analysed", "after ANALYZE"],
        [[label, f"{t['never analysed']:.1f}", f"{t['analysed']:.1f}"] for label, t in timed.items()],
    )


if __name__ == "__main__":
    main()
