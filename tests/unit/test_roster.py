"""Unit tests of the pure turn-taking functions: every node must compute the same answer."""

import pytest

from queueprocessor.rules.roster import (
    KnownMachines,
    Liveness,
    machine_status,
    next_turn,
    roster,
    slot_of,
    slot_owner,
    turn_to_take,
    turn_wait,
    upcoming_turn,
)

NOW = 10_000.0
LIVE = Liveness(dead_after=3.0)


def machine(id, state="active", seen=NOW - 0.5, joined=NOW - 60):
    return {"id": id, "state": state, "last_seen": seen, "joined_at": joined}


def test_roster_keeps_active_live_settled_machines_sorted_by_id():
    rows = [
        machine(7),
        machine(2),
        machine(3, state="paused"),
        machine(4, state="draining"),
        machine(5, seen=NOW - 3.5),  # silent longer than dead_after
        machine(6, joined=NOW - 0.2),  # joined too recently: peers may not have seen it yet
        machine(1, state="stopped"),
    ]
    assert roster(rows, NOW, LIVE, join_delay=1.5) == [2, 7]


def test_slots_cycle_through_the_roster_in_order():
    ids = [2, 5, 9]
    owners = [slot_owner(ids, slot_of(NOW + k * 1.0, 1.0)) for k in range(6)]
    assert sorted(set(owners)) == ids
    assert owners[:3] == owners[3:]
    assert all(a != b for a, b in zip(owners, owners[1:]))


def test_slot_of_uses_the_period():
    assert slot_of(10.49, 0.5) == 20
    assert slot_of(10.5, 0.5) == 21
    assert slot_owner([], 5) is None


def test_next_turn_is_the_first_owned_slot_from_now():
    ids = [1, 2, 3]
    slot = slot_of(NOW, 1.0)
    turn = next_turn(ids, 2, NOW, 1.0)
    assert turn >= slot and turn - slot < 3
    assert slot_owner(ids, turn) == 2
    assert next_turn(ids, 4, NOW, 1.0) is None


def test_a_database_stall_is_not_counted_as_a_peers_silence():
    # Everyone, the judge included, was cut off for 10 s; the judge is back since NOW - 1.
    peer_seen = NOW - 11
    assert Liveness(3.0).is_dead(peer_seen, NOW)
    judge = Liveness(3.0, judge_streak_start=NOW - 1)
    assert not judge.is_dead(peer_seen, NOW)
    # ...but a peer that stays silent for dead_after after the stall is dead.
    assert judge.is_dead(peer_seen, NOW + 2.5)


def test_machine_status_reports_dead_but_keeps_stopped():
    assert machine_status(machine(1, seen=NOW - 10), NOW, LIVE) == "dead"
    assert machine_status(machine(1, state="stopped", seen=NOW - 10), NOW, LIVE) == "stopped"
    assert machine_status(machine(1, state="paused"), NOW, LIVE) == "paused"


def test_turn_to_take_waits_out_the_error_bound_and_takes_each_slot_once():
    ids, period = [1, 2], 1.0
    slot = 10_001  # owned by ids[10_001 % 2] == 2
    assert turn_to_take(ids, 2, slot + 0.004, period, error_bound=0.005, last_taken=-1) is None  # may not have begun
    assert turn_to_take(ids, 2, slot + 0.006, period, error_bound=0.005, last_taken=-1) == slot
    assert turn_to_take(ids, 2, slot + 0.5, period, error_bound=0.005, last_taken=slot) is None  # taken already
    assert turn_to_take(ids, 1, slot + 0.5, period, error_bound=0.005, last_taken=-1) is None  # not ours


def test_upcoming_turn_skips_the_slot_already_taken_and_turn_wait_adds_the_bound():
    ids, period = [1, 2, 3], 1.0
    now = 30_000.5  # slot 30_000 belongs to ids[0]
    assert upcoming_turn(ids, 1, now, period, last_taken=-1) == 30_000
    assert upcoming_turn(ids, 1, now, period, last_taken=30_000) == 30_003
    assert upcoming_turn(ids, 9, now, period, last_taken=-1) is None
    assert turn_wait(30_003, now, period, error_bound=0.002, margin=0.0005) == pytest.approx(2.5025)
    assert turn_wait(30_000, now, period, error_bound=0.002, margin=0.0005) == 0.0005  # due already


def known(rows, before=NOW - 1.5, version=1):
    machines = KnownMachines()
    machines.replace(version, rows, before)
    return machines


def test_known_machines_stand_a_bound_in_for_the_last_seen_of_those_not_suspected():
    rows = [machine(1, seen=NOW - 0.2), machine(2, seen=NOW - 0.9), machine(3, state="stopped", seen=NOW - 50)]
    peers = known(rows)
    assert peers.roster(NOW, LIVE, 1.5) == roster(rows, NOW, LIVE, 1.5) == [1, 2]
    for beat in range(1, 30):  # no row is read again, only the (empty) suspects: both stay alive
        peers.update(NOW + beat - 1.5, {})
        assert peers.roster(NOW + beat + 0.9, LIVE, 1.5) == [1, 2]
    assert {m["id"]: m["last_seen"] for m in peers.machines()} == {1: NOW + 29 - 1.5, 2: NOW + 29 - 1.5, 3: NOW - 50}


def test_a_suspect_is_judged_dead_at_its_own_last_seen_plus_the_dead_timeout():
    peers = known([machine(1), machine(2)])
    silent_since = NOW + 0.3
    peers.update(NOW + 0.5, {2: silent_since})
    assert peers.roster(silent_since + 3.0, LIVE, 1.5) == [1, 2]
    assert peers.dead(silent_since + 3.0, LIVE) == []
    assert peers.roster(silent_since + 3.001, LIVE, 1.5) == [1]
    assert peers.dead(silent_since + 3.001, LIVE) == [(2, silent_since)]


