"""An adaptive rate across a real `queueprocessor node` process on a real PostgreSQL server, in front of a real HTTP
target that answers 429 with Retry-After: each such answer snoozes its job (no attempt spent) and marks the ending
throttled, the throttled endings cut the queue's rate, and the calls the target records slow down with it; quiet
windows of successes raise it again (docs/design.md §9; tests/unit/test_breaker.py and tests/contract/test_breakers.py
cover the rise, which takes a quiet window of ten seconds)."""

import pytest

from queueprocessor.farm import Farm
from tests.support.work import FAST, NodeProcesses, wait_for

pytestmark = pytest.mark.postgres

RATE = 20.0  # starts per second, configured: 30 jobs, each called twice, would keep the target at it for 3 s


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


def test_throttled_answers_cut_the_rate_without_spending_attempts(farm, processes, http_target):
    farm.enqueue_http("/ok", queue="api", delay=3600)  # makes the queue known, to set it before any node runs
    farm.set_queue("api", rate=f"{RATE:g}/s", adaptive="5/s")
    ids = farm.enqueue_http("/throttled/1/1", queue="api", count=30, max_attempts=1)
    processes("n1", "--http-base", http_target.base_url)
    wait_for(lambda: farm.events(kind="queue.rate_adapted"), timeout=30)
    cut = farm.events(kind="queue.rate_adapted")[0]
    assert "throttled" in cut["detail"] and farm.queue("api").current_rate < RATE, cut
    wait_for(lambda: all(farm.job(i)["state"] == "succeeded" for i in ids), timeout=60)
    assert {farm.job(i)["attempts"] for i in ids} == {1}, "each answered 429 once, snoozed, and succeeded: one attempt"
    assert {farm.job(i)["snoozes"] for i in ids} == {1}
    calls = sorted(r["started"] for r in http_target.requests("/throttled"))
    after = [t for t in calls if t > cut["at"] + 0.5]  # the target's clock and the database's: one machine's
    busiest = max(sum(1 for u in after if t <= u < t + 1.0) for t in after)
    assert busiest <= RATE / 2 + 3, f"at most the halved rate and a period's burst a second, by the target ({busiest})"
