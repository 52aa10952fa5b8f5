"""Dependencies, workflows and groups, run against every backend (and PostgreSQL through PgBouncer): a child waits
until its parents succeed, is released by the finish that records the last of them (only under that finish's
fence), is cancelled with the reason when one fails, unless it waits for their end only, and comes back when the
parent is retried; a graph goes in whole or not at all; a group's callback is released once, with the counts."""

import dataclasses
import json
import threading
import time

import pytest
from sqlalchemy import func, select, text

from queueprocessor.rules.errors import BadJobInput, LostLease, QPError
from queueprocessor.rules.job import Ending, JobSpec
from queueprocessor.rules.search import JobFilter
from queueprocessor.store.schema import deps, flow_jobs
from queueprocessor.store.types import ClaimRequest
from tests.conftest import BACKENDS, PGBOUNCER, backend_url

WORK = JobSpec(executor="python", target="bench.jobs:noop", max_attempts=1)


@pytest.fixture(params=[*BACKENDS, PGBOUNCER])
def db_url(request, tmp_path):
    return backend_url(request, tmp_path)


def register(store, name="m"):
    return store.machines.register(
        name=name, host="h", instance=f"{name}-{time.monotonic_ns()}", pid=1, version="t", capacity=64
    )


def after(*parents, ended=False, **fields):
    return JobSpec(
        executor="python", target="bench.jobs:noop", max_attempts=1, after=parents, after_ended=ended, **fields
    )


def claim(store, me, *ids, lease=30.0):
    """Claim every due job; the claimed jobs by id, which must be exactly `ids`."""
    claimed = {c.id: c for c in store.jobs.claim(ClaimRequest(me, 64, lease))}
    assert sorted(claimed) == sorted(ids)
    return claimed


def state(store, job_id):
    job = store.jobs.get(job_id)
    return job["state"], job["last_error"]


def test_a_child_waits_until_every_parent_has_succeeded_then_is_due_at_once(farm):
    store = farm._store
    me = register(store)
    p1, p2 = store.jobs.enqueue(WORK, count=2)
    [child] = store.jobs.enqueue(after(p1, p2, priority=5), delay=0)
    assert state(store, child) == ("waiting", None)
    assert farm.job_counts()["waiting"] == 1
    claimed = claim(store, me, p1, p2)  # the waiting child is not claimable
    assert store.runs.finish(claimed[p1], me, "succeeded") == "succeeded"
    assert state(store, child)[0] == "waiting", "one parent of two is not enough"
    assert store.runs.finish(claimed[p2], me, "succeeded") == "succeeded"
    assert state(store, child)[0] == "queued"
    assert store.jobs.get(child)["run_at"] <= store.ask_time()
    claim(store, me, child)
    assert [p["id"] for p in farm.job(child)["after"]] == [p1, p2]


def test_a_batch_of_endings_with_parents_and_plain_jobs_releases_the_children(farm):
    """A node writes its results in batches: a parent among plain jobs is ended, and releases, with the rest."""
    store = farm._store
    me = register(store)
    plain = store.jobs.enqueue(WORK, count=3)
    [parent] = store.jobs.enqueue(WORK)
    [child] = store.jobs.enqueue(after(parent))
    claimed = claim(store, me, *plain, parent)
    states = store.runs.finish_many(me, [Ending(c, "succeeded") for c in claimed.values()])
    assert states == ["succeeded"] * 4
    assert state(store, child)[0] == "queued"


def test_a_late_writers_success_releases_nothing(farm):
    """The parent's first owner lost its lease and the job was taken over: its success matches no row, so the child
    stays waiting; the new owner's success releases it."""
    store = farm._store
    a, b = register(store, "a"), register(store, "b")
    [parent] = store.jobs.enqueue(WORK)
    [child] = store.jobs.enqueue(after(parent))
    [old] = store.jobs.claim(ClaimRequest(a, 1, lease=0.05))
    time.sleep(0.1)
    [new] = store.jobs.claim(ClaimRequest(b, 1, lease=30))
    assert new.fence == old.fence + 1
    with pytest.raises(LostLease):
        store.runs.finish(old, a, "succeeded")
    assert store.runs.finish_many(a, [Ending(old, "succeeded")]) == [None]
    assert state(store, child)[0] == "waiting"
    assert store.runs.finish(new, b, "succeeded") == "succeeded"
    assert state(store, child)[0] == "queued"


