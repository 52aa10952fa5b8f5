"""The farm's event log (docs/design.md §11), on each backend: each change an operator or a machine makes is
logged in the same transaction, with who did it; a change refused logs nothing; old events are pruned."""

import pytest
from sqlalchemy import update

from queueprocessor import JobFilter
from queueprocessor.farm import Farm
from queueprocessor.rules.errors import InvalidJob, NotFound
from queueprocessor.rules.search import BulkAction
from queueprocessor.store.events import actor_of, record_event
from queueprocessor.store.schema import events
from tests.support import pyjobs

CHECKIN = dict(running=0, done=0, failed=0, offset=0.0, rtt=0.001, error_bound=0.0005)


@pytest.fixture
def farm(db_url):
    with Farm(db_url, client="queueprocessor desk") as the_farm:
        yield the_farm


def logged(farm, kind=None) -> list[tuple]:
    return [(e["kind"], e["subject"], e["detail"], e["actor"]) for e in farm.events(3600, kind=kind)]


def machine(farm, name: str) -> int:
    return farm._store.machines.register(name=name, host="h1", instance=f"{name}-i", pid=7, version="t", capacity=4)


def test_a_machines_life_is_logged_with_who_did_what(farm):
    me = actor_of("queueprocessor desk")
    a, b = machine(farm, "alpha"), machine(farm, "beta")
    farm.steer("alpha", "pause")
    farm._store.machines.heartbeat(a, state="paused", applied_wish="pause", **CHECKIN)
    farm._store.machines.heartbeat(a, state="paused", applied_wish=None, **CHECKIN)  # no change: nothing logged
    farm._store.machines.mark_stopped(a)
    seen = farm._store.machines.find("beta")["last_seen"]
    assert farm._store.roster.bury(b, seen, judge="gamma #9")
    farm._store.machines.heartbeat(b, state="active", applied_wish=None, **CHECKIN)  # back from the dead
    farm._store.events.outage(b, 100.0, 112.5, fences=1)
    alpha, beta = f"alpha #{a}", f"beta #{b}"
    assert logged(farm) == [
        ("machine.joined", alpha, "on h1 pid 7, version t, capacity 4, queues every queue", alpha),
        ("machine.joined", beta, "on h1 pid 7, version t, capacity 4, queues every queue", beta),
        ("machine.asked", alpha, "to pause", me),
        ("machine.paused", alpha, "as asked (pause)", alpha),
        ("machine.left", alpha, None, alpha),
        ("machine.dead", beta, "stopped checking in", "gamma #9"),
        ("machine.back", beta, None, beta),
        ("database.outage", beta, "no contact for 12.5 s, since 1970-01-01 00:01:40.000", beta),
        ("machine.fenced", beta, "stopped its jobs before their leases ran out (1 time)", beta),
    ]
    assert [kind for kind, *_ in logged(farm, "machine.dead")] == ["machine.dead"]
    assert {kind.split(".")[0] for kind, *_ in logged(farm, "database")} == {"database"}


def test_queue_and_schedule_changes_are_logged_and_a_refused_change_is_not(farm):
    me = actor_of("queueprocessor desk")
    farm.enqueue_python(pyjobs.noop, queue="reports", delay=3600)
    farm.pause_queue("reports")
    farm.resume_queue("reports")
    farm.set_queue("reports", limit=3, rate="10/s", on_failure="block")
    farm.set_queue("reports", limit=None)
    farm.schedule("nightly", farm.python_spec(pyjobs.noop), cron="0 3 * * *", tz="UTC")
    farm.pause_schedule("nightly")
    farm.resume_schedule("nightly")
    farm.remove_schedule("nightly")
    for refused in (lambda: farm.steer("nobody", "pause"), lambda: farm.pause_schedule("nightly")):
        with pytest.raises(NotFound):
            refused()
    assert logged(farm, "queue") == [
        ("queue.paused", "reports", None, me),
        ("queue.resumed", "reports", None, me),
        ("queue.limited", "reports", "at most 3 running", me),
        ("queue.rated", "reports", "10 starts per 1 s", me),
        ("queue.on_failure", "reports", "on failure: block", me),
        ("queue.limited", "reports", "no limit", me),
    ]
    noop = f"python {pyjobs.__name__}:noop"
    assert logged(farm, "schedule") == [
        ("schedule.added", "nightly", f"cron 0 3 * * * (UTC): {noop} in queue default", me),
        ("schedule.paused", "nightly", "0 waiting occurrences cancelled", me),
        ("schedule.resumed", "nightly", None, me),
        ("schedule.removed", "nightly", "0 waiting occurrences cancelled", me),
    ]
    assert logged(farm, "machine") == []


