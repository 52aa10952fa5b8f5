"""The roster version on each backend: a heartbeat reads O(1) rows, every change of the roster
bumps the version and is read back as the rows it changed, every node still computes the same roster (one frozen
across changes too), and a killed machine is judged dead on time."""

import signal
import threading
import time

import pytest
from sqlalchemy import insert, select, text

from queueprocessor.store.roster import RosterStore, _read_statement
from queueprocessor.store.schema import machines, roster_version
from tests.support.work import FAST, NodeProcesses, Nodes, wait_for

DEAD_AFTER = 3 * FAST["heartbeat"]


def version(farm) -> int:
    return farm._store.rows(select(roster_version.c.version))[0][0]


def register(store, name):
    return store.machines.register(name=name, host="h", instance=name, pid=1, version="t", capacity=1)


def beat(store, machine_id, state="active"):
    return store.machines.heartbeat(
        machine_id,
        state=state,
        applied_wish=None,
        running=0,
        done=0,
        failed=0,
        offset=0.0,
        rtt=0.001,
        error_bound=0.0005,
    )


def test_joins_new_states_stops_and_burials_bump_the_version_and_nothing_else_does(farm):
    store, peers = farm._store, farm._store.roster
    v0 = version(farm)
    a, b = register(store, "a"), register(store, "b")
    assert version(farm) == v0 + 2
    assert beat(store, a) and beat(store, b)
    store.machines.wish(a, "pause")
    assert version(farm) == v0 + 2, "a check-in in the same state, or a wish, changes no roster"
    assert beat(store, a, state="paused") and version(farm) == v0 + 3
    assert beat(store, a, state="active") and version(farm) == v0 + 4
    seen = next(m["last_seen"] for m in peers.read_all()[1] if m["id"] == b)
    assert not peers.bury(b, seen - 1.0), "a judge that saw an older last_seen buries nobody"
    assert peers.bury(b, seen) and version(farm) == v0 + 5
    assert not peers.bury(b, seen), "buried once"
    assert {m["id"]: m["state"] for m in peers.read_all()[1]} == {a: "active", b: "dead"}
    assert beat(store, b) and version(farm) == v0 + 6, "a buried machine's check-in revives it"
    store.machines.mark_stopped(a)
    assert version(farm) == v0 + 7
    assert not beat(store, 999), "no such machine"


def test_the_heartbeat_read_answers_with_our_wish_and_only_the_quiet_machines(farm):
    store, peers = farm._store, farm._store.roster
    a, b, c = (register(store, name) for name in "abc")
    store.machines.wish(a, "drain")
    read = peers.read_farm(a, before=store.ask_time() - 60)
    assert read.wish == "drain" and read.suspects == {} and read.version == version(farm)
    assert peers.read_farm(b, before=store.ask_time() - 60).wish is None
    before = store.ask_time()
    beat(store, a)
    beat(store, b)
    read = peers.read_farm(a, before=before)
    assert list(read.suspects) == [c], "only c was last seen before the bound"
    assert read.suspects[c] == next(m["last_seen"] for m in peers.read_all()[1] if m["id"] == c)
    store.machines.mark_stopped(c)
    assert peers.read_farm(a, before=before).suspects == {}, "a stopped machine is nobody's suspect"


def test_a_check_in_writes_its_figures_and_clears_only_the_wish_it_applied(farm):
    """The heartbeat's two statements are built once with everything bound (store/roster.py): each call still
    writes its own values, and the read still answers for its own machine and slot."""
    store, peers = farm._store, farm._store.roster
    a, b = register(store, "a"), register(store, "b")
    seen = store.machines.find(str(a))["last_seen"]
    store.machines.wish(a, "pause")
    time.sleep(0.01)  # the database's clock moves on
    assert store.machines.heartbeat(
        a, state="active", applied_wish="drain", running=2, done=5, failed=1, offset=0.25, rtt=0.002, error_bound=0.001
    )
    row = store.machines.find(str(a))
    assert (row["running"], row["done_count"], row["failed_count"]) == (2, 5, 1)
    assert (row["clock_offset"], row["rtt"], row["error_bound"]) == (0.25, 0.002, 0.001)
    assert row["last_seen"] > seen and row["state"] == "active"
    assert row["wish"] == "pause", "an operator's wish other than the one the node applied is kept"
    assert peers.read_farm(a, before=0.0).wish == "pause" and peers.read_farm(b, before=0.0).wish is None
    v = version(farm)
    assert store.machines.heartbeat(
        a, state="paused", applied_wish="pause", running=0, done=6, failed=1, offset=0.0, rtt=0.001, error_bound=0.0005
    )
    row = store.machines.find(str(a))
    assert row["wish"] is None and row["state"] == "paused" and row["done_count"] == 6
    assert version(farm) == v + 1, "the new state bumped the roster version"
    assert store.turns.take(100, b)
    store.turns.record(100, claimed=3, backlog=True)
    assert peers.read_farm(a, before=0.0, backlog_since=99).backlog_slot == 100
    assert peers.read_farm(a, before=0.0, backlog_since=101).backlog_slot is None
    assert peers.read_farm(a, before=0.0).backlog_slot is None, "no slot asked about"


