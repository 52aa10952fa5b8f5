"""Fair shares and limits per key on a real farm (docs/design.md §9): real node processes claim a real HTTP target's
work, and the target's record of every request is the judge. A limit per key is never exceeded, while nodes are
killed and others join; a key with a few jobs is served beside a flood of another's, not after it."""

import signal
from collections import defaultdict

import pytest

from queueprocessor.farm import Farm
from tests.support.httptarget import most_at_once
from tests.support.work import NodeProcesses, wait_for

pytestmark = pytest.mark.postgres

TIMING = dict(period=0.2, heartbeat=0.2)


@pytest.fixture
def farm(pg_url):
    with Farm(pg_url) as the_farm:
        the_farm.settings(**TIMING)
        yield the_farm


@pytest.fixture
def nodes(pg_url, tmp_path):
    started = NodeProcesses(pg_url, tmp_path, timing=TIMING)
    yield started
    started.kill_all()


def by_key(records) -> dict[str, list[dict]]:
    """The target's requests by the key each carried in its query (`?key=K`)."""
    found = defaultdict(list)
    for record in records:
        found[record["path"].partition("?key=")[2]].append(record)
    return found


def test_a_limit_per_key_holds_by_the_targets_record_while_nodes_die_and_join(farm, nodes, http_target):
    farm.set_queue("default", key_limit=2)
    keys = ("a", "b", "c")
    for key in keys:
        farm.enqueue_http(f"/sleep/0.3?key={key}", fair_key=key, count=16)
    farm.enqueue_http("/sleep/0.3?key=heavy", fair_key="heavy", cost=2, count=4)
    base = ("--http-base", http_target.base_url)
    victim = nodes("victim", *base, capacity=8)
    nodes("steady", *base, capacity=8)
    wait_for(lambda: len(http_target.requests("/sleep")) >= 8, timeout=30)
    victim.send_signal(signal.SIGKILL)  # its requests end with it; its leases run out, and others take its jobs
    nodes("joiner", *base, capacity=8)
    wait_for(lambda: farm._store.jobs.counts().get("succeeded", 0) == 52, timeout=90)
    served = by_key(http_target.requests("/sleep"))
    for key in keys:
        assert most_at_once(served[key]) == 2, f"key {key}: at most its limit, and its limit used"
    assert most_at_once(served["heavy"]) == 1, "a job of cost 2 fills its key's limit of 2 alone"
    assert most_at_once(http_target.requests("/sleep")) > 2, "the keys ran beside each other"


def test_a_few_jobs_of_one_key_are_served_beside_a_flood_of_anothers(farm, nodes, http_target):
    farm.set_queue("default", fair=True)
    farm.enqueue_http("/sleep/0.05?key=flood", fair_key="flood", count=400)
    base = ("--http-base", http_target.base_url)
    nodes("a", *base, capacity=4)
    nodes("b", *base, capacity=4)
    wait_for(lambda: len(http_target.requests("/sleep")) >= 40, timeout=30)
    for _ in range(5):
        farm.enqueue_http("/sleep/0.05?key=small", fair_key="small")
    wait_for(lambda: farm._store.jobs.counts().get("succeeded", 0) == 405, timeout=60)
    served = by_key(http_target.requests("/sleep"))
    assert len(served["small"]) == 5
    flood_after = [r for r in served["flood"] if r["started"] > max(r["ended"] for r in served["small"])]
    assert len(flood_after) > 200, "the small key's jobs were done long before the flood's"
