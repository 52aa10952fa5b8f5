"""Gated jobs (docs/design.md §9): the jobs of a queue that holds them back (paused, or limited or rated
farm-wide) are flagged and kept out of the index every other claim walks, so a held-back queue's backlog costs
the rest of the farm nothing. The flag must follow the queue's settings through every way a job becomes
queued, or its jobs would wait unclaimed (a gated job of a free queue) or be walked past by every claim."""

import threading
import time

import pytest
from sqlalchemy import String, insert, literal, select, update

from queueprocessor.farm import Farm
from queueprocessor.rules.job import JobSpec
from queueprocessor.rules.states import JobState
from queueprocessor.store.schema import jobs
from queueprocessor.store.sql.gates import gated_now
from queueprocessor.store.types import ClaimRequest, Plan
from tests.support.work import PYJOBS

REPORTS = JobSpec("python", f"{PYJOBS}:noop", queue="reports")
PLAIN = JobSpec("python", f"{PYJOBS}:noop")
LOCKED = Plan(alone=(("reports", 8, True),))


@pytest.fixture
def farm(db_url):
    with Farm(db_url) as the_farm:
        yield the_farm


def machine(farm, name: str = "a") -> int:
    return farm._store.machines.register(name=name, host="h", instance=f"{name}-i", pid=1, version="t", capacity=8)


def flags(farm, queue: str = "reports") -> dict[str, list[bool]]:
    """The gated flags of a queue's jobs, by state."""
    found: dict[str, list[bool]] = {}
    for state, gated in farm._store.rows(
        select(jobs.c.state, jobs.c.gated).where(jobs.c.queue == queue).order_by(jobs.c.id)
    ):
        found.setdefault(state, []).append(bool(gated))
    return found


def test_a_queues_jobs_are_gated_while_it_is_paused_limited_or_rated_and_let_go_after(farm):
    store = farm._store
    store.jobs.enqueue(REPORTS, count=3)
    store.jobs.enqueue(PLAIN)
    assert flags(farm) == {"queued": [False] * 3}
    farm.pause_queue("reports")
    assert flags(farm) == {"queued": [True] * 3} and flags(farm, "default") == {"queued": [False]}
    farm.resume_queue("reports")
    assert flags(farm) == {"queued": [False] * 3}
    assert {job.queue for job in store.jobs.claim(ClaimRequest(machine(farm), 8, 30.0))} == {"reports", "default"}

    store.jobs.enqueue(REPORTS, count=2)
    farm.set_queue("reports", limit=10)
    assert flags(farm) == {"running": [True] * 3, "queued": [True] * 2}, "running jobs too: they may be queued again"
    farm.set_queue("reports", limit=None)
    assert flags(farm) == {"running": [False] * 3, "queued": [False] * 2}
    farm.set_queue("reports", rate="5/s")
    assert flags(farm) == {"running": [True] * 3, "queued": [True] * 2}
    farm.set_queue("reports", on_failure="block")  # not a hold: the flags stay
    assert flags(farm) == {"running": [True] * 3, "queued": [True] * 2}


def test_every_way_into_the_queue_gates_a_job_of_a_held_back_queue(farm):
    """An enqueue (one, or many in one call), a schedule's occurrence, a retry of a failed job, and a job that
    failed with attempts left or lost its lease (it keeps the flag it had while running)."""
    store = farm._store
    [failed] = store.jobs.enqueue(REPORTS)
    me = machine(farm)
    [job] = store.jobs.claim(ClaimRequest(me, 1, 30.0))
    store.runs.finish(job, me, "failed", error="boom")
    farm.set_queue("reports", limit=4)
    store.jobs.enqueue(REPORTS)
    store.jobs.enqueue(REPORTS, count=3)
    farm.schedule("nightly", REPORTS, every=60.0)
    store.schedules.materialise(ahead=120.0, period=0.5)
    store.jobs.retry(failed)
    queued = flags(farm)["queued"]
    assert len(queued) >= 6 and all(queued)
    assert len(store.jobs.claim(ClaimRequest(me, 8, 30.0))) == 0, "the main claim passes them by"
    b = machine(farm, "b")
    taken = store.jobs.claim(ClaimRequest(b, 8, 30.0, plan=LOCKED))
    assert len(taken) == 4, "through the queue's own branch, within its limit"
    store.runs.finish(taken[0], b, "failed", error="again", retry_in=0.0)
    assert flags(farm)["queued"] == [True] * (len(queued) - 3), "back in the queue, still gated"


