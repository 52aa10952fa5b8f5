"""Connections per node: what a farm holds on its database, idle and draining a backlog.

For 1, 8 and 64 real node processes (capacity 32 each, push on) on a throwaway
PostgreSQL, sessions are counted where a database administrator counts them,
in pg_stat_activity, per node process (matched by client port):

- idle: once every node has joined and holds what it settles to;
- busy: the most each node held at once while the farm drained a backlog of
  400 jobs per node (Python jobs sleeping 10 ms), sampled every 50 ms;
- opened: the connections each node opened while draining (client ports seen
  in those samples that were not there idle): a node that closes and opens a
  connection at every busy/idle flip sets one up on its hot path each time;
- idle again: store.KEEP seconds and a heartbeat or two after the drain.

Targets: at most 2 idle (one for statements, one to LISTEN), at most 3 busy,
whatever the capacity. With --before REF the same is measured, in the same run,
for the code at git REF (a temporary checkout): its nodes and its CLI run from
there.

    python bench/connections.py                          # 1, 8, 64 nodes
    python bench/connections.py --nodes 1 8 --before 04b0f48
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from common import ROOT, farm, load_average, postgres, print_table, query, source_tree, wait_for
from sqlalchemy import text

from queueprocessor.store.base import KEEP
from queueprocessor.store.database import open_engine

PYJOBS = "tests.support.pyjobs"
CAPACITY = 32
JOBS_PER_NODE = 400


def sessions(observer, pids: dict[int, str]) -> set[tuple[str, int]]:
    """Client sessions on the farm's database, as (node, client port), by the node process that holds them
    (matched by the client port each node's sockets use: older code names no connection).
    `observer`: a connection."""
    rows = observer.execute(
        text(
            "SELECT client_port FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
    ).all()
    ports = _ports_by_pid(pids)
    return {(ports[port], port) for (port,) in rows if port in ports}


def per_node(seen: set[tuple[str, int]]) -> Counter:
    return Counter(name for name, _port in seen)


def _ports_by_pid(pids: dict[int, str]) -> dict[int, str]:
    """Local TCP port -> node name, for the sockets each node process holds (from /proc)."""
    inodes = {}
    for pid, name in pids.items():
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = fd.readlink().name
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[target[8:-1]] = name
    ports = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[9] in inodes:
            ports[int(fields[1].split(":")[1], 16)] = inodes[fields[9]]
    return ports


def measure(server, nodes: int, root: Path) -> dict:
    with farm(server=server, prefix="conns", open=False, root=root) as run:
        return measured(run, nodes, root)


def measured(run, nodes: int, root: Path) -> dict:
    url = run.url
    subprocess.run(
        [sys.executable, "-m", "queueprocessor.cli", "--db", url, "init-db"],
        cwd=root,
        check=True,
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=str(root)),
    )
    started = [run.start(f"n{i}", capacity=CAPACITY, allow_module=PYJOBS) for i in range(nodes)]
    pids = {node.pid: node.name for node in started}
    engine = open_engine(url)
    observer = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        wait_for(
            lambda: query(url, "SELECT count(*) FROM qp_machines WHERE state = 'active'")[0][0] >= nodes,
            60 + 2 * nodes,
            f"{nodes} nodes to join",
        )
        time.sleep(3)  # every node has taken a turn and settled
        idle = sessions(observer, pids)
        jobs = JOBS_PER_NODE * nodes
        subprocess.run(
            [
                sys.executable,
                "-m",
                "queueprocessor.cli",
                "--db",
                url,
                "enqueue",
                "python",
                f"{PYJOBS}:nap",
                "--payload",
                "0.01",
                "--count",
                str(jobs),
            ],
            cwd=root,
            check=True,
            capture_output=True,
            env=dict(os.environ, PYTHONPATH=str(root)),
        )
        most: list[set] = []
        done = text("SELECT count(*) FROM qp_jobs WHERE state = 'succeeded'")

        def drained() -> bool:
            most.append(sessions(observer, pids))
            return observer.execute(done).scalar() >= jobs

        wait_for(drained, 600, f"{nodes} nodes to drain {jobs} jobs", poll=0.05)
        busy = Counter()
        for sample in most:
            busy |= per_node(sample)
        opened = per_node(set().union(*most) - idle)
        time.sleep(KEEP + 2)
        after = sessions(observer, pids)
    finally:
        observer.close()
        engine.dispose()
    return {"idle": per_node(idle), "busy": busy, "opened": opened, "after": per_node(after)}


def _summary(counts: Counter, nodes: int) -> str:
    values = [counts.get(f"n{i}", 0) for i in range(nodes)]
    return f"{max(values)} max, {statistics.median(values):g} median; {sum(values)} in all"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 8, 64], help="farm sizes (default 1 8 64)")
    parser.add_argument("--before", metavar="REF", help="also measure the code at this git ref, side by side")
    args = parser.parse_args()
    trees = [("after (this tree)", ROOT)]
    old = tempfile.TemporaryDirectory(prefix="qp-before-")
    if args.before:
        trees.insert(0, (f"before ({args.before})", source_tree(args.before, Path(old.name))))
    print(f"connections per node: capacity {CAPACITY}, push on, {JOBS_PER_NODE} jobs per node; {load_average()}")
    rows = []
    try:
        with postgres() as server:
            for nodes in args.nodes:
                for label, root in trees:
                    got = measure(server, nodes, root)
                    rows.append(
                        [
                            nodes,
                            label,
                            _summary(got["idle"], nodes),
                            _summary(got["busy"], nodes),
                            _summary(got["opened"], nodes),
                            _summary(got["after"], nodes),
                        ]
                    )
    finally:
        old.cleanup()
    print_table(
        [
            "nodes",
            "code",
            "idle: sessions per node",
            "draining a backlog: most at once per node",
            "opened while draining, per node",
            "idle again after it",
        ],
        rows,
    )
    print("\ntargets: idle <= 2 per node (statements + LISTEN), busy <= 3, whatever the capacity")
    print(load_average())


if __name__ == "__main__":
    main()