def test_a_failed_parent_cancels_its_waiting_descendants_with_the_reason_but_not_those_after_its_end(farm):
    store = farm._store
    me = register(store)
    [parent] = store.jobs.enqueue(WORK)
    [child] = store.jobs.enqueue(after(parent))
    [grandchild] = store.jobs.enqueue(after(child))
    [cleanup] = store.jobs.enqueue(after(parent, ended=True))
    [after_cancelled] = store.jobs.enqueue(after(child, ended=True))
    claimed = claim(store, me, parent)
    assert store.runs.finish(claimed[parent], me, "failed", error="boom") == "failed"
    assert state(store, child) == ("cancelled", f"parent {parent} failed")
    assert state(store, grandchild) == ("cancelled", f"parent {parent} failed")
    assert state(store, cleanup)[0] == "queued", "after_ended: released once its parent ended, whatever the outcome"
    assert state(store, after_cancelled)[0] == "queued", "its parent ended too: it was cancelled"
    [late] = store.jobs.enqueue(after(parent))
    assert state(store, late) == ("cancelled", f"parent {parent} failed"), "a parent that failed already"


def test_a_parent_that_fails_but_is_retried_by_backoff_holds_its_child_back(farm):
    store = farm._store
    me = register(store)
    [parent] = store.jobs.enqueue(JobSpec(executor="python", target="bench.jobs:noop", max_attempts=2))
    [child] = store.jobs.enqueue(after(parent))
    claimed = claim(store, me, parent)
    assert store.runs.finish(claimed[parent], me, "failed", error="once", retry_in=0.0) == "queued"
    assert state(store, child)[0] == "waiting"
    claimed = claim(store, me, parent)
    assert store.runs.finish(claimed[parent], me, "succeeded") == "succeeded"
    assert state(store, child)[0] == "queued"


def test_cancelling_a_parent_cancels_its_children_and_a_retry_puts_them_back_to_wait(farm):
    store = farm._store
    me = register(store)
    [parent] = store.jobs.enqueue(WORK)
    [other] = store.jobs.enqueue(WORK)
    [child] = store.jobs.enqueue(after(parent, other))
    [grandchild] = store.jobs.enqueue(after(child))
    assert farm.cancel(parent) == "cancelled"
    assert state(store, child) == ("cancelled", f"parent {parent} was cancelled")
    assert state(store, grandchild) == ("cancelled", f"parent {parent} was cancelled")
    claimed = claim(store, me, other)
    assert store.runs.finish(claimed[other], me, "succeeded") == "succeeded"
    farm.retry(parent)
    assert state(store, child) == ("waiting", None) and state(store, grandchild) == ("waiting", None)
    claimed = claim(store, me, parent)
    assert store.runs.finish(claimed[parent], me, "succeeded") == "succeeded"
    assert state(store, child)[0] == "queued", "its other parent had succeeded meanwhile: counted again"
    claimed = claim(store, me, child)
    assert store.runs.finish(claimed[child], me, "succeeded") == "succeeded"
    assert state(store, grandchild)[0] == "queued"