def test_a_job_that_slipped_past_its_queues_change_is_set_right_by_housekeeping(farm):
    """A job written ungated into a limited queue (by a node of schema version 5, during an upgrade) is never
    started by the main claim, which checks the queue's row; the next housekeeping pass gates it."""
    store = farm._store
    store.jobs.enqueue(REPORTS)
    farm.set_queue("reports", limit=2)
    store.count(update(jobs).values(gated=False))
    me = machine(farm)
    assert (
        store.jobs.claim(ClaimRequest(me, 8, 30.0)) == []
        and store.jobs.claim(ClaimRequest(me, 8, 30.0, plan=LOCKED)) == []
    )
    store.queues.recount()
    assert flags(farm) == {"queued": [True]}
    assert len(store.jobs.claim(ClaimRequest(me, 8, 30.0, plan=LOCKED))) == 1


@pytest.mark.postgres
def test_the_server_keeps_one_plan_for_the_claim_of_a_limited_queue(pg_url):
    """The node that holds a limited queue's places claims with its row locked many times a second. Planned
    afresh at every run, that claim cost the server a millisecond of planning, as much as its run (named by an
    array, the queue rows were guessed ten: sql.gates.held_queues). Once psycopg has prepared it (after five runs on
    a connection), the server runs it on the plan it keeps."""
    with Farm(pg_url) as farm:
        farm._store.jobs.enqueue(REPORTS, count=20)
        farm.set_queue("reports", limit=1)
        me = machine(farm)
        claimed = sum(len(farm._store.jobs.claim(ClaimRequest(me, 8, 30.0, plan=LOCKED))) for _ in range(12))
        with farm._engine.connect() as conn:  # the pool's one connection, which ran the claims
            plans = conn.exec_driver_sql(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE 'WITH held AS%%'"
            ).all()
    assert claimed == 1, "the limit held"
    assert len(plans) == 1 and plans[0][0] >= 1 and plans[0][1] <= 5, plans


@pytest.mark.postgres
def test_a_change_waits_for_an_enqueue_that_read_the_queue_before_it(pg_url):
    """An enqueue in flight when a queue is limited read the queue as free: its job is written ungated. The
    change waits for that transaction to end before it gates the queue's jobs, so the job is gated with them."""
    with Farm(pg_url) as farm:
        farm._store.jobs.enqueue(REPORTS)
        with farm._engine.connect() as writer:
            writer.execute(
                insert(jobs).values(
                    executor="python",
                    target=f"{PYJOBS}:noop",
                    method="GET",
                    state=JobState.QUEUED,
                    priority=0,
                    run_at=0.0,
                    created_at=0.0,
                    attempts=0,
                    max_attempts=1,
                    fence=0,
                    cancel_requested=False,
                    kind="job",
                    queue="reports",
                    gated=gated_now(literal("reports", String)),
                )
            )
            changed = threading.Thread(target=farm.set_queue, args=("reports",), kwargs=dict(limit=1))
            changed.start()
            time.sleep(0.5)
            assert changed.is_alive(), "the change waits for the enqueue that began before it"
            writer.commit()
            changed.join(10)
        assert not changed.is_alive() and flags(farm) == {"queued": [True, True]}
        assert len(farm._store.jobs.claim(ClaimRequest(machine(farm), 8, 30.0, plan=LOCKED))) == 1