@pytest.fixture
def nodes(farm):
    started = Nodes(farm)
    yield started
    started.stop_all()


class Spy:
    """Counts the machine rows each node's heartbeat statements return (the real store answers)."""

    def __init__(self, monkeypatch):
        self.beats: list[int] = []
        self.full_reads = 0
        self.changes: list[int] = []  # rows returned by each read of the rows changed since a version
        real_read_farm, real_read_all, real_read_changes = (
            RosterStore.read_farm,
            RosterStore.read_all,
            RosterStore.read_changes,
        )

        def read_farm(peers, machine_id, *args, **kwargs):
            read = real_read_farm(peers, machine_id, *args, **kwargs)
            self.beats.append(max(1, len(read.suspects)))  # one row, or one per suspect
            return read

        def read_all(peers):
            self.full_reads += 1
            return real_read_all(peers)

        def read_changes(peers, since, most):
            version, rows = real_read_changes(peers, since, most)
            self.changes.append(len(rows))
            return version, rows

        monkeypatch.setattr(RosterStore, "read_farm", read_farm)
        monkeypatch.setattr(RosterStore, "read_all", read_all)
        monkeypatch.setattr(RosterStore, "read_changes", read_changes)

    def reset(self):
        self.beats.clear()
        self.changes.clear()
        self.full_reads = 0


def rosters(nodes, at: float) -> list[list[int]]:
    return [n.known.roster(at, n.liveness(), n.config.join_delay) for n in nodes]


def test_nodes_agree_on_the_roster_and_a_steady_heartbeat_reads_one_row_or_so(farm, nodes, monkeypatch):
    spy = Spy(monkeypatch)
    farm_nodes = [nodes(f"n{i}") for i in range(4)]
    wait_for(lambda: all(len(r) == 4 for r in rosters(farm_nodes, farm._store.ask_time())))
    spy.reset()
    time.sleep(10 * FAST["heartbeat"])
    now, _, rows = farm._store.machines.read()
    expected = sorted(m["id"] for m in rows)
    assert rosters(farm_nodes, now) == [expected] * 4
    assert spy.full_reads == 0 and spy.changes == [], "nothing changed: nobody read a row"
    assert len(spy.beats) >= 4 * 8
    assert sum(spy.beats) <= 1.5 * len(spy.beats), f"rows per heartbeat read: {spy.beats}"
    farm.steer("n0", "pause")
    wait_for(lambda: all(r == expected[1:] for r in rosters(farm_nodes[1:], farm._store.ask_time())), timeout=2.0)
    wait_for(lambda: len(spy.changes) >= 4, timeout=2.0)
    time.sleep(3 * FAST["heartbeat"])
    assert spy.changes == [1] * 4, "a pause bumps the version: each node reads the one row it changed, once"
    assert spy.full_reads == 0, "and nobody reads every row"


def test_a_killed_machine_is_judged_dead_by_every_peer_on_time_and_buried_once(farm, db_url, nodes, tmp_path):
    survivors = [nodes(f"n{i}") for i in range(3)]
    processes = NodeProcesses(db_url, tmp_path)
    try:
        victim = processes("victim")
        wait_for(lambda: len(rosters(survivors, farm._store.ask_time())[0]) == 4, timeout=20.0)
        victim_id = next(m["id"] for m in farm._store.machines.read()[2] if m["name"] == "victim")
        before = version(farm)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        last_seen = next(m["last_seen"] for m in farm._store.machines.read()[2] if m["id"] == victim_id)
        judged_at: dict[int, float] = {}
        while len(judged_at) < len(survivors):  # each survivor's roster, watched at short intervals
            now = farm._store.ask_time()
            for node in survivors:
                if node.id not in judged_at and victim_id not in rosters([node], now)[0]:
                    judged_at[node.id] = now
            assert now < last_seen + DEAD_AFTER + 5 * FAST["heartbeat"], "the death went unnoticed"
            time.sleep(0.01)
        assert all(t > last_seen + DEAD_AFTER for t in judged_at.values()), "nobody is judged dead early"
        assert all(t < last_seen + DEAD_AFTER + 2 * FAST["heartbeat"] for t in judged_at.values()), judged_at
        wait_for(lambda: next(m["state"] for m in farm._store.machines.read()[2] if m["id"] == victim_id) == "dead")
        assert version(farm) == before + 1, "buried once, by one judge"
    finally:
        processes.kill_all()