def test_a_bulk_cancel_and_a_bulk_retry_keep_dependencies_as_single_ones_do(farm):
    """The bulk actions run the single actions' statements: a parent cancelled among many cancels its waiting
    children with the reason, a bulk retry puts them back to wait, and a waiting job is among those cancelled."""
    store = farm._store
    me = register(store)
    parents = [store.jobs.enqueue(dataclasses.replace(WORK, queue="bulk"))[0] for _ in range(3)]
    [child] = store.jobs.enqueue(after(parents[0]))
    assert farm.cancel_jobs(JobFilter(queue="bulk")) == 3
    assert state(store, child) == ("cancelled", f"parent {parents[0]} was cancelled")
    assert farm.retry_jobs(JobFilter(queue="bulk")) == 3
    assert state(store, child) == ("waiting", None)
    claimed = claim(store, me, *parents)
    assert store.runs.finish(claimed[parents[0]], me, "succeeded") == "succeeded"
    assert state(store, child)[0] == "queued"
    [waiting] = store.jobs.enqueue(after(parents[1]))
    assert farm.cancel_jobs(JobFilter(state="waiting")) == 1
    assert state(store, waiting)[0] == "cancelled"


def test_a_waiting_job_can_be_cancelled_and_its_children_go_with_it(farm):
    store = farm._store
    [parent] = store.jobs.enqueue(WORK)
    [child] = store.jobs.enqueue(after(parent))
    [grandchild] = store.jobs.enqueue(after(child))
    assert farm.cancel(child) == "cancelled"
    assert state(store, grandchild) == ("cancelled", f"parent {child} was cancelled")
    assert state(store, parent)[0] == "queued"


def test_an_unknown_parent_is_refused_and_nothing_is_enqueued(farm):
    store = farm._store
    [parent] = store.jobs.enqueue(WORK)
    before = farm.job_counts()
    with pytest.raises(BadJobInput, match=rf"after names job {parent + 99}, which does not exist"):
        farm.enqueue_python("bench.jobs:noop", after=[parent, parent + 99])
    with pytest.raises(BadJobInput, match="after_ended needs after"):
        farm.enqueue_python("bench.jobs:noop", after_ended=True)
    assert farm.job_counts() == before
    assert store.jobs.get(parent)["has_children"] in (False, 0), "the refused enqueue left no mark"


def test_a_parent_that_succeeded_already_lets_its_child_start_at_once(farm):
    store = farm._store
    me = register(store)
    [parent] = store.jobs.enqueue(WORK)
    claimed = claim(store, me, parent)
    store.runs.finish(claimed[parent], me, "succeeded")
    [child] = farm.enqueue_http("/ok", after=[parent])
    assert state(store, child)[0] == "queued"