def test_a_schedule_edited_or_run_now_is_logged_once_with_what_it_became(farm):
    me, noop = actor_of("queueprocessor desk"), f"python {pyjobs.__name__}:noop"
    farm.schedule("nightly", farm.python_spec(pyjobs.noop), cron="0 3 * * *", tz="UTC")
    farm.edit_schedule("nightly", cron="0 4 * * *", queue="reports", grace=60.0)
    farm.edit_schedule("nightly", cron="0 4 * * *")  # nothing changes: nothing logged
    with pytest.raises(InvalidJob):
        farm.edit_schedule("nightly", cron="61 * * * *")  # refused: nothing logged
    job = farm.run_schedule("nightly", request="r1")
    assert farm.run_schedule("nightly", request="r1") == job  # the same request resent makes no job, nor event
    assert logged(farm, "schedule")[1:] == [
        (
            "schedule.edited",
            "nightly",
            f"cron 0 4 * * * (UTC): {noop} in queue reports (cron, queue, grace changed)",
            me,
        ),
        ("schedule.run", "nightly", f"once, now: {noop} in queue reports", me),
    ]


def test_a_bulk_action_is_logged_once_with_its_filter_and_count_when_it_ends_is_stopped_or_fails(farm):
    me = actor_of("queueprocessor desk")
    ids = [job for _ in range(3) for job in farm.enqueue_python(pyjobs.noop, queue="mail", delay=3600)]
    assert farm.cancel_jobs(JobFilter(queue="mail")) == 3
    asked = []
    stop_after_two = lambda: asked.append(1) or len(asked) > 2  # noqa: E731
    assert farm._store.bulk.run(BulkAction.RETRY, JobFilter(state="cancelled"), batch=1, stop=stop_after_two) == 2
    assert farm._store.bulk.run(BulkAction.RETRY, JobFilter(ids=tuple(ids)), batch=1) == 1  # three batches, one event
    assert farm.retry_jobs(JobFilter(state="cancelled", search="nothing like it")) == 0
    assert farm.cancel_jobs(JobFilter(ids=tuple(ids))) == 3

    def cut_off(changed):
        raise ConnectionError("the database went away")

    with pytest.raises(ConnectionError):  # after its first batch: that batch is logged, and the error goes on
        farm._store.bulk.run(BulkAction.RETRY, JobFilter(queue="mail"), batch=1, progress=cut_off)
    assert logged(farm, "jobs") == [
        ("jobs.bulk", "cancel", "queue=mail: 3 jobs", me),
        ("jobs.bulk", "retry", "state=cancelled: 2 jobs, then stopped", me),
        ("jobs.bulk", "retry", "3 selected: 1 job", me),
        ("jobs.bulk", "retry", "state=cancelled search='nothing like it': 0 jobs", me),
        ("jobs.bulk", "cancel", "3 selected: 3 jobs", me),
        ("jobs.bulk", "retry", "queue=mail: 1 job, then interrupted", me),
    ]


def test_an_event_is_written_only_with_its_change_and_old_events_are_pruned(farm):
    with pytest.raises(RuntimeError), farm._engine.begin() as conn:
        record_event(conn, "jobs.bulk", "retry", "state=failed: 3 jobs", "someone")
        raise RuntimeError("the change beside it failed")
    assert logged(farm) == []
    with farm._engine.begin() as conn:
        record_event(conn, "jobs.bulk", "retry", "state=failed: 3 jobs", "someone")
        record_event(conn, "jobs.bulk", "cancel", "queue=mail: 1 job", "someone")
    farm._store.count(update(events).where(events.c.subject == "cancel").values(at=events.c.at - 31 * 86400))
    assert farm._store.events.prune(30 * 86400) == 1
    assert logged(farm) == [("jobs.bulk", "retry", "state=failed: 3 jobs", "someone")]


def test_an_unknown_kind_is_refused_in_one_line(farm):
    with pytest.raises(Exception, match="kind must be a kind of event, or one of database, jobs, machine"):
        farm.events(kind="machines")
