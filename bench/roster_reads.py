"""Rows read by heartbeats: the whole farm's check-ins against the farm's size, 1 to 64 nodes, with the roster
changing as it does, a git ref's code (`--before`, default main before the roster was read by change) beside this
checkout's.

A steady heartbeat reads the roster version, its own row and the machines that went quiet (none in a healthy
farm). When the version moves (a machine joined, stopped, died or changed state), each node reads machine rows:
before, every row (n nodes x n rows a change); after, only the rows changed since its version (n x 1). So each
window has operators' wishes in it, `--changes` a second, each pausing or resuming the next node in turn (written
on its row as `farm pause` does; the node applies it and moves the version). For a farm of real node processes
grown step by step, this counts over that window at each size:

- rows returned: pg_stat_statements' `rows` of the statements that read qp_machines (what reaches the nodes), and
  of those the roster reads a moved version makes (every row before; the rows changed after);
- roster changes: how far qp_roster.version moved;
- tuples scanned: pg_stat_user_tables' seq_tup_read + idx_tup_fetch on qp_machines (what the server read);
- statements per second, all of the farm's.

PostgreSQL reads a table of a few pages whole (its cheapest plan), so the tuples it scans for a statement that
wants one row still grow with the table at these sizes: the rows returned are what the reads cut.
Counters are flushed by the server about once a second, so a figure is exact to about one second's worth.

    python bench/roster_reads.py              # 1 2 4 8 16 32 64 nodes, 15 s each, before (409d36d) and after
    python bench/roster_reads.py --quick      # 1 4 16 nodes, 6 s each
"""

import argparse
import re
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from common import ROOT, farm, load_average, postgres, print_table, query, source_tree, wait_for
from sqlalchemy import text

from queueprocessor.store.database import open_engine

HEARTBEAT = 1.0
READS_MACHINES = re.compile(r"^\s*SELECT\b.*\bqp_machines\b", re.IGNORECASE | re.DOTALL)
# The reads a moved version makes (RosterStore.read_all, read_changes): the version with machine rows, and no
# suspects (the heartbeat's own read, RosterStore.read_farm, has them).
ROSTER_READ = re.compile(
    r"^\s*SELECT\b(?!.*\bsuspects\b).*\bqp_roster\.version\b.*\bqp_machines\b", re.IGNORECASE | re.DOTALL
)
# An operator's wish on the next node in turn, written on its row as `farm pause` and `farm resume` do.
TOGGLE = text(
    "UPDATE qp_machines SET wish = CASE WHEN state = 'paused' THEN 'resume' ELSE 'pause' END "
    "WHERE name = :name AND state IN ('active', 'paused')"
)


def counters(server, url: str) -> dict:
    """The farm database's counters so far: rows returned by reads of qp_machines, statements, tuples scanned."""
    database = url.rsplit("/", 1)[1]
    rows = query(
        server.url,
        "SELECT s.query, s.calls, s.rows FROM pg_stat_statements s JOIN pg_database d "
        "ON d.oid = s.dbid WHERE d.datname = :db",
        db=database,
    )
    [(seq, fetched)] = query(
        url, "SELECT seq_tup_read, coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables WHERE relname = 'qp_machines'"
    )
    [(version,)] = query(url, "SELECT version FROM qp_roster")
    return Counter(
        returned=sum(r for q, _, r in rows if READS_MACHINES.match(q)),
        roster=sum(r for q, _, r in rows if ROSTER_READ.match(q)),
        changes=version,
        statements=sum(c for _, c, _ in rows),
        scanned=seq + fetched,
    )


def toggling(url: str, names: list[str], per_second: float, stop: threading.Event) -> None:
    """Pause or resume the next of `names` in turn, `per_second`, until `stop`."""
    engine = open_engine(url, pool_size=1)
    try:
        for turn in range(10**9):
            if stop.wait(1 / per_second):
                return
            with engine.begin() as conn:
                conn.execute(TOGGLE, {"name": names[turn % len(names)]})
    finally:
        engine.dispose()


def resume_all(url: str) -> None:
    query(url, "UPDATE qp_machines SET wish = 'resume' WHERE state = 'paused'")


def active(url: str) -> int:
    try:
        return query(url, "SELECT count(*) FROM qp_machines WHERE state = 'active'")[0][0]
    except Exception:  # the tables do not exist until the first node created them
        return 0


