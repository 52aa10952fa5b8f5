"""Queues: what named queues, a limited queue and order keys cost a busy farm, beside one queue.

Every case gets a fresh database on the same throwaway PostgreSQL server and the same worker processes
(`queueprocessor node --capacity C`), all started and idle before the backlog is written in one statement;
the clock is the database's, from that commit to the end of the last job measured (its finished_at), and a
case's rate counts every job that ended in between. Jobs are the no-op Python function of bench/jobs.py, so
what is measured is the farm, not the work.

- single: the backlog in one queue, `default` (today's figure, the baseline of this run);
- queues8: the same backlog spread over q0..q7, every node serving every queue;
- limited: the same, with q0 limited to --limit running jobs farm-wide (a claim that may start one locks q0's
  row and counts on it). Measured until the seven unlimited queues are drained: the farm's rate (their jobs
  and the q0 jobs that ended meanwhile), and, as `limited: q1-q7`, theirs alone (what a limited queue costs
  the rest of the farm); q0's own drain is printed beside them;
- paused: the same, with q0 paused until the seven others are drained (its jobs waiting ahead of theirs all
  along: a held-back queue's jobs are gated, out of the index the others' claims walk; docs/design.md §9), then resumed;
- unordered / ordered: --keys keys x --per-key jobs, interleaved as log records arrive (k0 #0, k1 #0, ...
  k0 #1, ...), without and with order keys: each key's jobs then run one at a time, in order.

- graphile: the ordered case on Graphile Worker 0.16 (npm `graphile-worker`, Node 20), whose jobs with the
  same `queue_name` run one at a time in order: the same keys, jobs (a no-op task), processes and concurrency
  on the same server, its jobs added by its own `graphile_worker.add_job` in one statement. Installed with npm
  into ~/.cache/queueprocessor-bench/graphile, never into the project.

Target: queues8 and limited within 10 % of single; ordered beside unordered, and at least 2x graphile.

    python bench/queues.py                      # 20,000 jobs; 2 and 4 processes
    python bench/queues.py --quick              # 4,000 jobs; 2 processes
    python bench/queues.py --processes 2 --cases single,queues8,limited --keys 4000 --per-key 50 --rounds 12
                                                # the published comparison: 200,000 jobs, drains of 7-9 s
    python bench/queues.py --processes 2 --cases single,limited --rounds 8 --before REF   # REF's nodes beside

One drain of 20,000 jobs lasts a few seconds, and on a shared machine the same workload moves +-20 % from one
to the next (on 2 cores, one round's ratio of two 3 s drains spans 0.6-1.3): compare long drains with
--rounds, which interleaves the cases (each round in a rotated order) and reports each case's median and
spread, and its ratio to the baseline taken within each round. --before REF runs the nodes of the code at
git REF (same schema) as well, its cases interleaved with this tree's in every round.
"""

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path
from statistics import median

from common import ROOT, farm, load_average, postgres, print_table, query, rotated, source_tree, wait_for
from sqlalchemy import text

from queueprocessor.store.database import open_engine

try:
    from queueprocessor.store.sql.gates import regate_statements
except ImportError:  # the code measured predates gated jobs (schema 6, docs/design.md §9)
    regate_statements = None

CASES = ("single", "queues8", "limited", "paused", "unordered", "ordered", "graphile")
GRAPHILE = Path.home() / ".cache" / "queueprocessor-bench" / "graphile"
# A Graphile Worker process: a no-op task, its logs silenced (it logs every job), "ready" once it listens.
GRAPHILE_WORKER = """
const { run, Logger } = require("graphile-worker");
(async () => {
  const runner = await run({
    connectionString: process.env.DSN, concurrency: Number(process.env.CONCURRENCY), pollInterval: 1000,
    logger: new Logger(() => () => {}), taskList: { noop: async () => {} },
  });
  console.log("ready");
  await runner.promise;
})();
"""


def graphile_ready() -> Path:
    """Graphile Worker 0.16 installed (npm) beside its worker script; the script's path."""
    if not (GRAPHILE / "node_modules" / "graphile-worker").exists():
        GRAPHILE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "graphile-worker@0.16"],
            cwd=GRAPHILE,
            check=True,
            capture_output=True,
        )
    script = GRAPHILE / "worker.js"
    script.write_text(GRAPHILE_WORKER)
    return script


def run_graphile(server, processes: int, count: int, capacity: int, keys: int, patience: float) -> float:
    """The ordered backlog on Graphile Worker: jobs per second (by what it finished, if it is still at it after
    `patience` seconds)."""
    with farm(server=server, prefix="graphile", open=False, drop=True) as run:  # the database dropped at its end
        return graphile_drain(run.url, processes, count, capacity, keys, patience)


