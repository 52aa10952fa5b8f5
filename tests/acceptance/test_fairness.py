"""Fair share: a turn takes at most its holder's free capacity, a backlog is shared by every node with room,
and equal machines get about equal shares."""

import pytest

from tests.support import pyjobs
from tests.support.work import Nodes, runs_per_machine, wait_for


@pytest.fixture
def nodes(farm):
    started = Nodes(farm)
    yield started
    started.stop_all()


def test_a_turn_takes_at_most_its_free_capacity_and_flags_the_rest_as_backlog(farm, nodes):
    node = nodes("a", capacity=2)
    start = farm._store.ask_time()
    farm.enqueue_python(pyjobs.nap, 0.3, count=6)
    wait_for(lambda: farm._store.jobs.counts()["succeeded"] == 6, timeout=20)
    turns = [t for t in farm._store.turns.read(start) if t["claimed"]]
    assert turns and all(t["claimed"] <= 2 for t in turns)
    assert any(t["backlog"] for t in turns), "a turn that found more than it could take says so"
    assert max(runs_per_machine(farm).values()) == 6 and node.failed == 0


def test_equal_machines_share_a_backlog_about_equally(farm, nodes):
    machines = {nodes(name, capacity=2).id for name in "abcd"}
    wait_for(lambda: len({t["machine_id"] for t in farm._store.turns.read(0)}) == 4, timeout=10)
    farm.enqueue_python(pyjobs.nap, 0.05, count=120)
    wait_for(lambda: farm._store.jobs.counts()["succeeded"] == 120, timeout=60)
    shares = runs_per_machine(farm)
    assert set(shares) == machines and sum(shares.values()) == 120
    assert max(shares.values()) <= 2 * min(shares.values())  # bench/distribution.py measures it closely


def test_a_full_turn_holder_that_finds_due_work_flags_a_backlog(farm, nodes):
    """Its turns claim nothing, yet they say there is work, so that machines with room claim it directly."""
    nodes("a", capacity=1)
    [busy] = farm.enqueue_python(pyjobs.nap, 1.5)
    wait_for(lambda: farm._store.jobs.get(busy)["state"] == "running")
    since = farm._store.ask_time()
    [waiting] = farm.enqueue_python(pyjobs.noop)
    wait_for(lambda: any(t["backlog"] and t["claimed"] == 0 for t in farm._store.turns.read(since)), timeout=1.0)
    assert farm._store.jobs.get(busy)["state"] == "running"
    wait_for(lambda: farm._store.jobs.get(waiting)["state"] == "succeeded", timeout=5)
