"""Unit tests of the pure turn-taking functions: every node must compute the same answer."""

from queueprocessor.roster import Liveness, machine_status, next_turn, roster, slot_of, slot_owner

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