def graphile_drain(url: str, processes: int, count: int, capacity: int, keys: int, patience: float) -> float:
    """run_graphile's drain on the database at `url`."""
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    script = graphile_ready()
    env = dict(os.environ, DSN=dsn, CONCURRENCY=str(capacity))
    workers = []
    try:
        for _ in range(processes):  # one at a time: the first installs its schema
            worker = subprocess.Popen(
                ["node", str(script)],
                cwd=GRAPHILE,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            workers.append(worker)
            if worker.stdout.readline().strip() != "ready":
                raise RuntimeError("a Graphile Worker process did not start")
        time.sleep(1.0)  # listening
        started = time.monotonic()
        query(
            url,
            "SELECT count(graphile_worker.add_job('noop', '{}'::json, queue_name := 'k' || (g % :keys))) "
            "FROM (SELECT g FROM generate_series(0, :n - 1) g ORDER BY g) s",
            keys=keys,
            n=count,
        )
        enqueued = time.monotonic()
        engine = open_engine(url, pool_size=1)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            left = text("SELECT count(*) FROM graphile_worker._private_jobs")
            while (waiting := conn.execute(left).scalar()) and time.monotonic() - enqueued < patience:
                time.sleep(0.05)
        done = time.monotonic()
        engine.dispose()
    finally:
        for worker in workers:
            worker.terminate()
            worker.wait()
    rate = (count - waiting) / (done - enqueued)
    partial = f", only {count - waiting} of {count} done when it ran out of patience" if waiting else ""
    print(
        f"  {'graphile':10} x{processes}: {rate:8.0f} jobs/s (add_job {enqueued - started:.2f} s, "
        f"drain {done - enqueued:.2f} s{partial})",
        flush=True,
    )
    return rate


def backlog(url: str, count: int, queues: int, keys: int) -> None:
    """`count` no-op jobs in one INSERT: round-robin over `queues` queues (q0.. or default), and over `keys`
    order keys (k0..) when `keys`, in id order k0, k1, ..., k0, k1, ...; gated in the same commit where their
    queue holds them back."""
    queue = "'default'" if queues == 1 else f"'q' || (g % {queues})"
    key = f"'k' || (g % {keys})" if keys else "NULL"
    engine = open_engine(url, pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO qp_jobs (executor, target, method, state, priority, run_at, created_at, attempts, "
                    "max_attempts, fence, cancel_requested, kind, queue, order_key) "
                    "SELECT 'python', 'bench.jobs:noop', 'GET', 'queued', 0, extract(epoch from clock_timestamp()), "
                    f"extract(epoch from clock_timestamp()), 0, 3, 0, false, 'job', {queue}, {key} "
                    "FROM generate_series(0, :n - 1) g ORDER BY g"
                ),
                dict(n=count),
            )
            for statement in regate_statements() if regate_statements else ():  # gated as Store.enqueue gates them
                conn.execute(statement)
    finally:
        engine.dispose()


def run_case(
    server,
    case: str,
    processes: int,
    count: int,
    capacity: int,
    limit: int,
    keys: int,
    patience: float,
    root: Path = ROOT,
) -> dict[str, float]:
    """Drain the case's backlog with `processes` nodes running the code in `root`: jobs per second, by figure
    (the case's own, and for the cases with q0 held back, also the seven other queues' alone). Timed in database
    time, from the backlog's commit to the last measured job's end (finished_at), so the 0.2 s polls that wait
    for it add nothing."""
    if case == "graphile":
        return {case: run_graphile(server, processes, count, capacity, keys, patience)}
    held_back = case in ("limited", "paused")
    with farm(
        processes,
        server=server,
        prefix="queues",
        settings={},
        drop=True,  # gone before the next case: its dead rows would keep autovacuum busy
        root=root,
        capacity=capacity,
        allow_module="bench.jobs",
    ) as run:
        url, farm_ = run.url, run.farm
        wait_for(lambda: len(farm_.serving("q0")) == processes, 60, "nodes to join")
        time.sleep(2.5)  # the join delay: every node takes turns
        if held_back:
            farm_.enqueue_python("bench.jobs:noop", queue="q0")
            if case == "limited":
                farm_.set_queue("q0", limit=limit)
            else:
                farm_.pause_queue("q0")
            time.sleep(1.5)  # every node has read the setting at a heartbeat
        queues = 8 if case in ("queues8", "limited", "paused") else 1
        ordered = keys if case == "ordered" else 0
        started = time.monotonic()
        backlog(url, count, queues, ordered)
        enqueued = time.monotonic()
        with farm_._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:  # one cheap query a poll
            begun = float(conn.execute(text("SELECT extract(epoch from clock_timestamp())")).scalar())
            rest = text("SELECT EXISTS (SELECT 1 FROM qp_jobs WHERE state IN ('queued', 'running') AND queue <> 'q0')")
            while held_back and conn.execute(rest).scalar():
                time.sleep(0.2)
            if case == "paused":
                farm_.resume_queue("q0")
            left = text("SELECT EXISTS (SELECT 1 FROM qp_jobs WHERE state IN ('queued', 'running'))")
            while conn.execute(left).scalar():
                time.sleep(0.2)
        failed = query(url, "SELECT count(*) FROM qp_jobs WHERE state <> 'succeeded'")[0][0]
        if failed:
            raise RuntimeError(f"{case}: {failed} jobs did not succeed")
        others = "queue <> 'q0'" if held_back else "true"
        [(ended, last, within, measured)] = query(
            url,
            f"SELECT max(finished_at) FILTER (WHERE {others}), max(finished_at), "
            f"count(*) FILTER (WHERE finished_at <= (SELECT max(finished_at) FROM qp_jobs WHERE {others})), "
            f"count(*) FILTER (WHERE {others}) FROM qp_jobs WHERE finished_at > :begun",
            begun=begun,
        )
    drain = ended - begun
    rates = {case: within / drain}
    tail = ""
    if case == "limited":
        rates["limited: q1-q7"] = measured / drain
        tail = (
            f"; q1-q7 alone {measured / drain:.0f} jobs/s; q0 limited to {limit}: {within - measured} of its "
            f"jobs ended meanwhile, all after {last - begun:.2f} s"
        )
    elif case == "paused":
        tail = f"; q0 resumed then, drained after {last - begun:.2f} s"
    print(
        f"  {case:10} x{processes}: {within / drain:8.0f} jobs/s, every job that ended in the drain (write "
        f"{enqueued - started:.2f} s, drain {drain:.2f} s{tail})",
        flush=True,
    )
    return rates


def summary(rates: dict, cases: list[str], columns: list, rounds: int) -> list[list]:
    """A row per case: per column (node count, and the code measured), its median jobs/s over the rounds
    (min-max), and its median ratio to its baseline in the same round (min-max of the rounds' ratios), the cases
    of one round having run within a few minutes."""
    rows = []
    for case in cases:
        row = [case]
        for n in columns:
            own = [rates[case, n, r] for r in range(rounds)]
            cell = f"{median(own):.0f} ({min(own):.0f}-{max(own):.0f})"
            if case == "graphile" and ("ordered", n, 0) in rates:  # how many times its rate ours is, ordered
                times = [rates["ordered", n, r] / rates[case, n, r] for r in range(rounds)]
                cell += f"; ordered: {median(times):.2f}x ({min(times):.2f}-{max(times):.2f})"
            base = "unordered" if case == "ordered" else "single"
            if case not in ("single", "unordered", "graphile") and (base, n, 0) in rates:
                ratios = [rates[case, n, r] / rates[base, n, r] for r in range(rounds)]
                cell += f"; {median(ratios):.2f}x {base} ({min(ratios):.2f}-{max(ratios):.2f})"
            row.append(cell)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4,000 jobs (200 keys x 20), 2 processes")
    parser.add_argument("--processes", help="comma-separated node counts (default 2,4)")
    parser.add_argument("--capacity", type=int, default=32, help="jobs each node runs at once")
    parser.add_argument("--limit", type=int, default=8, help="q0's farm-wide limit in the limited case")
    parser.add_argument("--keys", type=int, help="order keys (default 1,000; 200 with --quick)")
    parser.add_argument("--per-key", type=int, default=20, help="jobs per order key")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every case this many times, interleaved (each round in a rotated order); report medians and min-max",
    )
    parser.add_argument(
        "--patience",
        type=float,
        default=60.0,
        help="seconds Graphile Worker gets before it is rated by the jobs it finished",
    )
    parser.add_argument(
        "--before",
        metavar="REF",
        help="also run the nodes of the code at this git ref (the same "
        "schema), its cases interleaved with this tree's in every round",
    )
    args = parser.parse_args()
    keys = args.keys or (200 if args.quick else 1000)
    count = keys * args.per_key
    processes = [int(p) for p in (args.processes or ("2" if args.quick else "2,4")).split(",")]
    cases = [c.strip() for c in args.cases.split(",")]
    print(
        f"{count} no-op jobs, capacity {args.capacity} per node, q0 limit {args.limit}, {keys} keys x "
        f"{args.per_key}, {args.rounds} round(s); {load_average()}",
        flush=True,
    )
    old = tempfile.TemporaryDirectory(prefix="qp-before-") if args.before else None
    trees = [("", ROOT)] + ([(f"{args.before} ", source_tree(args.before, Path(old.name)))] if old else [])
    rates, figures = {}, {}  # figures: the cases' figures, in the order first seen
    try:
        with postgres() as server:
            for r in range(args.rounds):
                print(f"round {r + 1}: {load_average()}", flush=True)
                for n in processes:
                    for (label, root), case in rotated([(tree, case) for tree in trees for case in cases], r):
                        if label:
                            print(f"  ({label.strip()})", end="", flush=True)
                        for figure, rate in run_case(
                            server, case, n, count, args.capacity, args.limit, keys, args.patience, root
                        ).items():
                            rates[figure, f"{label}x{n}", r] = rate
                            figures.setdefault(figure, None)
    finally:
        if old:
            old.cleanup()
    columns = [f"{label}x{n}" for n in processes for label, _root in trees]
    print_table(
        ["case", *(f"jobs/s {column}: median (min-max); ratio median (min-max)" for column in columns)],
        summary(rates, [f for c in cases for f in figures if f.split(":")[0] == c], columns, args.rounds),
    )
    print(load_average())


if __name__ == "__main__":
    main()
