"""Fair shares and limits per key (docs/design.md §9): a fair queue's claims take its keys' jobs in turn by weight,
whatever each key has waiting; a limit per key holds within one claim and across claims; a claim that does not
keep the limit takes none of the queue. On SQLite, PostgreSQL and PgBouncer."""

from collections import Counter

import pytest
from sqlalchemy import select, update
from sqlalchemy.dialects.mssql import pyodbc

from queueprocessor.rules.errors import BadJobInput, BadQueueInput
from queueprocessor.rules.job import Ending, JobSpec, work_spec
from queueprocessor.rules.states import Outcome
from queueprocessor.store.schema import jobs, key_buckets
from queueprocessor.store.sql.claim import ClaimShape, claim_statement
from queueprocessor.store.types import ClaimRequest, Plan
from tests.conftest import BACKENDS, PGBOUNCER, backend_url
from tests.support.work import PYJOBS, run_cli

NOOP = f"{PYJOBS}:noop"


@pytest.fixture(params=[*BACKENDS, PGBOUNCER])
def db_url(request, tmp_path):
    return backend_url(request, tmp_path)


def spec(key=None, queue="t", **extra) -> JobSpec:
    return JobSpec("python", NOOP, queue=queue, fair_key=key, **extra)


def machine(farm, name="m") -> int:
    return farm._store.machines.register(
        name=name, host="h", instance=f"{name}-i", pid=1, version="t", capacity=64, queues="t"
    )


def claim(farm, me, limit, keyed=True):
    plan = Plan(alone=(("t", limit, True),), keyed=("t",) if keyed else ())
    return farm._store.jobs.claim(ClaimRequest(me, limit, 30.0, plan=plan))


def keys_of(farm, claimed) -> list[str | None]:
    return [farm._store.jobs.get(job.id)["fair_key"] for job in claimed]


def test_a_key_with_a_few_jobs_takes_its_turn_at_once_behind_a_flood(farm):
    me = machine(farm)
    farm.set_queue("t", fair=True)
    farm._store.jobs.enqueue(spec("flood"), count=50)  # one statement of copies on PostgreSQL
    small = [farm._store.jobs.enqueue(spec("small"))[0] for _ in range(3)]
    first = claim(farm, me, 6)
    assert Counter(keys_of(farm, first)) == {"flood": 3, "small": 3}, "the keys take turns from the first claim on"
    assert {job.id for job in first} >= set(small)
    farm.set_queue("t", fair=False)
    farm._store.jobs.enqueue(spec("small"))
    plain = farm._store.jobs.claim(ClaimRequest(me, 6, 30.0))  # no longer held back: the main branch takes it
    assert set(keys_of(farm, plain)) == {"flood"}, "not fair: the oldest first"


def test_weights_share_the_claims_and_a_key_spread_over_order_keys_takes_one_share(farm):
    me = machine(farm)
    farm.set_queue("t", fair=True)
    farm._store.jobs.enqueue(spec("heavy", fair_weight=2.0), count=30)
    farm._store.jobs.enqueue(spec("light"), count=30)
    assert Counter(keys_of(farm, claim(farm, me, 6))) == {"heavy": 4, "light": 2}
    for n in range(20):  # one tenant's jobs over twenty order keys: still its one share
        farm._store.jobs.enqueue(spec("spread", queue="t", order_key=f"shard-{n}"))
    taken = Counter(keys_of(farm, claim(farm, me, 12)))
    assert taken["spread"] <= 5 and taken["heavy"] >= 4, taken


def test_jobs_without_a_key_take_one_share_together(farm):
    me = machine(farm)
    farm.set_queue("t", fair=True)
    farm._store.jobs.enqueue(spec(None), count=20)
    for _ in range(3):
        farm._store.jobs.enqueue(spec(None))
    farm._store.jobs.enqueue(spec("tenant"), count=3)
    assert Counter(keys_of(farm, claim(farm, me, 6))) == {None: 3, "tenant": 3}


