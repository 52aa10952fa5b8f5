"""Idle load: what an idle farm costs the database and each machine.

An idle farm should poll the queue once per period in total, and otherwise
only check in: at most 1/period + 2 x nodes/heartbeat statements per second
(a heartbeat reads what changed in the roster and writes our own row), and an
idle node should use at most 0.3 % of a core (the first target was
2 %). For 1..16 real node processes on PostgreSQL, this counts every
statement the server ran for the farm's database
(pg_stat_statements, BEGIN/COMMIT included) and every node's CPU time
(/proc/<pid>/stat) over a window, and lists the statements by kind. A window
cuts each node's heartbeat (two statements) and the farm's turns at an
arbitrary phase, so a count is exact to +-(2 x nodes + 1) statements: the
rate is judged against the target within that.

    python bench/idle_load.py            # 1, 2, 4, 8, 16 nodes, 30 s each
    python bench/idle_load.py --quick    # 1 and 3 nodes, 6 s each
    python bench/idle_load.py --nodes 16 --queues 8 [--roles] [--limited]   # named queues
    python bench/idle_load.py --nodes 1 4 --seconds 60 --before REF         # the code at REF beside

With --queues N every node serves the queues q0..q(N-1) by name (--roles: node i serves only q(i mod N) and
q(i+1 mod N), so a turn-holder also looks for due work it does not serve; --limited: q0 has a farm-wide limit,
so claims that may take its jobs lock its row first). The target stays 1/period + 2 x nodes/heartbeat.
"""

import argparse
import re
import tempfile
import time
from collections import Counter
from pathlib import Path

from common import ROOT, cpu_seconds, farm, load_average, postgres, print_table, query, source_tree, wait_for

from queueprocessor.farm import Farm

PERIOD = 1.0
HEARTBEAT = 1.0


def statement_counts(server, database: str) -> Counter:
    """Calls per normalised statement text so far, for one database."""
    rows = query(
        server.url,
        "SELECT s.query, s.calls FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = :db",
        db=database,
    )
    counts = Counter()
    for statement, calls in rows:
        counts[" ".join(statement.split())] += calls
    return counts


def kind(statement: str) -> str:
    """A short name for a statement, for the breakdown table: every table it changes (a statement
    with CTEs may change several), or the table it reads (the outer one comes last)."""
    changes = [f"{verb.split()[0].upper()} {table}" for verb, table in _CHANGE.findall(statement)]
    if changes:
        return ", ".join(changes)
    words = statement.split()
    table = next((w.strip('"(').split(".")[0] for w in reversed(words) if w.strip('"(').startswith("qp_")), "")
    return f"{words[0].upper()} {table}".strip()


_CHANGE = re.compile(r'\b(INSERT\s+INTO|(?<!FOR )UPDATE|DELETE\s+FROM)\s+"?(\w+)', re.IGNORECASE)


def served(i: int, queues: int, roles: bool) -> str | None:
    """--queues for node i: none (every queue), all `queues` by name, or with `roles` two of them."""
    if not queues:
        return None
    names = [f"q{(i + k) % queues}" for k in range(2)] if roles else [f"q{k}" for k in range(queues)]
    return ",".join(names)


def measure(
    server, nodes: int, seconds: float, queues: int = 0, roles: bool = False, limited: bool = False, root: Path = ROOT
) -> dict:
    """One farm of `nodes` idle node processes running the code in `root`."""
    with farm(server=server, prefix="idle", open=False, root=root, period=PERIOD, heartbeat=HEARTBEAT) as run:
        url = run.url
        database = url.rsplit("/", 1)[1]
        started = [run.start(f"idle-{i}", queues=served(i, queues, roles)) for i in range(nodes)]
        wait_for(lambda: _joined(url, nodes), 60, f"{nodes} nodes to join")
        # Steady state: every node has taken its first turn (and swept missed schedule occurrences on it).
        wait_for(lambda: _turned(url, nodes), 30 + 2 * nodes * PERIOD, f"{nodes} nodes to take a turn each")
        if limited:
            with Farm(url) as operator:
                operator.set_queue("q0", limit=4)
            time.sleep(2 * HEARTBEAT)  # every node has read it
        before, cpu_before, t0 = (
            statement_counts(server, database),
            [cpu_seconds(n.pid) for n in started],
            time.monotonic(),
        )
        time.sleep(seconds)
        after, cpu_after, t1 = (
            statement_counts(server, database),
            [cpu_seconds(n.pid) for n in started],
            time.monotonic(),
        )
        dead = [n.name for n in started if not n.alive()]
        if dead:
            raise RuntimeError(f"nodes died during the window: {dead}")
    window = t1 - t0
    delta = after - before
    cpu = [(b - a) / window for a, b in zip(cpu_before, cpu_after)]
    by_kind = Counter()
    for statement, calls in delta.items():
        by_kind[kind(statement)] += calls
    return {
        "nodes": nodes,
        "window": window,
        "rate": sum(delta.values()) / window,
        "target": 1 / PERIOD + 2 * nodes / HEARTBEAT,
        "resolution": (2 * nodes + 1) / window,
        "cpu_mean": sum(cpu) / len(cpu),
        "cpu_max": max(cpu),
        "kinds": {k: v / window for k, v in by_kind.items()},
    }


