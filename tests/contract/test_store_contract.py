"""The store's contract, run against every backend: database time, turns, claims, leases, fences."""

import threading
import time

import pytest
from sqlalchemy import exc, func, select, text, update

from queueprocessor.node.runs import backoff
from queueprocessor.rules.errors import LostLease, NotFound, QPError, SchemaTooNew
from queueprocessor.rules.job import Ending, JobSpec
from queueprocessor.rules.roster import slot_end, slot_of
from queueprocessor.rules.states import Outcome
from queueprocessor.store import schema
from queueprocessor.store.database import ensure_schema
from queueprocessor.store.types import ClaimRequest, Turn
from tests.conftest import BACKENDS, PGBOUNCER, backend_url

HTTP = JobSpec(executor="http", target="/ok")


@pytest.fixture(params=[*BACKENDS, PGBOUNCER])
def db_url(request, tmp_path):
    """Every backend, and PostgreSQL through PgBouncer in transaction pooling mode."""
    return backend_url(request, tmp_path)


def register(store, name="m"):
    return store.machines.register(
        name=name, host="h", instance=f"{name}-{time.monotonic_ns()}", pid=1, version="t", capacity=4
    )


def test_database_time_has_millisecond_precision_and_moves(farm):
    store = farm._store
    samples = [store.ask_time() for _ in range(20)]
    assert abs(samples[0] - time.time()) < 5  # same machine: the database's clock is the real one
    assert all(b >= a for a, b in zip(samples, samples[1:]))
    assert samples[-1] > samples[0]
    assert any(s != round(s) for s in samples)  # not whole seconds
    time.sleep(0.005)
    assert store.ask_time() - samples[-1] >= 0.004


def test_stored_times_come_from_the_database(farm):
    store = farm._store
    before = store.ask_time()
    machine = register(store)
    [job_id] = store.jobs.enqueue(HTTP, delay=10)
    after = store.ask_time()
    job = store.jobs.get(job_id)
    assert before <= job["created_at"] <= after
    assert job["run_at"] == pytest.approx(job["created_at"] + 10, abs=0.01)
    _, _, rows = store.machines.read()
    assert before <= rows[0]["joined_at"] <= after and rows[0]["id"] == machine


def test_a_slot_is_taken_once(farm):
    store = farm._store
    a, b = register(store, "a"), register(store, "b")
    assert store.turns.take(42, a)
    assert not store.turns.take(42, b)
    assert store.turns.take(43, b)
    turns = store.turns.read(0)
    assert [(t["slot"], t["machine_id"]) for t in turns] == [(42, a), (43, b)]


def test_a_turn_that_reaches_the_database_after_its_slot_ended_is_refused(farm):
    """An insert held up past its slot's end would poll beside the next slot's own turn: two polls in one slot."""
    store = farm._store
    a = register(store, "a")
    period = 1.0
    now = store.ask_time()
    over = slot_of(now, period) - 1
    assert not store.turns.take(over, a, ends=slot_end(over, period))
    assert not store.jobs.take_turn_and_claim(over, ClaimRequest(a, 4, 30.0), ends=slot_end(over, period)).won
    current = slot_of(now, period) + 1  # it lasts beyond the next second, whatever this moment's fraction
    assert store.turns.take(current, a, ends=slot_end(current, period))
    assert [t["slot"] for t in store.turns.read(0)] == [current]


def test_claim_takes_due_jobs_by_priority_and_bumps_the_fence(farm):
    store = farm._store
    me = register(store)
    low = store.jobs.enqueue(HTTP)[0]
    high = store.jobs.enqueue(JobSpec(executor="http", target="/ok", priority=5))[0]
    store.jobs.enqueue(HTTP, delay=60)  # not due
    claimed = store.jobs.claim(ClaimRequest(me, 10, lease=5))
    assert [c.id for c in claimed] == [high, low]
    assert all(c.fence == 1 and c.attempts == 1 for c in claimed)
    assert store.jobs.claim(ClaimRequest(me, 10, lease=5)) == []
    job = store.jobs.get(high)
    assert job["state"] == "running" and job["owner"] == me
    assert job["lease_until"] == pytest.approx(job["started_at"] + 5, abs=0.01)
    runs = store.runs.read(job_id=high)
    assert [(r["attempt"], r["machine_id"], r["fence"], r["outcome"]) for r in runs] == [(1, me, 1, "running")]