def test_a_queue_takes_the_fairness_key_of_jobs_without_one_from_their_payload_or_order_key(farm, capsys):
    store = farm._store
    me = machine(farm)
    assert run_cli("--db", farm.url, "queue", "set", "t", "--key-limit", "1", "--fair-from", "payload.tenant") == 0
    assert "keys from payload.tenant" in capsys.readouterr().out
    for tenant in ("a", "a", "b"):
        store.jobs.enqueue(spec(payload=f'{{"tenant": "{tenant}", "n": 1}}'))
    store.jobs.enqueue(spec(payload='{"tenant": "b"}'), count=2)  # copies: the key read once
    store.jobs.enqueue(spec("own", payload='{"tenant": "a"}'))  # a key of its own wins
    store.jobs.enqueue(spec(payload='{"other": 1}'))  # no such field: no key
    assert Counter(keys_of(farm, claim(farm, me, 20))) == {"a": 1, "b": 1, "own": 1, None: 1}
    farm.set_queue("t", fair_from="order_key")
    store.jobs.enqueue(spec(order_key="k1"))
    assert store.jobs.newest(queue="t", limit=1)[0]["fair_key"] == "k1"
    for bad in ("payload.", "payload.a b", "tenant", ""):
        with pytest.raises(BadQueueInput, match="fair_from"):
            farm.set_queue("t", fair_from=bad)


def test_a_limit_per_key_holds_within_a_claim_and_across_claims(farm):
    store = farm._store
    me = machine(farm)
    farm.set_queue("t", key_limit=2)
    store.jobs.enqueue(spec("a"), count=5)
    store.jobs.enqueue(spec("b"), count=5)
    store.jobs.enqueue(spec(None), count=2)
    [heavy] = store.jobs.enqueue(spec("c", cost=2))
    store.jobs.enqueue(spec("c"))
    first = claim(farm, me, 20)
    assert Counter(keys_of(farm, first)) == {"a": 2, "b": 2, None: 2, "c": 1}, "c's job of cost 2 fills its key"
    assert heavy in {job.id for job in first}
    assert claim(farm, me, 20) == [], "every key is full"
    done = next(job for job in first if keys_of(farm, [job]) == ["a"])
    store.runs.finish_many(me, [Ending(done, Outcome.SUCCEEDED)])
    assert keys_of(farm, claim(farm, me, 20)) == ["a"], "one place of a's is free again"
    store.count(update(jobs).where(jobs.c.id == heavy).values(lease_until=jobs.c.lease_until - 60))  # its node died
    assert [job.id for job in claim(farm, me, 20)] == [heavy], "taken over in its place: c's other job still waits"


def test_a_rate_per_key_spends_each_keys_own_bucket(farm):
    store = farm._store
    me = machine(farm)
    farm.set_queue("t", key_rate="2/min")  # a bucket of one start per key: what a period brings, at least one
    store.jobs.enqueue(spec("a"), count=3)
    store.jobs.enqueue(spec("b"), count=3)
    store.jobs.enqueue(spec(None))
    assert Counter(keys_of(farm, claim(farm, me, 10))) == {"a": 1, "b": 1, None: 1}
    assert claim(farm, me, 10) == [], "no token left for half a minute"
    store.count(update(key_buckets).where(key_buckets.c.key == "a").values(refilled_at=key_buckets.c.refilled_at - 30))
    assert keys_of(farm, claim(farm, me, 10)) == ["a"], "a's bucket refilled, b's not"
    farm.set_queue("t", key_rate=None)
    assert Counter(keys_of(farm, farm._store.jobs.claim(ClaimRequest(me, 10, 30.0)))) == {"a": 1, "b": 2}
    assert farm.queue("t").key_rate is None and store.rows(select(key_buckets)) == []


def test_a_job_that_costs_more_than_its_keys_bucket_holds_starts_when_the_bucket_is_full(farm):
    me = machine(farm)
    farm.set_queue("t", key_rate="2/min")  # a bucket of one start
    [big] = farm._store.jobs.enqueue(spec("a", cost=3))
    farm._store.jobs.enqueue(spec("a"))
    assert [job.id for job in claim(farm, me, 10)] == [big], "a full bucket lets it start, and goes into debt"
    [(tokens,)] = farm._store.rows(select(key_buckets.c.tokens))
    assert tokens == pytest.approx(-2, abs=0.01)
    assert claim(farm, me, 10) == [], "the debt is paid back first"