def _turned(url: str, nodes: int) -> bool:
    return query(url, "SELECT count(DISTINCT machine_id) FROM qp_turns")[0][0] >= nodes


def _joined(url: str, nodes: int) -> bool:
    try:
        return query(url, "SELECT count(*) FROM qp_machines WHERE state = 'active'")[0][0] >= nodes
    except Exception:  # the tables do not exist until the first node created them
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 and 3 nodes, 6 s each (under a minute)")
    parser.add_argument("--nodes", type=int, nargs="+", help="farm sizes (default 1 2 4 8 16)")
    parser.add_argument("--seconds", type=float, help="measuring window per size (default 30)")
    parser.add_argument("--queues", type=int, default=0, help="nodes serve queues q0.. by name")
    parser.add_argument("--roles", action="store_true", help="with --queues: each node serves two of them")
    parser.add_argument("--limited", action="store_true", help="with --queues: q0 has a farm-wide limit")
    parser.add_argument("--before", metavar="REF", help="also measure the code at this git ref, each size beside")
    args = parser.parse_args()
    sizes = args.nodes or ([1, 3] if args.quick else [1, 2, 4, 8, 16])
    seconds = args.seconds or (6.0 if args.quick else 30.0)

    shape = (
        f"{args.queues} queues{', roles' if args.roles else ''}{', q0 limited' if args.limited else ''}; "
        if args.queues
        else ""
    )
    print(
        f"idle load: period {PERIOD:g} s, heartbeat {HEARTBEAT:g} s, {seconds:g} s window per size; {shape}"
        f"{load_average()}"
    )
    trees = [("this tree", ROOT)]
    old = tempfile.TemporaryDirectory(prefix="qp-before-")
    if args.before:
        trees.insert(0, (args.before, source_tree(args.before, Path(old.name))))
    try:
        with postgres(stat_statements=True) as server:
            results = [
                measure(server, n, seconds, args.queues, args.roles, args.limited, root) | {"code": label}
                for n in sizes
                for label, root in trees
            ]
    finally:
        old.cleanup()
    print_table(
        [
            "nodes",
            "code",
            "statements/s",
            "counted to +-",
            "target 1/period + 2n/heartbeat",
            "met",
            "node CPU mean",
            "node CPU max",
            "target CPU",
        ],
        [
            [
                r["nodes"],
                r["code"],
                f"{r['rate']:.2f}",
                f"{r['resolution']:.2f}",
                f"{r['target']:.2f}",
                "yes" if r["rate"] <= r["target"] + r["resolution"] else "NO",
                f"{r['cpu_mean'] * 100:.2f}%",
                f"{r['cpu_max'] * 100:.2f}%",
                "<= 0.3%",
            ]
            for r in results
        ],
    )
    print()
    print("statements per second by kind (the per-node ones grow with the farm, the per-period ones must not):")
    kinds = sorted({k for r in results for k in r["kinds"]}, key=lambda k: -results[-1]["kinds"].get(k, 0))
    print_table(
        ["statement"] + [f"{r['nodes']} node{'s' if r['nodes'] > 1 else ''} ({r['code']})" for r in results],
        [[k] + [f"{r['kinds'].get(k, 0):.2f}" for r in results] for k in kinds],
    )
    print(f"\n{load_average()}")


if __name__ == "__main__":
    main()
