"""A job's key on its own terms (rules/keys.py, store/key_holds.py), on SQLite, PostgreSQL and PgBouncer: how long
each scope holds a key, what each on_conflict answers, debounce, and the refusals of options that do not go
together. Jobs are claimed and finished through the store's own claim and finish, as a node does."""

import threading

import pytest
from sqlalchemy import update

from queueprocessor.grabs import AlreadyTaken
from queueprocessor.rules.errors import BadJobInput, InvalidJob
from queueprocessor.store.schema import jobs
from tests.conftest import BACKENDS, PGBOUNCER, backend_url
from tests.support import pyjobs
from tests.support.work import run_cli


@pytest.fixture(params=[*BACKENDS, PGBOUNCER])
def db_url(request, tmp_path):
    return backend_url(request, tmp_path)


def enqueue(farm, payload=None, key="k", **options):
    return farm.submit(farm.python_spec(pyjobs.noop, payload, key=key, **options))


def machine(farm) -> int:
    return farm._store.machines.register(name="m", host="h", instance="m-i", pid=1, version="t", capacity=8)


def start(farm, me, job_id):
    """Claim `job_id` as a node would (the only job due)."""
    from queueprocessor.store.types import ClaimRequest

    [claimed] = farm._store.jobs.claim(ClaimRequest(me, 1, 30.0))
    assert claimed.id == job_id
    return claimed


def end(farm, me, job_id, outcome="succeeded"):
    farm._store.runs.finish(start(farm, me, job_id), me, outcome, error=None if outcome == "succeeded" else "boom")


def job(farm, job_id):
    return farm._store.jobs.get(job_id)


def test_a_key_without_terms_is_held_while_its_row_is_kept_as_before(farm):
    me = machine(farm)
    [first] = enqueue(farm).ids
    end(farm, me, first, "failed")
    with pytest.raises(AlreadyTaken):
        enqueue(farm)


@pytest.mark.parametrize("scope", ["waiting", "unfinished"])
def test_a_scoped_key_is_held_until_its_job_starts_or_ends(farm, scope):
    me = machine(farm)
    [first] = enqueue(farm, key_scope=scope).ids
    with pytest.raises(AlreadyTaken):
        enqueue(farm)
    claimed = start(farm, me, first)
    if scope == "unfinished":
        with pytest.raises(AlreadyTaken):
            enqueue(farm)
        farm._store.runs.finish(claimed, me, "succeeded")
    [second] = enqueue(farm, key_scope=scope).ids
    assert second != first
    assert job(farm, first)["key"] is None and job(farm, second)["key"] == "k"  # one job holds a key at a time


def test_a_key_held_for_a_period_after_success_is_free_after_it_or_after_a_failure(farm):
    me = machine(farm)
    [first] = enqueue(farm, key_for=3600).ids
    end(farm, me, first)
    with pytest.raises(AlreadyTaken):
        enqueue(farm)
    with farm._engine.begin() as conn:  # an hour and a second later, as the database's clock would say
        conn.execute(update(jobs).where(jobs.c.id == first).values(finished_at=jobs.c.finished_at - 3601))
    [second] = enqueue(farm, key_for=3600).ids
    end(farm, me, second, "failed")  # failed for good: the key is given up at once
    assert enqueue(farm).ids != [second]


def test_a_key_held_until_a_time_is_held_past_success_until_then(farm):
    me = machine(farm)
    now = farm._store.ask_time()
    [first] = enqueue(farm, key_until=now + 3600).ids
    end(farm, me, first)
    with pytest.raises(AlreadyTaken):
        enqueue(farm)
    [late] = enqueue(farm, key="late", key_until=now - 1).ids  # a time passed: held only while unfinished
    end(farm, me, late)
    assert enqueue(farm, key="late").ids != [late]


def test_on_conflict_existing_returns_the_holder_and_writes_nothing(farm):
    [first] = enqueue(farm, {"n": 1}).ids
    again = enqueue(farm, {"n": 2}, on_conflict="existing")
    assert (again.ids, again.settled) == ([first], "existing")
    assert job(farm, first)["payload"] == '{"n":1}'
    assert farm._store.jobs.counts()["queued"] == 1


def test_on_conflict_replace_gives_a_waiting_holder_the_new_payload_and_time(farm):
    [first] = enqueue(farm, {"n": 1}).ids
    before = job(farm, first)["run_at"]
    again = farm.submit(farm.python_spec(pyjobs.noop, {"n": 2}, key="k", on_conflict="replace"), delay=600)
    assert (again.ids, again.settled) == ([first], "replaced")
    replaced = job(farm, first)
    assert replaced["payload"] == '{"n":2}' and replaced["run_at"] >= before + 599


def test_on_conflict_replace_refuses_a_holder_that_has_started(farm):
    me = machine(farm)
    [first] = enqueue(farm, key_scope="unfinished").ids
    start(farm, me, first)
    with pytest.raises(InvalidJob, match=f"job {first} holds key 'k' and has started"):
        enqueue(farm, on_conflict="replace")