def measure(server, label: str, root: Path, sizes: list[int], seconds: float, changes: float) -> list[dict]:
    """Grow one farm of `root`'s code through `sizes`, measuring a window at each with `changes` wishes a second."""
    results = []
    with farm(server=server, prefix="reads", open=False, root=root, heartbeat=HEARTBEAT) as run:
        url = run.url
        for size in sizes:
            for i in range(len(run.nodes), size):
                run.start(f"{label}-{i}")
            wait_for(lambda: active(url) >= size, 60 + 3 * size, f"{size} {label} nodes to join")
            time.sleep(3 * HEARTBEAT)  # past the newcomers' join delay: every node has read the last change
            stop = threading.Event()
            names = [n.name for n in run.nodes]
            toggler = threading.Thread(target=toggling, args=(url, names, changes, stop), name="bench-wishes")
            before, t0 = counters(server, url), time.monotonic()
            if changes:
                toggler.start()
            time.sleep(seconds)
            after, t1 = counters(server, url), time.monotonic()
            stop.set()
            if changes:
                toggler.join()
            resume_all(url)
            dead = [n.name for n in run.nodes if not n.alive()]
            if dead:
                raise RuntimeError(f"nodes died during the window: {dead}")
            kinds = ("returned", "roster", "changes", "scanned", "statements")
            rates = {k: (after[k] - before[k]) / (t1 - t0) for k in kinds}
            results.append({"nodes": size, **rates})
            print(
                f"  {label:6} {size:3} nodes: {rates['returned']:9.1f} rows returned/s, of them by roster reads "
                f"{rates['roster']:9.1f}; {rates['changes']:5.2f} changes/s; {rates['scanned']:9.1f} tuples "
                f"scanned/s, {rates['statements']:7.1f} statements/s",
                flush=True,
            )
    return results


def per_change(result: dict) -> str:
    """Rows a roster change cost each node."""
    if not result["changes"]:
        return "-"
    return f"{result['roster'] / result['changes'] / result['nodes']:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1, 4 and 16 nodes, 6 s each")
    parser.add_argument("--nodes", type=int, nargs="+", help="farm sizes, growing (default 1 2 4 8 16 32 64)")
    parser.add_argument("--seconds", type=float, help="measuring window per size (default 15)")
    parser.add_argument("--changes", type=float, default=1.0, help="operators' wishes a second (default 1; 0: none)")
    parser.add_argument("--before", default="409d36d", help="git ref of the baseline (default 409d36d)")
    args = parser.parse_args()
    sizes = sorted(args.nodes or ([1, 4, 16] if args.quick else [1, 2, 4, 8, 16, 32, 64]))
    seconds = args.seconds or (6.0 if args.quick else 15.0)
    print(
        f"rows read by heartbeats: heartbeat {HEARTBEAT:g} s, {seconds:g} s window per size, {args.changes:g} "
        f"wishes a second; {load_average()}"
    )
    with postgres(stat_statements=True) as server:
        with tempfile.TemporaryDirectory(prefix="qp-before-") as old:
            before = measure(server, "before", source_tree(args.before, Path(old)), sizes, seconds, args.changes)
        after = measure(server, "after", ROOT, sizes, seconds, args.changes)
    print()
    print_table(
        [
            "nodes",
            "rows returned/s before",
            "after",
            "by roster reads before",
            "after",
            "changes/s before",
            "after",
            "rows per change per node before",
            "after",
            "tuples scanned/s before",
            "after",
            "statements/s before",
            "after",
        ],
        [
            [
                b["nodes"],
                f"{b['returned']:.1f}",
                f"{a['returned']:.1f}",
                f"{b['roster']:.1f}",
                f"{a['roster']:.1f}",
                f"{b['changes']:.2f}",
                f"{a['changes']:.2f}",
                per_change(b),
                per_change(a),
                f"{b['scanned']:.0f}",
                f"{a['scanned']:.0f}",
                f"{b['statements']:.1f}",
                f"{a['statements']:.1f}",
            ]
            for b, a in zip(before, after)
        ],
    )
    print(
        "\ntarget: rows a roster change costs each node flat in the farm's size (the rows changed, about 1), where "
        f"reading every row costs the farm's size. {load_average()}"
    )


if __name__ == "__main__":
    main()
