"""The roster version on each backend: a heartbeat reads O(1) rows, every change of the roster
bumps the version, every node still computes the same roster, and a killed machine is judged dead on time."""

import signal
import time

import pytest
from sqlalchemy import select

from queueprocessor.store.roster import RosterStore
from queueprocessor.store.schema import roster_version
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

        def read_changes(peers, since):
            version, rows = real_read_changes(peers, since)
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
