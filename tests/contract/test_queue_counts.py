"""A limited queue's running count (docs/design.md §9): the claim checks the limit on the queue's row alone, so
every way a job goes into or out of running must move the count with it, on each backend; and a count that
went wrong is repaired."""

import threading
import time

import pytest
from sqlalchemy import func, select, update

from queueprocessor.farm import Farm
from queueprocessor.rules.job import Ending, JobSpec
from queueprocessor.rules.states import JobState, Outcome
from queueprocessor.store.schema import jobs, queues
from queueprocessor.store.types import ClaimRequest, Plan
from tests.support.work import PYJOBS

REPORTS = JobSpec("python", f"{PYJOBS}:noop", queue="reports")
LOCKED = Plan(served=("reports",), alone=(("reports", 8, True),))


@pytest.fixture
def farm(db_url):
    with Farm(db_url) as the_farm:
        yield the_farm


def machine(farm, name: str) -> int:
    return farm._store.machines.register(name=name, host="h", instance=f"{name}-i", pid=1, version="t", capacity=8)


def counted(farm) -> tuple[int, int]:
    """(the queue row's running count, the jobs of the queue that are running)."""
    [(count,)] = farm._store.rows(select(queues.c.running).where(queues.c.name == "reports"))
    [(running,)] = farm._store.rows(
        select(func.count()).where(jobs.c.queue == "reports", jobs.c.state == JobState.RUNNING)
    )
    return count, running


def expire(farm, *ids: int) -> None:
    """Their machine stopped renewing them a minute ago."""
    farm._store.count(update(jobs).where(jobs.c.id.in_(ids)).values(lease_until=jobs.c.lease_until - 60))


def test_the_count_follows_claims_finishes_retries_releases_take_overs_and_requeues(farm):
    store = farm._store
    store.jobs.enqueue(REPORTS, count=6)
    farm.set_queue("reports", limit=4)
    a, b = machine(farm, "a"), machine(farm, "b")
    one, two, three, four = store.jobs.claim(ClaimRequest(a, 8, 30.0, plan=LOCKED))
    assert counted(farm) == (4, 4) and store.jobs.claim(ClaimRequest(b, 8, 30.0, plan=LOCKED)) == [], "the limit"
    store.runs.finish(one, a, "succeeded")
    store.runs.finish(two, a, "failed", retry_in=0.0)  # back in the queue
    assert store.runs.release(three, a, "stopping")
    assert counted(farm) == (1, 1)
    expire(farm, four.id)
    taken = store.jobs.claim(ClaimRequest(b, 8, 30.0, plan=LOCKED))
    assert four.id in {job.id for job in taken} and len(taken) == 4, "taken over, and three more within the limit"
    assert counted(farm) == (4, 4)
    expire(farm, *(job.id for job in taken))
    assert store.jobs.requeue_expired(before=store.ask_time()) == 4
    assert counted(farm) == (0, 0)


def test_a_count_gone_wrong_is_repaired_by_the_recount_and_by_setting_the_limit(farm):
    store = farm._store
    store.jobs.enqueue(REPORTS, count=4)
    farm.set_queue("reports", limit=3)
    assert len(store.jobs.claim(ClaimRequest(machine(farm, "a"), 2, 30.0, plan=LOCKED))) == 2
    store.count(update(queues).values(running=3))  # e.g. started by a node of the older version, uncounted
    store.queues.recount()
    assert counted(farm) == (2, 2)
    store.count(update(queues).values(running=0))
    farm.set_queue("reports", limit=3)
    assert counted(farm) == (2, 2)
    assert len(store.jobs.claim(ClaimRequest(machine(farm, "b"), 8, 30.0, plan=LOCKED))) == 1


@pytest.mark.postgres
def test_claims_and_finishes_racing_on_four_threads_never_pass_the_limit_and_leave_the_count_true(pg_url):
    """Each thread claims up to 3 of a queue limited to 3 and finishes them, until 300 are done: the jobs the
    threads hold at once (counted after a claim commits and before its finish is sent, so never more than the
    database has running) stay within the limit, and the count ends at zero."""
    with Farm(pg_url) as farm:
        farm._store.jobs.enqueue(REPORTS, count=300)
        farm.set_queue("reports", limit=3)
        ids = [machine(farm, f"m{i}") for i in range(4)]
        held, most, lock = [0], [0], threading.Lock()

        def work(me: int) -> None:
            while claimed := farm._store.jobs.claim(
                ClaimRequest(me, 3, 30.0, plan=Plan(("reports",), (("reports", 3, True),)))
            ):
                with lock:
                    held[0] += len(claimed)
                    most[0] = max(most[0], held[0])
                time.sleep(0.002)  # the jobs run
                with lock:
                    held[0] -= len(claimed)
                farm._store.runs.finish_many(me, [Ending(job, Outcome.SUCCEEDED) for job in claimed])

        threads = [threading.Thread(target=work, args=(me,)) for me in ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert most[0] <= 3 and farm.job_counts()["succeeded"] == 300
        assert counted(farm) == (0, 0)
