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

`--rows N` measures a farm of N machine rows instead, with no node process: the rows registered through the store
(MachineStore.register), then `--changes-made` changes made through the store's own calls in turn (a pause and a
resume, each an operator's wish and the check-in that applies it; a stop; a burial), and after each one the reads
a node's heartbeat makes (node/heartbeat.py: read_farm, then read_changes from its version and catch_up, or
read_all) from one node's position; beside them, main's read of every row (read_all, the statement 409d36d ran at
each moved version), at the same instant. For each read: the rows returned, and the tuples of qp_machines the
server fetched to answer it (EXPLAIN ANALYZE of the same statement with the same parameters: each scan's rows
and rows removed by its filter, times its loops). Once as registered (autovacuum may or may not have analysed
the table yet: it says which), once after ANALYZE.

    python bench/roster_reads.py              # 1 2 4 8 16 32 64 nodes, 15 s each, before (409d36d) and after
    python bench/roster_reads.py --quick      # 1 4 16 nodes, 6 s each
    python bench/roster_reads.py --rows 10000 # 10,000 machine rows, 20 changes, no node process
"""

import argparse
import json
import re
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from common import ROOT, farm, load_average, postgres, print_table, query, source_tree, wait_for
from sqlalchemy import text

from queueprocessor.rules.roster import KnownMachines
from queueprocessor.rules.states import MachineState, Wish
from queueprocessor.store.database import open_engine
from queueprocessor.store.roster import _read_statement, farm_statement
from queueprocessor.store.stores import Store

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


def fetched(engine, statement, params: dict) -> tuple[int, str]:
    """The tuples of qp_machines the server fetched to answer `statement` with `params` (EXPLAIN ANALYZE: each
    scan's rows and rows removed by its filter, times its loops), and how it scanned them."""
    compiled = statement.compile(dialect=engine.dialect)
    with engine.connect() as conn:
        [[plan]] = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + str(compiled), compiled.params | params)
    tuples, scans, nodes = 0, [], [(plan[0] if isinstance(plan, list) else json.loads(plan)[0])["Plan"]]
    while nodes:
        node = nodes.pop()
        nodes += node.get("Plans", [])
        if node.get("Relation Name") == "qp_machines":
            tuples += round((node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"])
            scans.append(node["Node Type"] + (f" {node['Index Name']}" if "Index Name" in node else ""))
    return tuples, ", ".join(scans)


def change(store: Store, turn: int, ids: list[int], known: KnownMachines) -> str:
    """The `turn`th roster change, through the store's own calls on machine ids taken from the end of `ids`: a
    pause, the resume of the same machine (each an operator's wish and the check-in that applies it), a stop, a
    burial (guarded by the last_seen read, as a judge's)."""
    kind = ("pause", "resume", "stop", "burial")[turn % 4]
    machine = ids[-1] if kind == "pause" else ids.pop()  # the machine paused is the one resumed next
    if kind in ("pause", "resume"):
        wish = Wish.PAUSE if kind == "pause" else Wish.RESUME
        store.machines.wish(machine, wish)
        state = MachineState.PAUSED if kind == "pause" else MachineState.ACTIVE
        args = dict(running=0, done=0, failed=0, offset=None, rtt=None, error_bound=None)
        store.machines.heartbeat(machine, state=state, applied_wish=wish, **args)
    elif kind == "stop":
        store.machines.mark_stopped(machine)
    elif not store.roster.bury(machine, next(r["last_seen"] for r in known.machines() if r["id"] == machine)):
        raise RuntimeError(f"machine {machine} was not buried")
    return kind


def learn(store: Store, engine, known: KnownMachines, me: int) -> tuple[str, int, int, str]:
    """Heartbeat._learn_roster's reads from `known`'s version: the heartbeat's read, then nothing when the version
    has not moved, the rows changed since (catch_up), or every row when it is far behind or the rows changed do not
    account for every change. What it read, the rows returned, the tuples the server fetched, the plan."""
    farm_read = store.roster.read_farm(me, 0.0)
    if known.current(farm_read.version):
        return "no row", 0, 0, "-"
    returned, tuples, plans = 0, 0, []
    if (behind := known.behind(farm_read.version)) is not None:
        version, changed = store.roster.read_changes(*behind)
        tuples, how = fetched(engine, _read_statement(True), dict(zip(("since", "most"), behind)))
        if known.catch_up(version, changed, 0.0, farm_read.suspects):
            return "the rows changed", len(changed), tuples, how
        returned, plans = len(changed), [how]
    version, every = store.roster.read_all()
    read, how = fetched(engine, _read_statement(False), {})
    known.replace(version, every, 0.0)
    return ("the rows changed, then " if plans else "") + "every row", returned + len(every), tuples + read, how


def store_reads(server, rows: int, changes: int) -> None:
    """--rows: `rows` machine rows registered through the store, `changes` changes made through it, the reads a
    node makes after each beside main's read of every row (see the module's docstring)."""
    with farm(server=server, prefix="rows") as run:
        engine = open_engine(run.url, pool_size=2)
        try:
            store = Store(engine)
            started = time.monotonic()
            ids = [
                store.machines.register(
                    name=f"sim-{i}", host="bench", instance=f"bench-{i}", pid=i, version="bench", capacity=1
                )
                for i in range(rows)
            ]
            print(f"{rows:,} machine rows registered through the store in {time.monotonic() - started:.0f} s")
            me, known, lagging = ids[0], KnownMachines(), KnownMachines()
            known.replace(*store.roster.read_all(), 0.0)
            totals = []
            for phase in ("as registered", "after ANALYZE"):
                if phase == "after ANALYZE":
                    query(run.url, "ANALYZE qp_machines")
                [(analysed,)] = query(
                    run.url,
                    "SELECT coalesce(last_analyze, last_autoanalyze) IS NOT NULL FROM pg_stat_user_tables "
                    "WHERE relname = 'qp_machines'",
                )
                print(f"\n{phase} (qp_machines {'analysed' if analysed else 'never analysed'}):")
                learn(store, engine, lagging, me)
                table = []
                for turn in range(changes):
                    kind = change(store, turn, ids, known)
                    what, returned, read, how = learn(store, engine, known, me)
                    if what != "the rows changed":
                        raise RuntimeError(f"{kind}: a node one change behind read {what}")
                    beat, _ = fetched(engine, farm_statement(False), {"me": me, "before": 0.0})
                    every = len(store.roster.read_all()[1])
                    main_read, main_how = fetched(engine, _read_statement(False), {})
                    table.append([kind, known.version, returned, read, how, every, main_read, main_how, beat])
                print_table(
                    [
                        "change",
                        "version",
                        "rows returned",
                        "tuples fetched",
                        "plan",
                        "main: rows returned",
                        "tuples fetched",
                        "plan",
                        "heartbeat read: tuples fetched",
                    ],
                    table,
                )
                what, returned, read, how = learn(store, engine, lagging, me)
                print(
                    f"a node {changes} changes behind (a machine paused and resumed among them: its row holds only "
                    f"the newest): read {what}, {returned:,} rows returned, {read:,} tuples fetched ({how})"
                )
                totals.append((phase, table))
            print()
            for phase, table in totals:
                returned, read = sum(r[2] for r in table) / changes, sum(r[3] for r in table) / changes
                main_returned, main_read = sum(r[5] for r in table) / changes, sum(r[6] for r in table) / changes
                print(
                    f"{phase}: per change, a node's read of the rows changed returned {returned:.2f} rows and the "
                    f"server fetched {read:.2f} tuples; main's read of every row returned {main_returned:,.0f} and "
                    f"fetched {main_read:,.0f} (the heartbeat's own read, every beat: {max(r[8] for r in table)} "
                    "tuples at most)"
                )
        finally:
            engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1, 4 and 16 nodes, 6 s each")
    parser.add_argument("--nodes", type=int, nargs="+", help="farm sizes, growing (default 1 2 4 8 16 32 64)")
    parser.add_argument("--seconds", type=float, help="measuring window per size (default 15)")
    parser.add_argument("--changes", type=float, default=1.0, help="operators' wishes a second (default 1; 0: none)")
    parser.add_argument("--before", default="409d36d", help="git ref of the baseline (default 409d36d)")
    parser.add_argument("--rows", type=int, help="instead: this many machine rows and no node process (see above)")
    parser.add_argument("--changes-made", type=int, default=20, help="with --rows: roster changes made (default 20)")
    args = parser.parse_args()
    if args.rows:
        print(f"the reads of a roster change at {args.rows:,} machine rows, through the store; {load_average()}")
        with postgres() as server:
            store_reads(server, args.rows, args.changes_made)
        return
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
