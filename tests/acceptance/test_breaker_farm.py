"""A queue's breaker across real `queueprocessor node` processes on a real PostgreSQL server, in front of a real HTTP
target that fails for a while and then recovers. Judged by the target's record: while the breaker is open only
canaries reach it, one at a time and one per cool-down; once it recovers, the queue is back at its full rate."""

import time

import pytest

from queueprocessor.farm import Farm
from tests.support.httptarget import most_at_once
from tests.support.work import FAST, NodeProcesses, wait_for

pytestmark = pytest.mark.postgres

COOL_DOWN = 1.0
MARGIN = 0.5  # requests of jobs claimed just before it opened may start this late


@pytest.fixture
def farm(pg_url):
    with Farm(pg_url) as the_farm:
        the_farm.settings(**FAST)
        yield the_farm


@pytest.fixture
def processes(pg_url, tmp_path):
    started = NodeProcesses(pg_url, tmp_path)
    yield started
    started.kill_all()


def test_an_open_breaker_lets_only_canaries_through_and_the_rate_comes_back_after_recovery(
    farm, processes, http_target
):
    http_target.down.set()
    farm.enqueue_http("/ok", queue="api", delay=3600)  # makes the queue known, to set it before any node runs
    farm.set_queue("api", rate="20/s", breaker="3/60s", cool_down=COOL_DOWN)
    ids = farm.enqueue_http("/flaky", queue="api", count=120, max_attempts=1)
    for name in ("n1", "n2"):
        processes(name, "--http-base", http_target.base_url)
    wait_for(lambda: len(farm.events(kind="queue.breaker_opened")) >= 3, timeout=60)  # opened, two canaries failed
    opened_at = farm.events(kind="queue.breaker_opened")[0]["at"]
    http_target.down.clear()
    recovered = time.time()
    wait_for(lambda: farm.queue("api").breaker_state == "closed", timeout=60)
    assert farm.queue("api").current_rate == 20.0, "closed again at its full configured rate"
    wait_for(lambda: all(farm.job(i)["state"] in ("succeeded", "failed") for i in ids), timeout=60)
    during = [r for r in http_target.requests("/flaky") if opened_at + MARGIN < r["started"] < recovered]
    assert during and most_at_once(during) == 1, "while it was open, one canary at a time"
    assert len(during) <= (recovered - opened_at) / COOL_DOWN + 1, "and at most one per cool-down"
    failed = [i for i in ids if farm.job(i)["state"] == "failed"]
    assert len(failed) < len(ids) / 3, f"most jobs waited the failure out ({len(failed)} failed for good)"
    kinds = [e["kind"] for e in farm.events(kind="queue") if e["kind"].startswith("queue.breaker_")]
    assert kinds[-2:] == ["queue.breaker_ramp", "queue.breaker_closed"]