def machines_on_the_server(farm, since: int, most: int) -> tuple[int, bool]:
    """How many machine rows the server itself fetched to answer read_changes(since, most), and whether it went by
    the rows' `changed` index (PostgreSQL's EXPLAIN ANALYZE, on a table never analysed; SQLite's query plan, whose
    rows fetched are those returned)."""
    statement = _read_statement(True).params(since=since, most=most)
    sql = str(statement.compile(dialect=farm._engine.dialect, compile_kwargs={"literal_binds": True}))
    with farm._engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            plan = " ".join(row[-1] for row in conn.execute(text(f"EXPLAIN QUERY PLAN {sql}")))
            fetched = len(conn.execute(statement).all())
            return fetched, "ix_qp_machines_changed" in plan
        [[plan]] = conn.execute(text(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")).all()
    nodes, found = [plan[0]["Plan"]], []
    while nodes:
        node = nodes.pop()
        nodes.extend(node.get("Plans", []))
        if node.get("Relation Name") == "qp_machines" or node.get("Index Name") == "ix_qp_machines_changed":
            found.append(node)
    fetched = sum(n["Actual Rows"] * n["Actual Loops"] for n in found if "Relation Name" in n)
    removed = sum(n.get("Rows Removed by Filter", 0) + n.get("Rows Removed by Index Recheck", 0) for n in found)
    return fetched + removed, any(n.get("Index Name") == "ix_qp_machines_changed" for n in found)


def test_a_change_read_returns_and_fetches_only_the_rows_changed_whatever_the_farms_size(farm):
    """Read by change, O(changed rows): 3 changes among 3,000 machine rows are 3 rows, on the server too."""
    store, peers = farm._store, farm._store.roster
    long_gone = dict(host="h", pid=1, version="t", capacity=1, state="stopped", joined_at=0.0, last_seen=0.0)
    with farm._engine.begin() as conn:  # a big farm's history: machines that came and went
        conn.execute(insert(machines), [dict(long_gone, name=f"m{i}", instance=f"m{i}") for i in range(3000)])
    a, b = register(store, "a"), register(store, "b")
    since = version(farm)
    assert peers.read_changes(since, 2) == (since, []), "nothing changed: no row"
    assert beat(store, a, state="paused")
    store.machines.mark_stopped(b)
    c = register(store, "c")
    now, rows = peers.read_changes(since, 6)
    assert now == since + 3
    assert [(row["id"], row["state"], row["changed"]) for row in rows] == [
        (a, "paused", since + 1),
        (b, "stopped", since + 2),
        (c, "active", since + 3),
    ]
    assert [row["id"] for row in peers.read_changes(since + 2, 2)[1]] == [c]
    assert [row["id"] for row in peers.read_changes(since, 2)[1]] == [a, b], "the first changed, `most` of them"
    assert machines_on_the_server(farm, since, 6) == (3, True)
    assert len(peers.read_all()[1]) == 3003


class Frozen:
    """Freezes a node's heartbeat (as a stopped process's): its check-ins wait until thawed."""

    def __init__(self, node):
        self.thawed = threading.Event()
        checkin = node.heartbeat.checkin

        def frozen_checkin():
            self.thawed.wait()
            checkin()

        node.heartbeat.checkin = frozen_checkin


def states(rows) -> dict[int, str]:
    return {row["id"]: row["state"] for row in rows}


def test_joins_pauses_stops_and_deaths_reach_every_node_and_one_frozen_across_them_converges(
    farm, db_url, nodes, tmp_path, monkeypatch
):
    spy = Spy(monkeypatch)
    for name in ("gone-1", "gone-2", "gone-3", "gone-4", "gone-5", "gone-6"):  # rows enough to catch up by change
        farm._store.machines.mark_stopped(register(farm._store, name))
    n0, n1, n2 = (nodes(f"n{i}") for i in range(3))
    processes = NodeProcesses(db_url, tmp_path)
    try:
        victim = processes("victim")
        wait_for(lambda: all(len(r) == 4 for r in rosters([n0, n1, n2], farm._store.ask_time())), timeout=20.0)
        spy.reset()
        frozen = Frozen(n2)
        n3 = nodes("n3")  # a join
        farm.steer("n1", "pause")  # a pause
        n0.stop(drain=False)  # a stop
        victim.send_signal(signal.SIGKILL)  # a death
        victim.wait()
        ids = {row["name"]: row["id"] for row in farm._store.machines.read()[2]}
        expected = {ids["n0"]: "stopped", ids["n1"]: "paused", ids["n3"]: "active", ids["victim"]: "dead"}
        expected[ids["n2"]] = "dead"  # frozen past its dead timeout: buried too
        wait_for(lambda: expected.items() <= states(farm._store.machines.read()[2]).items(), timeout=20.0)
        for node in (n1, n3):
            wait_for(lambda node=node: states(node.known.machines()) == states(farm._store.machines.read()[2]))
        assert spy.full_reads <= 1, "only the newcomer read every row"
        assert spy.changes and max(spy.changes) <= 2, f"rows per change read: {spy.changes}"
        frozen.thawed.set()
        expected[ids["n2"]] = "active"  # its check-in revives it
        wait_for(lambda: expected.items() <= states(farm._store.machines.read()[2]).items(), timeout=20.0)
        everyone = [n1, n2, n3]
        wait_for(lambda: all(states(n.known.machines()) == states(farm._store.machines.read()[2]) for n in everyone))
        wait_for(lambda: len({tuple(r) for r in rosters(everyone, farm._store.ask_time())}) == 1)
        assert rosters(everyone, farm._store.ask_time())[0] == sorted([ids["n2"], ids["n3"]])
    finally:
        processes.kill_all()