def test_two_parents_ending_at_once_release_their_child_exactly_once(farm):
    """Two machines finish the two parents of one child at the same moment: each counts its own parent down under
    the child's row lock, so the child is released once, by whichever ends last."""
    store = farm._store
    a, b = register(store, "a"), register(store, "b")
    for _ in range(5):
        p1, p2 = store.jobs.enqueue(WORK, count=2)
        [child] = store.jobs.enqueue(after(p1, p2))
        [c1] = store.jobs.claim(ClaimRequest(a, 1, 30.0))
        [c2] = store.jobs.claim(ClaimRequest(b, 1, 30.0))
        start = threading.Barrier(2)

        def finish(claimed, me):
            start.wait()
            store.runs.finish(claimed, me, "succeeded")

        threads = [threading.Thread(target=finish, args=(c, m)) for c, m in ((c1, a), (c2, b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        job = store.jobs.get(child)
        assert (job["state"], job["pending"]) == ("queued", 0)
        [taken] = store.jobs.claim(ClaimRequest(a, 64, 30.0))
        store.runs.finish(taken, a, "succeeded")


def test_a_workflow_goes_in_whole_and_shows_its_steps(farm):
    store = farm._store
    me = register(store)
    flow = farm.workflow("nightly")
    flow.step("import", farm.python_spec("bench.jobs:noop", {"day": 1}))
    flow.step("index", farm.python_spec("bench.jobs:noop"), after=["import"])
    flow.step("stats", farm.python_spec("bench.jobs:noop"), after=["import"])
    flow.step("mail", farm.http_spec("/ok", method="POST"), after=["index", "stats"])
    workflow_id = flow.enqueue()
    shown = farm.workflow_info(workflow_id)
    assert shown["name"] == "nightly" and shown["progress"]["total"] == 4
    steps = {s["name"]: s for s in shown["steps"]}
    assert {n: (s["state"], s["after"]) for n, s in steps.items()} == {
        "import": ("queued", []),
        "index": ("waiting", ["import"]),
        "stats": ("waiting", ["import"]),
        "mail": ("waiting", ["index", "stats"]),
    }
    claimed = claim(store, me, steps["import"]["job_id"])
    store.runs.finish(claimed[steps["import"]["job_id"]], me, "succeeded", output=json.dumps({"rows": 3}))
    claimed = claim(store, me, steps["index"]["job_id"], steps["stats"]["job_id"])
    store.runs.finish(claimed[steps["index"]["job_id"]], me, "succeeded", output='"indexed"')
    store.runs.finish(claimed[steps["stats"]["job_id"]], me, "succeeded", output="plain text")
    mail = steps["mail"]["job_id"]
    assert store.flows.results(mail) == {"index": "indexed", "stats": "plain text"}
    assert store.flows.results(steps["index"]["job_id"]) == {"import": {"rows": 3}}
    assert farm.workflow_info(workflow_id)["progress"]["done"] == 3


def test_a_graph_is_enqueued_all_or_nothing(farm):
    store = farm._store
    [taken] = farm.enqueue_http("/ok", key="unique")
    before = farm.job_counts()
    flow = farm.workflow()
    flow.step("a", farm.http_spec("/ok"))
    flow.step("b", farm.http_spec("/ok", key="unique"), after=["a"])
    with pytest.raises(Exception, match="unique"):
        flow.enqueue()
    flow = farm.workflow()
    flow.step("a", farm.http_spec("/ok"))
    flow.step("b", farm.http_spec("/ok", after=[taken + 1000]), after=["a"])
    with pytest.raises(BadJobInput, match="does not exist"):
        flow.enqueue()
    assert farm.job_counts() == before
    assert store.jobs.get(taken)["has_children"] in (False, 0)
    with pytest.raises(BadJobInput, match="not a step added before it"):
        farm.workflow().step("a", farm.http_spec("/ok"), after=["a"])
    with pytest.raises(BadJobInput, match="callback gets the group's outcome as its payload"):
        farm.group([farm.http_spec("/ok")], callback=farm.http_spec("/done"))


def test_a_groups_callback_is_released_once_when_all_have_ended_with_the_counts(farm):
    store = farm._store
    me = register(store)
    specs = [farm.python_spec("bench.jobs:noop", {"n": n}, max_attempts=1) for n in range(4)]
    group_id = farm.group(specs, callback=farm.python_spec("bench.jobs:noop", {"mine": True}), name="tiles")
    info = farm.group_info(group_id)
    callback = info["callback"]["id"]
    assert info["progress"]["total"] == 4 and info["progress"]["done"] == 0
    assert info["callback"]["state"] == "waiting"
    members = sorted(store.jobs.claim(ClaimRequest(me, 64, 30.0)), key=lambda c: c.id)
    assert len(members) == 4
    store.runs.finish(members[0], me, "succeeded")
    store.runs.finish(members[1], me, "failed", error="bad tile")
    store.runs.finish(members[2], me, "succeeded")
    assert farm.group_info(group_id)["progress"]["done"] == 3
    assert state(store, callback)[0] == "waiting"
    assert farm.cancel(members[3].id) == "cancelling"  # running: its owner stops it
    store.runs.finish(members[3], me, "cancelled")
    assert state(store, callback)[0] == "queued"
    [run] = store.jobs.claim(ClaimRequest(me, 64, 30.0))
    assert run.id == callback
    assert json.loads(run.payload) == {
        "group": group_id,
        "total": 4,
        "succeeded": 2,
        "failed": 1,
        "cancelled": 1,
        "failed_ids": [members[1].id, members[3].id],
        "payload": {"mine": True},
    }
    assert farm.group_info(group_id)["progress"] | {"failed_ids": None} == {
        "total": 4,
        "done": 4,
        "waiting": 0,
        "queued": 0,
        "running": 0,
        "succeeded": 2,
        "failed": 1,
        "cancelled": 1,
        "failed_ids": None,
    }


def test_retention_takes_a_finished_childs_links_with_it(farm):
    store = farm._store
    me = register(store)
    group_id = farm.group([farm.http_spec("/ok")], callback=farm.http_spec("/done", method="POST"))
    for _ in range(2):  # the member, then the callback it releases
        [job] = store.jobs.claim(ClaimRequest(me, 64, 30.0))
        store.runs.finish(job, me, "succeeded")
    time.sleep(0.05)
    assert store.jobs.prune(keep_seconds=0.01) == 2
    assert store.rows(select(func.count()).select_from(deps))[0][0] == 0
    assert store.rows(select(func.count()).select_from(flow_jobs))[0][0] == 0
    assert farm.group_info(group_id)["progress"]["total"] == 0


def test_a_groups_members_go_in_each_as_given_in_their_order_and_all_or_none(farm):
    store = farm._store
    specs = [
        farm.python_spec("bench.jobs:noop", {"n": n} if n % 2 else None, priority=n % 3, queue="q" if n > 3 else None)
        for n in range(7)
    ]
    group_id = farm.group([*specs, farm.python_spec("bench.jobs:noop", key="taken")], callback=WORK)
    ids = [step["job_id"] for step in store.flows.read(group_id)["steps"]]
    stored = [store.jobs.get(job_id) for job_id in ids]
    assert sorted(
        (j["payload"] or "", j["priority"], j["queue"], j["state"], j["key"] or "") for j in stored
    ) == sorted(
        (s.payload or "", s.priority, s.queue, "queued", s.key or "")
        for s in [*specs, farm.python_spec("bench.jobs:noop", key="taken")]
    )
    before = farm.job_counts()
    with pytest.raises(Exception, match="taken"):
        farm.group([*specs[:3], farm.python_spec("bench.jobs:noop", key="taken")], callback=WORK)
    assert farm.job_counts() == before


def test_a_bulk_retry_of_a_parent_and_its_child_leaves_the_child_waiting_until_the_parent_succeeds(farm):
    """The issue's trial: A fails for good, B (after A) is cancelled with it, then both are retried in one bulk
    action: B waits for A's second attempt instead of running beside it."""
    store = farm._store
    me = register(store)
    [a] = store.jobs.enqueue(WORK)
    [b] = store.jobs.enqueue(after(a))
    claimed = claim(store, me, a)
    assert store.runs.finish(claimed[a], me, "failed", error="boom") == "failed"
    assert state(store, b) == ("cancelled", f"parent {a} failed")
    assert farm.retry_jobs(JobFilter(queue="default")) == 2
    assert state(store, b)[0] == "waiting"
    claimed = claim(store, me, a)  # B is not claimable beside A's second attempt
    assert store.runs.finish(claimed[a], me, "succeeded") == "succeeded"
    assert state(store, b)[0] == "queued"
    claim(store, me, b)


def test_a_single_retry_of_a_child_waits_for_its_parent_or_is_held_for_a_parent_that_failed(farm):
    """A child retried alone never runs before its parents: with its parent queued again it waits for it; with
    its parent failed for good it stays cancelled, held by that parent, is told so, and comes back with the
    parent's retry."""
    store = farm._store
    me = register(store)
    [a] = store.jobs.enqueue(WORK)
    [b] = store.jobs.enqueue(after(a))
    [c] = store.jobs.enqueue(after(b))
    assert farm.cancel(b) == "cancelled"
    assert farm.retry(b) == "waiting"
    assert state(store, b)[0] == "waiting"
    assert store.jobs.get(b)["pending"] == 1
    claimed = claim(store, me, a)
    assert store.runs.finish(claimed[a], me, "failed", error="boom") == "failed"
    assert state(store, b) == ("cancelled", f"parent {a} failed")
    with pytest.raises(QPError, match=rf"^job {b} stays cancelled: parent {a} failed; retry job {a}, and job {b} "):
        farm.retry(b)
    assert state(store, b) == ("cancelled", f"parent {a} failed")
    assert state(store, c)[0] == "cancelled"
    assert farm.retry(a) == "queued"
    assert state(store, b)[0] == "waiting", "held by its parent: the parent's retry brings it back"
    claimed = claim(store, me, a)
    assert store.runs.finish(claimed[a], me, "succeeded") == "succeeded"
    assert state(store, b)[0] == "queued"


def test_a_retried_groups_callback_waits_for_its_members_and_runs_with_its_outcome(farm):
    """A group's callback cancelled while it waited and retried before its members ended waits for them, and is
    released with the group's outcome as its payload; retried again once it ran, it gets the outcome afresh."""
    store = farm._store
    me = register(store)
    specs = [farm.python_spec("bench.jobs:noop", {"n": n}, max_attempts=1) for n in range(2)]
    group_id = farm.group(specs, callback=farm.python_spec("bench.jobs:noop", {"mine": True}, max_attempts=1))
    callback = farm.group_info(group_id)["callback"]["id"]
    assert farm.cancel(callback) == "cancelled"
    assert farm.retry(callback) == "waiting"
    members = sorted(store.jobs.claim(ClaimRequest(me, 64, 30.0)), key=lambda c: c.id)
    assert [m.id for m in members] != [] and callback not in [m.id for m in members]
    store.runs.finish(members[0], me, "succeeded")
    store.runs.finish(members[1], me, "failed", error="bad")
    outcome = {
        "group": group_id,
        "total": 2,
        "succeeded": 1,
        "failed": 1,
        "cancelled": 0,
        "failed_ids": [members[1].id],
        "payload": {"mine": True},
    }
    [run] = claim(store, me, callback).values()
    assert json.loads(run.payload) == outcome
    store.runs.finish(run, me, "failed", error="callback broke")
    assert farm.retry(callback) == "queued"
    assert json.loads(store.jobs.get(callback)["payload"]) == outcome, "filled afresh, not nested"


@pytest.mark.postgres
def test_a_retry_racing_its_parents_finish_never_leaves_the_child_waiting_for_ever(pg_url, monkeypatch):
    """The fault suite's dependency races found children left `waiting` for ever. A parent's finish counts its
    waiting children down before it commits; a retry of a child counted that parent, not yet committed, as unmet,
    while the finish found no waiting child to count down. Here the finish is held open after its count-down (its
    transaction is the real one), and a retry of the child comes meanwhile, from another process's farm: it must
    wait for the finish and see the parent succeeded."""
    from queueprocessor.farm import Farm
    from queueprocessor.store import runs

    with Farm(pg_url) as farm, Farm(pg_url) as operator, Farm(pg_url) as watcher:
        store = farm._store
        me = register(store)
        [parent] = store.jobs.enqueue(WORK)
        [child] = store.jobs.enqueue(after(parent))
        store.jobs.cancel(child)
        claimed = claim(store, me, parent)
        counted, go_on = threading.Event(), threading.Event()
        ended = runs.dependencies.ended

        def held_open(conn, parents):
            released = ended(conn, parents)
            counted.set()
            go_on.wait(10)
            return released

        monkeypatch.setattr(runs.dependencies, "ended", held_open)
        finishing = threading.Thread(target=store.runs.finish, args=(claimed[parent], me, "succeeded"))
        finishing.start()
        assert counted.wait(10)
        retrying = threading.Thread(target=operator._store.jobs.retry, args=(child,))
        retrying.start()
        waits = text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        with watcher._engine.connect() as conn:
            deadline = time.monotonic() + 10
            while retrying.is_alive() and not conn.execute(waits).scalar() and time.monotonic() < deadline:
                time.sleep(0.02)
        go_on.set()
        finishing.join(10)
        retrying.join(10)
        assert state(store, parent)[0] == "succeeded"
        job = store.jobs.get(child)
        assert (job["state"], job["pending"]) == ("queued", 0)
