"""Rows read by heartbeats: the whole farm's check-ins against the farm's size, 1 to 64 nodes,
before and after the roster version.

Before, every heartbeat read every machine row, so a farm of n nodes read n x n rows per heartbeat. After, a
heartbeat reads the roster version, its own row and the machines that went quiet (none in a healthy farm), and
every row only when the roster changed. For a farm of real node processes grown step by step, the code of a
git ref (`--before`, extracted to a temporary directory) beside this checkout's, this counts over a steady
window at each size:

- rows returned: pg_stat_statements' `rows` of the statements that read qp_machines (what reaches the nodes);
- tuples scanned: pg_stat_user_tables' seq_tup_read + idx_tup_fetch on qp_machines (what the server read);
- statements per second, all of the farm's.

PostgreSQL reads a table of a few pages whole (its cheapest plan), so the tuples it scans for a statement that
wants one row still grow with the table at these sizes: the rows returned are what the roster version cuts.
Counters are flushed by the server about once a second, so a figure is exact to about one second's worth.

    python bench/roster_reads.py              # 1 2 4 8 16 32 64 nodes, 15 s each, before (04b0f48) and after
    python bench/roster_reads.py --quick      # 1 4 16 nodes, 6 s each
"""

import argparse
import re
import tempfile
import time
from collections import Counter
from pathlib import Path

from common import ROOT, farm, load_average, postgres, print_table, query, source_tree, wait_for

HEARTBEAT = 1.0
READS_MACHINES = re.compile(r"^\s*SELECT\b.*\bqp_machines\b", re.IGNORECASE | re.DOTALL)


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
    return Counter(
        returned=sum(r for q, _, r in rows if READS_MACHINES.match(q)),
        statements=sum(c for _, c, _ in rows),
        scanned=seq + fetched,
    )


def active(url: str) -> int:
    try:
        return query(url, "SELECT count(*) FROM qp_machines WHERE state = 'active'")[0][0]
    except Exception:  # the tables do not exist until the first node created them
        return 0


def measure(server, label: str, root: Path, sizes: list[int], seconds: float) -> list[dict]:
    """Grow one farm of `root`'s code through `sizes`, measuring a steady window at each."""
    results = []
    with farm(server=server, prefix="reads", open=False, root=root, heartbeat=HEARTBEAT) as run:
        url = run.url
        for size in sizes:
            for i in range(len(run.nodes), size):
                run.start(f"{label}-{i}")
            wait_for(lambda: active(url) >= size, 60 + 3 * size, f"{size} {label} nodes to join")
            time.sleep(3 * HEARTBEAT)  # past the newcomers' join delay: every node has read the last change
            before, t0 = counters(server, url), time.monotonic()
            time.sleep(seconds)
            after, t1 = counters(server, url), time.monotonic()
            dead = [n.name for n in run.nodes if not n.alive()]
            if dead:
                raise RuntimeError(f"nodes died during the window: {dead}")
            rates = {k: (after[k] - before[k]) / (t1 - t0) for k in ("returned", "scanned", "statements")}
            results.append({"nodes": size, **rates})
            print(
                f"  {label:6} {size:3} nodes: {rates['returned']:9.1f} rows returned/s, "
                f"{rates['scanned']:9.1f} tuples scanned/s, {rates['statements']:7.1f} statements/s",
                flush=True,
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1, 4 and 16 nodes, 6 s each")
    parser.add_argument("--nodes", type=int, nargs="+", help="farm sizes, growing (default 1 2 4 8 16 32 64)")
    parser.add_argument("--seconds", type=float, help="measuring window per size (default 15)")
    parser.add_argument("--before", default="04b0f48", help="git ref of the baseline (default 04b0f48)")
    args = parser.parse_args()
    sizes = sorted(args.nodes or ([1, 4, 16] if args.quick else [1, 2, 4, 8, 16, 32, 64]))
    seconds = args.seconds or (6.0 if args.quick else 15.0)
    print(f"rows read by heartbeats: heartbeat {HEARTBEAT:g} s, {seconds:g} s window per size; {load_average()}")
    with postgres(stat_statements=True) as server:
        with tempfile.TemporaryDirectory(prefix="qp-before-") as old:
            before = measure(server, "before", source_tree(args.before, Path(old)), sizes, seconds)
        after = measure(server, "after", ROOT, sizes, seconds)
    print()
    print_table(
        [
            "nodes",
            "rows returned/s before",
            "after",
            "per node before",
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
                f"{b['returned'] / b['nodes']:.2f}",
                f"{a['returned'] / a['nodes']:.2f}",
                f"{b['scanned']:.0f}",
                f"{a['scanned']:.0f}",
                f"{b['statements']:.1f}",
                f"{a['statements']:.1f}",
            ]
            for b, a in zip(before, after)
        ],
    )
    print(f"\ntarget: rows returned per node flat in the farm's size (about 1 per heartbeat). {load_average()}")


if __name__ == "__main__":
    main()