def test_the_remembered_roster_changes_when_a_newcomer_has_waited_its_join_delay():
    peers = known([machine(1), machine(2, joined=NOW - 0.5)])
    assert peers.roster(NOW, LIVE, 1.5) == [1]
    assert peers.changes_at(NOW, LIVE, 1.5) == NOW + 1.0
    assert peers.roster(NOW + 0.999, LIVE, 1.5) == [1]
    assert peers.roster(NOW + 1.0, LIVE, 1.5) == [1, 2]


def test_without_heartbeats_of_our_own_every_peer_ages_out_as_before():
    peers = known([machine(1, seen=NOW), machine(2, seen=NOW)])
    assert peers.roster(NOW + 0.1, LIVE, 1.5) == [1, 2]
    assert peers.roster(NOW + 3.1, LIVE, 1.5) == []  # nothing learned for longer than the dead timeout


def test_a_late_heartbeat_read_brings_the_roster_back_and_a_stale_one_never_spins_the_turn_timer():
    """A heartbeat answer later than the dead timeout leaves a stale roster (nobody vouched for), which must neither
    outlive the late read (the node would take no turn until the roster next changed) nor ask to be woken at an
    instant already past (its turn timer would spin, recomputing the roster over every row)."""
    peers = known([machine(1, seen=NOW - 1.0), machine(2, seen=NOW - 1.0)])
    peers.update(NOW - 1.5, {})
    assert peers.roster(NOW, LIVE, 1.5) == [1, 2]
    late = NOW + 5.0  # no read for longer than the dead timeout
    assert peers.roster(late, LIVE, 1.5) == []
    assert peers.changes_at(late, LIVE, 1.5) > late
    peers.update(late - 1.5, {})  # the late answer, both checking in
    assert peers.roster(late + 0.1, LIVE, 1.5) == [1, 2]


def test_a_stale_roster_still_sees_a_machine_seen_after_its_bound_die_at_its_time():
    """Once our read is stale, a machine it saw check in after the read's bound dies at its own last_seen plus the
    dead timeout: a change the stale roster wakes for."""
    peers = known([machine(1, seen=NOW - 2.0), machine(2, seen=NOW)])
    peers.update(NOW - 2.5, {})  # machine 2's row is newer than the bound
    stale = NOW + 2.0  # past the bound's death (NOW + 0.5) and machine 1's (NOW + 1.0), before machine 2's (NOW + 3.0)
    assert peers.roster(stale, LIVE, 1.5) == [2]
    assert peers.changes_at(stale, LIVE, 1.5) == NOW + 3.0
    assert peers.roster(NOW + 3.001, LIVE, 1.5) == []


def test_a_version_is_current_only_when_it_is_the_one_read():
    peers = known([machine(1)], version=4)
    assert peers.current(4) and not peers.current(5)
    assert not KnownMachines().current(None) and not known([machine(1)], version=None).current(None)


def changed(id, version, **row):
    return machine(id, **row) | {"changed": version}


def test_a_node_behind_by_fewer_changes_than_it_knows_rows_reads_the_changes_else_every_row():
    peers = known([changed(i, 0) for i in range(1, 5)], version=10)
    assert peers.behind(11) == (10, 2) and peers.behind(13) == (10, 6), "room for the changes made since"
    assert peers.behind(14) is None, "4 changes cost a full read's rows: read them all"
    assert peers.behind(10) is None and peers.behind(9) is None and peers.behind(None) is None
    assert KnownMachines().behind(3) is None, "a node that never read reads every row"


def test_the_rows_changed_since_our_version_are_taken_in_with_the_suspects_of_the_rest():
    peers = known([changed(i, 0) for i in range(1, 6)], version=10)
    before = NOW + 0.5
    news = [
        changed(2, 11, state="paused", seen=NOW + 0.6),
        changed(6, 12, seen=NOW + 0.4, joined=NOW + 0.4),
        changed(3, 13, seen=NOW - 0.2),
    ]
    assert peers.catch_up(13, news, before, suspects={3: NOW - 0.5, 4: NOW - 0.5})
    assert peers.current(13)
    assert {m["id"]: m["state"] for m in peers.machines()} == {1: "active", 2: "paused", 3: "active", 4: "active"} | {
        5: "active",
        6: "active",
    }
    assert peers.roster(NOW + 0.6, LIVE, 1.5) == [1, 3, 4, 5], "6 waits its join delay; 2 is paused"
    assert peers.dead(NOW + 2.6, LIVE) == [(4, NOW - 0.5)], "4 as the heartbeat read said"
    assert peers.dead(NOW + 2.9, LIVE) == [(4, NOW - 0.5), (3, NOW - 0.2)], "3 as its row, read since, says"
    copy = peers.copy()
    assert peers.catch_up(14, [changed(4, 14, state="dead")], before, {})
    assert {m["id"]: m["state"] for m in copy.machines()}[4] == "active", "a copy handed out is never changed"
    assert 4 not in peers.roster(NOW + 0.6, LIVE, 1.5)


def test_a_version_on_no_row_sends_the_node_back_to_read_every_row_and_keeps_its_copy():
    rows = [changed(i, 0) for i in range(1, 6)]
    peers = known(rows, version=10)
    overwritten = [changed(2, 12, state="paused")]  # 11 was 2's too, or an older node's bump (on no row)
    assert not peers.catch_up(12, overwritten, NOW, {})
    assert peers.current(10) and {m["state"] for m in peers.machines()} == {"active"}
    assert not peers.catch_up(11, [], NOW, {}), "a bump on no row"
    assert peers.catch_up(12, [changed(2, 12, state="paused"), changed(5, 11, state="stopped")], NOW, {})