def test_the_busiest_keys_are_listed_with_their_use(farm, capsys):
    me = machine(farm)
    farm.set_queue("t", key_limit=3, key_rate="600/min")  # a bucket of what a period brings: ten starts
    farm._store.jobs.enqueue(spec("big"), count=6)
    farm._store.jobs.enqueue(spec("small", cost=2), count=2)
    farm._store.jobs.enqueue(spec(None))
    claim(farm, me, 20)
    keys = farm.queue_keys("t")
    assert [(k.key, k.running, k.waiting) for k in keys] == [("big", 3, 3), ("small", 2, 1)]
    assert keys[0].tokens is not None and keys[0].tokens < keys[1].tokens, "big spent more of its bucket"
    assert [k.key for k in farm.queue_keys("t", most=1)] == ["big"]
    assert run_cli("--db", farm.url, "queue", "keys", "t") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["key", "running", "waiting", "tokens"] and out[-2].split()[:3] == ["big", "3/3", "3"]
    assert run_cli("--db", farm.url, "queue", "keys", "nowhere") == 1
    assert "no queue named 'nowhere'" in capsys.readouterr().err


def test_a_claim_that_does_not_keep_the_limit_per_key_takes_none_of_the_queue(farm):
    me = machine(farm)
    farm.set_queue("t", key_limit=1)
    farm._store.jobs.enqueue(spec("a"), count=3)
    assert claim(farm, me, 8, keyed=False) == []
    assert farm._store.jobs.claim(ClaimRequest(me, 8, 30.0)) == [], "nor the main branch"
    assert len(claim(farm, me, 8)) == 1


def test_a_retried_job_of_a_fair_queue_takes_a_turn_from_now(farm):
    store = farm._store
    me = machine(farm)
    farm.set_queue("t", fair=True)
    [old] = store.jobs.enqueue(spec("a"))
    [job] = claim(farm, me, 1)
    store.runs.finish_many(me, [Ending(job, Outcome.FAILED, "boom")])
    store.jobs.enqueue(spec("b"), count=3)
    store.jobs.retry(old)
    assert Counter(keys_of(farm, claim(farm, me, 2))) == {"a": 1, "b": 1}, "behind b's first, not behind all of b's"


def test_bad_fairness_input_is_refused_in_one_line(farm, capsys):
    for options, word in (
        (dict(fair_weight=0), "fair_weight"),
        (dict(fair_weight=float("inf")), "fair_weight"),
        (dict(cost=0), "cost"),
        (dict(cost=1.5), "cost"),
        (dict(fair_key=""), "fair_key"),
        (dict(fair_key="x" * 201), "fair_key"),
    ):
        with pytest.raises(BadJobInput, match=word):
            work_spec("python", NOOP, **options)
    machine(farm)
    for settings in (dict(key_limit=0), dict(fair="yes"), dict(key_rate="fast")):
        with pytest.raises(BadQueueInput):
            farm.set_queue("t", **settings)
    assert farm.queue("t").key_limit is None and not farm.queue("t").fair
    assert run_cli("--db", farm.url, "enqueue", "python", NOOP, "--queue", "t", "--cost", "0") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cost must be a whole number from 1 to 1000 (got 0)" in err[0]
    assert run_cli("--db", farm.url, "queue", "set", "t", "--fair", "--key-limit", "3") == 0
    assert "fair share by key, limit per key 3" in capsys.readouterr().out
    assert farm.queue("t").fair and farm.queue("t").key_limit == 3


def test_the_keyed_claim_compiles_for_sql_server():
    shape = ClaimShape("mssql", True, False, 4, branches=(True,), keyed=(True,))
    sql = str(claim_statement(shape).compile(dialect=pyodbc.dialect()))
    assert "sum(coalesce(" in sql.lower() and "OVER (PARTITION BY" in sql and "key_limit" in sql


@pytest.mark.postgres
def test_a_job_enqueued_in_sql_takes_its_turn_in_a_fair_queue(pg_url):
    from sqlalchemy import text

    from queueprocessor.farm import Farm

    with Farm(pg_url) as farm:
        me = machine(farm)
        farm.set_queue("t", fair=True)
        farm._store.jobs.enqueue(spec("flood"), count=10)
        farm.set_queue("t", fair_from="payload.tenant")
        with farm._engine.begin() as conn:
            [sql_job] = conn.execute(text(f"SELECT qp_enqueue('python', '{NOOP}', NULL, 't')")).scalars()
            [tenant_job] = conn.execute(
                text(f"SELECT qp_enqueue('python', '{NOOP}', CAST(:p AS jsonb), 't')"), dict(p='{"tenant": "c"}')
            ).scalars()
        assert farm._store.jobs.get(tenant_job)["fair_key"] == "c", "its key from its payload"
        taken = {job.id for job in claim(farm, me, 3)}
        assert {sql_job, tenant_job} <= taken, "each next in line, as a key of its own"