def test_debounce_moves_the_one_waiting_job_and_keeps_the_last_payload(farm):
    first = enqueue(farm, {"n": 1}, debounce=30)
    due = job(farm, first.ids[0])["run_at"]
    second = enqueue(farm, {"n": 2}, debounce=60)
    assert (second.ids, second.settled) == (first.ids, "debounced")
    moved = job(farm, first.ids[0])
    assert moved["payload"] == '{"n":2}' and moved["run_at"] >= due + 29
    enqueue(farm, {"n": 3}, debounce=60, on_conflict="existing")  # the first payload kept... by the one asked
    assert job(farm, first.ids[0])["payload"] == '{"n":2}'


def test_debounce_never_moves_a_job_past_its_first_enqueue_plus_max_delay(farm):
    [first] = enqueue(farm, debounce=30, max_delay=40).ids
    created = job(farm, first)["created_at"]
    for _ in range(3):
        enqueue(farm, debounce=30, max_delay=40)
    assert job(farm, first)["run_at"] <= created + 40


def test_debounce_after_the_job_started_makes_a_new_one(farm):
    me = machine(farm)
    [first] = enqueue(farm, debounce=0.001).ids
    start(farm, me, first)
    second = enqueue(farm, debounce=30)
    assert second.ids != [first] and second.settled is None


def test_concurrent_enqueues_of_one_debounced_key_leave_one_job(farm):
    barrier = threading.Barrier(6)
    answers = []

    def enqueuer(n):
        barrier.wait()
        for i in range(10):
            answers.append(enqueue(farm, {"n": n, "i": i}, debounce=60).ids[0])

    threads = [threading.Thread(target=enqueuer, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(answers)) == 1 and farm._store.jobs.counts()["queued"] == 1


@pytest.mark.parametrize(
    "options, said",
    [
        (dict(key=None, key_scope="waiting"), "key_scope needs key"),
        (dict(key_scope="forever"), "key_scope must be kept, waiting, unfinished (got 'forever')"),
        (dict(on_conflict="merge"), "on_conflict must be reject, existing, replace (got 'merge')"),
        (dict(key_until=1.0, key_for=5.0), "give key_until or key_for, not both"),
        (dict(key_for=5.0, key_scope="waiting"), "key_for holds the key until the job ends"),
        (dict(key_for=-1.0), "key_for must be seconds after success"),
        (dict(debounce=0.0), "debounce must be a positive number of seconds"),
        (dict(max_delay=5.0), "max_delay needs debounce"),
        (dict(debounce=10.0, max_delay=5.0), "max_delay must be seconds from the debounce (10)"),
        (dict(debounce=10.0, key_scope="unfinished"), "debounce moves a job that has not started"),
        (dict(debounce=10.0, on_conflict="reject"), "debounce moves the waiting job; on_conflict reject"),
    ],
)
def test_options_that_do_not_go_together_are_refused_in_one_line(farm, options, said):
    with pytest.raises(BadJobInput, match="^" + said.replace("(", r"\(").replace(")", r"\)")):
        enqueue(farm, **({"key": "k"} | options))


def test_debounce_and_on_conflict_answer_one_job_and_debounce_sets_the_time(farm):
    spec = farm.python_spec(pyjobs.noop, key="k", debounce=10)
    with pytest.raises(BadJobInput, match="^debounce answers an enqueue of one job: give no count"):
        farm.submit(spec, count=2)
    with pytest.raises(BadJobInput, match="^debounce sets the job's time: give no delay"):
        farm.submit(spec, delay=5)


def test_enqueue_at_the_cli_says_how_a_held_key_was_settled(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'farm.db'}"
    enqueue_cli = ("--db", db, "enqueue", "http", "/reindex", "--key", "shop-7")
    assert run_cli(*enqueue_cli, "--debounce", "30", "--max-delay", "300") == 0
    assert run_cli(*enqueue_cli, "--debounce", "30", "--max-delay", "300", "--payload", '{"n": 2}') == 0
    assert run_cli(*enqueue_cli, "--on-conflict", "existing") == 0
    assert run_cli(*enqueue_cli) == 1
    assert run_cli(*enqueue_cli, "--key-for", "60", "--key-scope", "waiting") == 1
    said = capsys.readouterr()
    assert said.out.splitlines() == [
        "enqueued job 1",
        "job 1 holds key 'shop-7': its time moved (--debounce)",
        "job 1 holds key 'shop-7': nothing enqueued (--on-conflict existing)",
    ]
    errors = [line for line in said.err.splitlines() if line.startswith("error: ")]
    assert errors[0].startswith("error: shop-7 was taken first by ")
    assert errors[1] == (
        "error: --key-for holds the key until the job ends and then for its window: give no --key-scope with it"
    )


def test_a_workflow_or_group_takes_key_scopes_but_no_conflict_answer(farm):
    farm.group([farm.python_spec(pyjobs.noop, key="g", key_scope="waiting")])
    assert farm._store.jobs.keyed(key="g")["key_scope"] == "waiting"
    with pytest.raises(BadJobInput, match="^on_conflict answers an enqueue of one job: give it to no step"):
        farm.group([farm.python_spec(pyjobs.noop, key="h", on_conflict="existing")])
    flow = farm.workflow()
    flow.step("a", farm.python_spec(pyjobs.noop, key="w", debounce=5))
    with pytest.raises(BadJobInput, match="^debounce answers an enqueue of one job: give it to no step"):
        flow.enqueue()
    assert farm._store.jobs.counts()["queued"] == 1