def test_concurrent_claims_never_share_a_job(farm):
    store = farm._store
    store.jobs.enqueue(HTTP, count=200)
    machines = [register(store, f"m{i}") for i in range(4)]
    got: dict[int, list[int]] = {m: [] for m in machines}

    def worker(machine_id):
        while claimed := store.jobs.claim(ClaimRequest(machine_id, 7, lease=30)):
            got[machine_id].extend(c.id for c in claimed)

    threads = [threading.Thread(target=worker, args=(m,)) for m in machines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [job for jobs in got.values() for job in jobs]
    assert len(everything) == 200 and len(set(everything)) == 200


def test_a_stale_fence_cannot_write(farm):
    store = farm._store
    a, b = register(store, "a"), register(store, "b")
    store.jobs.enqueue(HTTP)
    [first] = store.jobs.claim(ClaimRequest(a, 1, lease=0.05))
    time.sleep(0.1)  # a's lease runs out; b takes the job over with a new fence
    [second] = store.jobs.claim(ClaimRequest(b, 1, lease=30))
    assert second.id == first.id and second.fence == first.fence + 1 and second.attempts == 2
    assert store.runs.renew(a, [(first.id, first.fence)], lease=30) == {}
    with pytest.raises(LostLease):
        store.runs.finish(first, a, "succeeded")
    assert not store.runs.release(first, a, "late")
    assert store.runs.renew(b, [(second.id, second.fence)], lease=30) == {(second.id, second.fence): False}
    assert store.runs.finish(second, b, "succeeded") == "succeeded"
    runs = {r["fence"]: r for r in store.runs.read(job_id=first.id)}
    assert runs[first.fence]["outcome"] == "lost" and runs[second.fence]["outcome"] == "succeeded"


def test_results_of_two_runs_of_one_job_in_one_batch_are_told_apart_by_fence(farm):
    """A node can hold two runs of one job (the older stopped, the newer claimed back) and write both endings in
    one batch: only the run whose fence is current may write, and the answer says which that was."""
    store = farm._store
    a = register(store, "a")
    store.jobs.enqueue(HTTP)
    [old] = store.jobs.claim(ClaimRequest(a, 1, lease=0.05))
    time.sleep(0.1)
    [new] = store.jobs.claim(ClaimRequest(a, 1, lease=30))
    assert (new.id, new.fence) == (old.id, old.fence + 1)
    endings = [Ending(old, Outcome.SUCCEEDED), Ending(new, Outcome.FAILED, "boom")]
    assert store.runs.finish_many(a, endings) == [None, "failed"]
    assert store.jobs.get(new.id)["state"] == "failed"


def test_a_renewal_extends_each_lease_held_as_quoted_and_no_other(farm):
    """Each (job, fence) pair is matched on its own: a job taken over (by a peer, or by ourselves under a newer
    fence) or finished is left out of the answer and its lease alone; every other lease is extended."""
    store = farm._store
    a, b = register(store, "a"), register(store, "b")
    store.jobs.enqueue(HTTP, count=5)
    jobs = store.jobs.claim(ClaimRequest(a, 5, lease=0.05))
    time.sleep(0.1)
    [theirs] = store.jobs.claim(ClaimRequest(b, 1, lease=30))
    [again] = store.jobs.claim(ClaimRequest(a, 1, lease=30))  # one of our own, taken back under a newer fence
    done, *held = [j for j in jobs if j.id not in (theirs.id, again.id)]
    store.runs.finish(done, a, "succeeded")
    before = store.ask_time()
    assert store.runs.renew(a, [(j.id, j.fence) for j in jobs], lease=60) == {(j.id, j.fence): False for j in held}
    assert all(store.jobs.get(j.id)["lease_until"] >= before + 60 for j in held)
    assert all(store.jobs.get(j.id)["lease_until"] < before + 60 for j in (theirs, again))
    assert store.runs.renew(a, [(again.id, again.fence)], lease=60) == {(again.id, again.fence): False}


def test_an_expired_lease_on_the_last_attempt_comes_back_exhausted(farm):
    store = farm._store
    me = register(store)
    store.jobs.enqueue(JobSpec(executor="http", target="/ok", max_attempts=1))
    [first] = store.jobs.claim(ClaimRequest(me, 1, lease=0.05))
    assert not first.exhausted
    time.sleep(0.1)
    [again] = store.jobs.claim(ClaimRequest(me, 1, lease=5))
    assert again.exhausted
    assert store.runs.finish(again, me, "failed", error="lost", retry_in=1) == "failed"


def test_leases_of_a_stalled_farm_are_not_taken_when_asked_not_to(farm):
    store = farm._store
    me = register(store)
    store.jobs.enqueue(HTTP)
    store.jobs.claim(ClaimRequest(me, 1, lease=0.01))
    time.sleep(0.05)
    assert store.jobs.claim(ClaimRequest(me, 1, lease=5, take_expired=False)) == []


def test_failure_retries_with_backoff_until_attempts_run_out(farm):
    store = farm._store
    me = register(store)
    store.jobs.enqueue(JobSpec(executor="http", target="/fail", max_attempts=2))
    [job] = store.jobs.claim(ClaimRequest(me, 1, lease=5))
    delay = backoff(job.attempts)
    before = store.ask_time()
    assert store.runs.finish(job, me, "failed", error="HTTP 500", retry_in=delay) == "queued"
    after = store.ask_time()
    assert before + delay <= store.jobs.get(job.id)["run_at"] <= after + delay  # pushed back in database time
    assert store.jobs.claim(ClaimRequest(me, 1, lease=5)) == []  # not due before its backoff is over
    [job] = store.jobs.claim(ClaimRequest(me, 1, lease=5, horizon=delay))
    assert job.attempts == 2
    assert store.runs.finish(job, me, "failed", error="HTTP 500", retry_in=0.0) == "failed"
    assert store.jobs.get(job.id)["last_error"] == "HTTP 500"


def test_cancel_and_retry(farm):
    store = farm._store
    me = register(store)
    queued, running = store.jobs.enqueue(HTTP, count=2)
    assert store.jobs.cancel(queued) == "cancelled"
    [job] = store.jobs.claim(ClaimRequest(me, 1, lease=5))
    assert job.id == running
    assert store.jobs.cancel(running) == "cancelling"
    assert store.runs.renew(me, [(job.id, job.fence)], lease=5) == {(job.id, job.fence): True}
    store.runs.finish(job, me, "cancelled", error="cancelled by an operator")
    with pytest.raises(QPError, match="already cancelled"):
        store.jobs.cancel(running)
    store.jobs.retry(queued)
    assert store.jobs.get(queued)["state"] == "queued"
    with pytest.raises(QPError, match="only failed or cancelled"):
        store.jobs.retry(queued)
    with pytest.raises(NotFound):
        store.jobs.retry(999_999)


def test_wishes_and_machine_lookup(farm):
    store = farm._store
    a = register(store, "alpha")
    register(store, "twin")
    register(store, "twin")
    assert store.machines.find("alpha")["id"] == a
    assert store.machines.find(str(a))["name"] == "alpha"
    with pytest.raises(QPError, match="give the id"):
        store.machines.find("twin")
    with pytest.raises(NotFound):
        store.machines.find("nobody")
    store.machines.wish(a, "drain")
    # The node clears exactly the wish it applied.
    store.machines.heartbeat(
        a,
        state="draining",
        applied_wish="drain",
        running=0,
        done=0,
        failed=0,
        offset=0.0,
        rtt=0.001,
        error_bound=0.0005,
    )
    row = store.machines.find("alpha")
    assert row["state"] == "draining" and row["wish"] is None


def test_keys_are_unique(farm):
    farm._store.jobs.enqueue(JobSpec(executor="http", target="/ok", key="Report-26@2026-11-22"))
    with pytest.raises(QPError, match="already exists"):
        farm._store.jobs.enqueue(JobSpec(executor="http", target="/ok", key="Report-26@2026-11-22"))
    farm._store.jobs.enqueue(HTTP)  # jobs without a key do not collide


def test_a_newer_schema_is_refused(farm):
    with farm._engine.begin() as conn:
        conn.execute(update(schema.meta).where(schema.meta.c.key == "schema_version").values(value="99"))
    with pytest.raises(SchemaTooNew, match="upgrade QueueProcessor"):
        ensure_schema(farm._engine)


def test_turn_log_is_pruned_by_age(farm):
    store = farm._store
    me = register(store)
    store.turns.take(1, me)
    time.sleep(0.05)
    store.turns.take(2, me)
    assert store.turns.prune(keep_seconds=0.03) == 1
    assert [t["slot"] for t in store.turns.read(0)] == [2]


def test_a_turn_and_its_claim_go_together(farm):
    store = farm._store
    a, b = register(store, "a"), register(store, "b")
    store.jobs.enqueue(HTTP, count=3)
    turn = store.jobs.take_turn_and_claim(7, ClaimRequest(a, 2, lease=5))
    claimed = turn.claimed
    assert turn.won and len(claimed) == 2 and all(c.fence == 1 for c in claimed)
    assert store.jobs.take_turn_and_claim(7, ClaimRequest(b, 2, lease=5)) == Turn(
        False, []
    )  # the slot was taken: nothing claimed
    assert store.jobs.counts()["queued"] == 1
    assert store.jobs.take_turn_and_claim(8, ClaimRequest(b, 0, lease=5)) == Turn(
        True, []
    )  # no room: no claim, and no looks asked
    assert [(t["slot"], t["machine_id"]) for t in store.turns.read(0)] == [(7, a), (8, b)]
    assert {r["job_id"] for r in store.runs.read()} == {c.id for c in claimed}


def test_expired_leases_go_back_to_the_queue_ahead_of_newer_work(farm):
    store = farm._store
    dead, alive = register(store, "dead"), register(store, "alive")
    [old] = store.jobs.enqueue(HTTP)
    [first] = store.jobs.claim(ClaimRequest(dead, 1, lease=0.05))
    store.jobs.enqueue(HTTP)  # newer work
    assert not store.jobs.any_expired()
    time.sleep(0.1)
    assert store.jobs.any_expired()  # what a machine that may not take it over yet tells the others
    assert store.jobs.requeue_expired(before=store.ask_time()) == 1
    assert not store.jobs.any_expired()
    job = store.jobs.get(old)
    assert (job["state"], job["owner"], job["attempts"]) == ("queued", None, 1)
    [again] = store.jobs.claim(ClaimRequest(alive, 1, lease=5, take_expired=False))
    assert again.id == old and again.attempts == 2 and again.fence == first.fence + 1
    assert [r["outcome"] for r in sorted(store.runs.read(job_id=old), key=lambda r: r["fence"])] == ["lost", "running"]


def test_backoff_doubles_up_to_its_cap_with_jitter_between_half_and_the_whole_step():
    for attempt, step in [(1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (9, 256.0), (10, 300.0), (40, 300.0)]:
        waits = [backoff(attempt) for _ in range(2000)]
        assert all(step / 2 <= w <= step for w in waits)
        assert min(waits) < 0.55 * step and max(waits) > 0.95 * step  # spread over the whole range
    assert all(0.5 <= backoff(1, base=1.0, cap=0.5) * 2 <= 1.0 for _ in range(100))


def test_a_run_has_one_row_written_with_its_end_or_none_at_all(farm):
    """A run's row is written once, when it ends other than in its job's success, in the same transaction as its
    job's new state (one write per job at the claim and one at the end). While it runs, the history shows it from
    its job's row; a failure at its end (here: the history table is missing) leaves the job running and ours, with
    no row, and the next try writes the one row, whose start is the claim's."""
    store = farm._store
    me = register(store)
    [job_id] = store.jobs.enqueue(HTTP)
    [claimed] = store.jobs.claim(ClaimRequest(me, 1, lease=30))
    started = store.jobs.get(job_id)["started_at"]
    assert [(r["id"], r["machine_id"], r["outcome"], r["started_at"]) for r in store.runs.read(job_id=job_id)] == [
        (None, me, "running", started)
    ]
    rename = "ALTER TABLE {} RENAME TO {}"
    with farm._engine.begin() as conn:
        conn.execute(text(rename.format("qp_runs", "qp_runs_away")))
    try:
        with pytest.raises(exc.DBAPIError):
            store.runs.finish(claimed, me, "failed", error="boom")
    finally:
        with farm._engine.begin() as conn:
            conn.execute(text(rename.format("qp_runs_away", "qp_runs")))
    job = store.jobs.get(job_id)
    assert (job["state"], job["owner"], job["fence"], job["attempts"]) == ("running", me, claimed.fence, 1)
    assert store.runs.finish(claimed, me, "failed", error="boom") == "failed"
    [run] = store.runs.read(job_id=job_id)
    assert (run["attempt"], run["machine_id"], run["fence"], run["outcome"], run["error"], run["started_at"]) == (
        1,
        me,
        claimed.fence,
        "failed",
        "boom",
        started,
    )
    assert run["id"] is not None and run["finished_at"] >= started
    with farm._engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(schema.runs)).scalar() == 1


def test_a_success_is_kept_on_its_jobs_row_and_read_as_a_run_beside_the_runs_before_it(farm):
    """A run that ends its job in success writes no row of its own: its job's row is its record (machine, fence,
    attempt, start, end, output), read as a run by every reader of runs, after the failed attempt before it, and
    deleted with it."""
    store = farm._store
    me = register(store)
    [job_id] = store.jobs.enqueue(HTTP)
    [first] = store.jobs.claim(ClaimRequest(me, 1, lease=30))
    assert store.runs.finish(first, me, "failed", error="boom") == "failed"
    assert store.jobs.retry(job_id) == "queued"
    [second] = store.jobs.claim(ClaimRequest(me, 1, lease=30))
    assert store.runs.finish(second, me, "succeeded", output='{"n": 1}') == "succeeded"
    job = store.jobs.get(job_id)
    runs = sorted(store.runs.read(job_id=job_id), key=lambda run: run["fence"])
    assert [(r["attempt"], r["fence"], r["outcome"], r["error"], r["output"], r["machine_name"]) for r in runs] == [
        (1, first.fence, "failed", "boom", None, "m"),
        (2, second.fence, "succeeded", None, '{"n": 1}', "m"),
    ]
    assert (runs[1]["id"], runs[1]["started_at"], runs[1]["finished_at"]) == (
        None,
        job["started_at"],
        job["finished_at"],
    )
    assert store.jobs.keyed(job_id=job_id)["last_output"] == '{"n": 1}'
    with farm._engine.connect() as conn:
        assert conn.execute(select(schema.runs.c.fence)).scalars().all() == [first.fence]
    assert store.views.machine_throughput(0, 2**40) == {me: {"failed": 1, "succeeded": 1}}
    assert store.jobs.prune(-1) == 1
    assert store.runs.read(job_id=job_id) == []


def test_finished_jobs_and_their_runs_are_deleted_after_their_keeping_age(farm):
    store = farm._store
    me = register(store)
    ids = store.jobs.enqueue(HTTP, count=6)
    claimed = {c.id: c for c in store.jobs.claim(ClaimRequest(me, 6, lease=30))}
    store.runs.finish(claimed[ids[0]], me, "succeeded")
    store.runs.finish(claimed[ids[1]], me, "failed", error="HTTP 500")
    store.runs.finish(claimed[ids[2]], me, "cancelled", error="cancelled by an operator")
    store.runs.finish(claimed[ids[3]], me, "failed", error="HTTP 500", retry_in=60)  # back in the queue: kept
    with farm._engine.begin() as conn:  # an hour ago, so no pause of a loaded machine can move a job across the age
        conn.execute(
            update(schema.jobs)
            .where(schema.jobs.c.id.in_(ids[:3]))
            .values(finished_at=schema.jobs.c.finished_at - 3600)
        )
    store.runs.finish(claimed[ids[4]], me, "succeeded")  # finished lately: kept
    [queued] = store.jobs.enqueue(HTTP)
    assert store.jobs.prune(keep_seconds=600, batch=2) == 2  # a full batch: there may be more
    assert store.jobs.prune(keep_seconds=600, batch=2) == 1
    assert store.jobs.prune(keep_seconds=600, batch=2) == 0
    left = {j["id"]: j["state"] for j in store.jobs.newest()}
    assert left == {ids[3]: "queued", ids[4]: "succeeded", ids[5]: "running", queued: "queued"}
    assert {r["job_id"] for r in store.runs.read()} == {ids[3], ids[4], ids[5]}


@pytest.mark.postgres
def test_claims_and_results_go_on_after_the_database_drops_their_connection(pg_url):
    """Results keep their connection between calls (no checkout, no ping per call): one the server dropped costs
    the call that finds out, and the next call connects again, fences and run rows intact. Claims take the
    pool's, which finds the dropped one closed (store.connections.closing) and opens another."""
    from queueprocessor.farm import Farm

    farm = Farm(pg_url)
    try:
        store = farm._store
        me = register(store)
        ids = store.jobs.enqueue(HTTP, count=3)
        first, second = store.jobs.claim(ClaimRequest(me, 2, lease=30))
        store.runs.finish(first, me, "succeeded")
        with farm._engine.begin() as conn:  # as a restart or a failover would
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        with pytest.raises(exc.DBAPIError):
            store.runs.finish(second, me, "succeeded")
        assert store.runs.finish(second, me, "succeeded") == "succeeded"
        [third] = store.jobs.claim(ClaimRequest(me, 1, lease=30))
        assert {first.id, second.id, third.id} == set(ids)
        runs = store.runs.read()
        assert sorted((r["job_id"], r["outcome"]) for r in runs) == [
            (first.id, "succeeded"),
            (second.id, "succeeded"),
            (third.id, "running"),
        ]
    finally:
        farm.close()


# -- each store's methods that the tests above do not reach ---------------------------------------------------


def test_the_farm_settings_first_stored_win(farm):
    settings = farm._store.settings
    have = settings.read()
    adopted = settings.adopt({"x_new": "1"} | {key: "changed" for key in have})
    assert adopted == have | {"x_new": "1"} == settings.read()  # a new key is stored, the old values stand


def test_a_clock_sample_times_one_round_trip_of_the_database_time(farm):
    store = farm._store
    sample = store.sample_clock(time.monotonic)
    assert sample.t0 <= sample.t1 and abs(sample.db - store.ask_time()) < 1


def test_the_connection_kept_for_results_is_given_back_and_taken_again(farm):
    store = farm._store
    me = register(store)
    first, second = store.jobs.enqueue(HTTP, count=2)
    [a, b] = store.jobs.claim(ClaimRequest(me, 2, lease=30))
    assert store.runs.finish_many(me, [Ending(a, Outcome.SUCCEEDED)]) == ["succeeded"]
    store.idle()  # used just now: kept
    store.give_back()  # given back at once
    assert store.runs.finish_many(me, [Ending(b, Outcome.SUCCEEDED)]) == ["succeeded"]
    assert {store.jobs.get(i)["state"] for i in (first, second)} == {"succeeded"}


def test_a_job_claimed_ahead_of_its_time_starts_when_it_is_marked_started(farm):
    store = farm._store
    me = register(store)
    store.jobs.enqueue(HTTP, delay=0.2)
    assert not store.jobs.any_due()
    [job] = store.jobs.claim(ClaimRequest(me, 1, lease=30, horizon=1.0))
    claimed_at = store.jobs.get(job.id)["started_at"]
    time.sleep(0.05)
    store.runs.mark_started(job)
    assert store.jobs.get(job.id)["started_at"] >= claimed_at + 0.04


def test_any_due_looks_only_where_it_is_asked(farm):
    store = farm._store
    store.jobs.enqueue(JobSpec(executor="http", target="/ok", queue="reports"))
    assert store.jobs.any_due() and store.jobs.any_due(among=("reports",))
    assert not store.jobs.any_due(among=("default",))
    assert not store.jobs.any_due(besides=("reports",))


def test_a_key_is_held_by_its_job_until_it_finishes_and_gives_it_up(farm):
    store = farm._store
    me = register(store)
    spec = JobSpec(executor="http", target="/ok", key="k1")
    [job_id] = store.jobs.enqueue(spec)
    assert store.jobs.free_key("k1") == 0  # still queued: the key stays
    [job] = store.jobs.claim(ClaimRequest(me, 1, lease=30))
    store.runs.finish(job, me, Outcome.SUCCEEDED, output="done")
    held = store.jobs.keyed(key="k1")
    assert held["id"] == job_id and held["machine_name"] == "m" and held["last_output"] == "done"
    assert store.jobs.keyed(job_id=job_id)["key"] == "k1" and store.jobs.keyed(key="nobody") is None
    assert store.jobs.free_key("k1") == 1 and store.jobs.keyed(key="k1") is None
    assert store.jobs.enqueue(spec) != [job_id]  # the key is free again


def test_the_singletons_jobs_are_those_of_kind_singleton_that_hold_a_key(farm):
    store = farm._store
    store.jobs.enqueue(JobSpec(executor="http", target="/ok", key="plain"))
    [single] = store.jobs.enqueue(JobSpec(executor="http", target="/ok", key="singleton:s", kind="singleton"))
    assert [(j["id"], j["owner_name"]) for j in store.jobs.singletons()] == [(single, None)]


def test_a_turn_records_what_its_holder_claimed_and_whether_it_left_a_backlog(farm):
    store = farm._store
    me = register(store)
    slot = slot_of(store.ask_time(), 1.0)
    assert store.turns.take(slot, me)
    store.turns.record(slot, 3, backlog=False)
    store.turns.record(slot, 2, backlog=True)
    [turn] = store.turns.read(0)
    assert (turn["claimed"], bool(turn["backlog"]), turn["machine_name"]) == (5, True, "m")
    assert store.machines.read(backlog_since=slot)[1] == slot
    assert store.machines.read(backlog_since=slot + 1)[1] is None


def test_a_stopped_machine_is_found_by_its_id_but_not_by_its_name(farm):
    store = farm._store
    me = register(store, "leaver")
    store.machines.mark_stopped(me)
    assert store.machines.find(str(me))["state"] == "stopped"
    with pytest.raises(NotFound):
        store.machines.find("leaver")
