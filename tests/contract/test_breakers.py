"""Breakers and adaptive rates on each backend (SQLite, PostgreSQL, PgBouncer): counted on the queue's row, an open
breaker stops the queue's claims but for a canary after the cool-down, a passed canary ramps the rate back, two
writers that open it at once open it once, an operator resets it. Database time is never waited for: a test that
needs the cool-down over moves the row's breaker_at back."""

import threading

import pytest
from sqlalchemy import update

from queueprocessor.farm import Farm
from queueprocessor.rules.breaker import CLOSED, HALF_OPEN, OPEN, RAMP, Seen
from queueprocessor.rules.errors import BadQueueInput
from queueprocessor.rules.job import JobSpec
from queueprocessor.store.schema import queues
from queueprocessor.store.types import ClaimRequest, Plan
from tests.conftest import BACKENDS, PGBOUNCER, backend_url
from tests.support.work import PYJOBS, run_cli

NOOP = f"{PYJOBS}:noop"
LOCKED = Plan(alone=(("api", 8, True),))  # a node that knows api as guarded (its breaker makes it so)


@pytest.fixture(params=[*BACKENDS, PGBOUNCER])
def farm(request, tmp_path):
    the_farm = Farm(backend_url(request, tmp_path))
    yield the_farm
    the_farm._store.give_back()
    leaked = the_farm._engine.pool.checkedout()
    the_farm.close()
    assert leaked == 0, f"{leaked} database connections were not returned to the pool"


def machine(farm, name="m") -> int:
    return farm._store.machines.register(name=name, host="h", instance=f"{name}-i", pid=1, version="t", capacity=8)


def claim(farm, me, plan=LOCKED):
    return farm._store.jobs.claim(ClaimRequest(me, 8, 30.0, plan=plan))


def note(farm, **seen):
    farm._store.breakers.note({"api": Seen(**seen)}, 1.0)


def cool_down_over(farm):
    farm._store.count(update(queues).where(queues.c.name == "api").values(breaker_at=queues.c.breaker_at - 1000))


def kinds(farm):
    return [e["kind"] for e in farm.events(kind="queue") if e["kind"].startswith("queue.breaker_")]


def test_n_failures_within_the_window_open_it_and_its_claims_stop(farm):
    farm._store.jobs.enqueue(JobSpec("python", NOOP, queue="api"), count=4)
    farm.set_queue("api", breaker="3/60s", cool_down="30s")
    me = machine(farm)
    assert farm.queue("api").breaker_state == CLOSED and farm.queue("api").breaker == "3/60s"
    assert len(claim(farm, me)) == 4, "closed: the queue's jobs start, under its row's lock"
    farm._store.jobs.enqueue(JobSpec("python", NOOP, queue="api"), count=4)
    note(farm, failed=2, succeeded=5)
    assert farm.queue("api").failures == 2 and farm.queue("api").breaker_state == CLOSED
    note(farm, throttled=1)
    info = farm.queue("api")
    assert info.breaker_state == OPEN and info.failures == 0
    assert claim(farm, me) == [] and claim(farm, me, Plan()) == [], "open: no claim takes its jobs"
    assert kinds(farm) == ["queue.breaker_opened"]
    assert "3 failures within 60 s" in farm.events(kind="queue.breaker_opened")[0]["detail"]


def test_after_the_cool_down_one_canary_at_a_time_and_a_failed_one_reopens_it(farm):
    farm._store.jobs.enqueue(JobSpec("python", NOOP, queue="api"), count=5)
    farm.set_queue("api", breaker="1/60s")
    me = machine(farm)
    note(farm, failed=1)
    assert claim(farm, me) == []
    cool_down_over(farm)
    assert len(claim(farm, me)) == 1, "the cool-down is over: one canary"
    assert farm.queue("api").breaker_state == HALF_OPEN
    assert claim(farm, me) == [], "the next canary waits a cool-down"
    note(farm, failed=1)
    assert farm.queue("api").breaker_state == OPEN and kinds(farm) == ["queue.breaker_opened"] * 2
    assert claim(farm, me) == []


def test_a_passed_canary_ramps_the_rate_back_and_the_ramp_closes_it(farm):
    farm._store.jobs.enqueue(JobSpec("python", NOOP, queue="api"), count=3)
    farm.set_queue("api", breaker="1/60s", rate="8/s")
    me = machine(farm)
    note(farm, failed=1)
    cool_down_over(farm)
    assert len(claim(farm, me)) == 1
    note(farm, succeeded=1)
    info = farm.queue("api")
    assert info.breaker_state == RAMP and info.current_rate == 1.0 and str(info.rate) == "8/s"
    rates = []
    while farm.queue("api").breaker_state == RAMP:
        cool_down_over(farm)  # the step's time has come
        note(farm, succeeded=1)
        rates.append(farm.queue("api").current_rate)
    assert rates == [2.0, 4.0, 8.0] and farm.queue("api").breaker_state == CLOSED
    assert kinds(farm) == ["queue.breaker_opened", "queue.breaker_ramp", "queue.breaker_closed"]
    assert len(farm.events(kind="queue.rate_adapted")) == 2
    assert claim(farm, me), "closed: its jobs start again, within the bucket"


def test_two_writers_opening_it_at_once_open_it_once(farm):
    farm._store.jobs.enqueue(JobSpec("python", NOOP, queue="api"))
    farm.set_queue("api", breaker="3/60s")
    start = threading.Barrier(2)

    def writer():
        start.wait()
        note(farm, failed=3)

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert farm.queue("api").breaker_state == OPEN and kinds(farm) == ["queue.breaker_opened"]


def test_an_operator_resets_it_and_its_jobs_start_at_the_configured_rate(farm):
    farm._store.jobs.enqueue(JobSpec("python", NOOP, queue="api"), count=2)
    farm.set_queue("api", breaker="1/60s", rate="10/s", adaptive="1/s")
    me = machine(farm)
    note(farm, throttled=1)
    assert farm.queue("api").breaker_state == OPEN and claim(farm, me) == []
    farm.reset_breaker("api")
    info = farm.queue("api")
    assert info.breaker_state == CLOSED and info.current_rate == 10.0 and len(claim(farm, me)) == 2
    assert kinds(farm)[-1] == "queue.breaker_closed"
    farm._store.jobs.enqueue(JobSpec("python", NOOP, queue="other"))
    farm.set_queue("other", limit=1)
    with pytest.raises(BadQueueInput, match="nothing to reset"):
        farm.reset_breaker("other")


def test_throttled_endings_cut_the_current_rate_and_keep_the_configured_one(farm):
    farm._store.jobs.enqueue(JobSpec("python", NOOP, queue="api"))
    farm._store.jobs.enqueue(JobSpec("python", NOOP, queue="plain"))
    farm.set_queue("api", rate="10/s", adaptive="2/s")
    note(farm, throttled=2)
    info = farm.queue("api")
    assert str(info.rate) == "10/s" and info.current_rate == 5.0 and info.adaptive_floor == 2.0
    [event] = farm.events(kind="queue.rate_adapted")
    assert event["detail"] == "2 throttled: rate 10/s -> 5/s"
    farm.set_queue("api", rate="20/s")
    assert farm.queue("api").current_rate == 20.0, "a new configured rate is the current one"
    with pytest.raises(BadQueueInput, match="no rate above its floor"):
        farm.set_queue("api", rate=None)
    with pytest.raises(BadQueueInput, match="needs a rate"):
        farm.set_queue("plain", limit=2, adaptive="1/s")
    with pytest.raises(BadQueueInput, match="is not a breaker"):
        farm.set_queue("api", breaker="often")
    farm.set_queue("api", adaptive=None, breaker=None)
    assert farm.queue("api").adaptive_floor is None and farm.queue("api").breaker is None


def test_the_cli_sets_shows_and_resets_a_breaker_and_refuses_bad_input_in_one_line(farm, capsys):
    url = farm.url
    farm._store.jobs.enqueue(JobSpec("python", NOOP, queue="api"))
    assert run_cli("--db", url, "queue", "set", "api", "--rate", "10/s", "--breaker", "3/60s", "--adaptive", "1/s") == 0
    assert "breaker 3/60s closed (0 failures), adaptive floor 1/s" in capsys.readouterr().out
    note(farm, throttled=2)  # the rate halved
    note(farm, failed=1)  # the third failure within the window opens it
    assert run_cli("--db", url, "queue", "list") == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("api ")]
    assert "10/s" in row and "5/s (adapted)" in row and "3/60s open (0 failures)" in row
    assert run_cli("--db", url, "queue", "reset-breaker", "api") == 0
    assert capsys.readouterr().out == "queue api: breaker 3/60s closed (0 failures), rate 10/s\n"
    for bad, words in (
        (("--breaker", "often"), "'often' is not a breaker: use N/TIME"),
        (("--cool-down", "soon"), "--cool-down must be a time from 1s to 1d"),
        (("--adaptive", "20/s"), "a floor below the queue's rate, 10/s"),
        (("--breaker", "3/60s", "--no-breaker"), "give --breaker or --no-breaker, not both"),
    ):
        assert run_cli("--db", url, "queue", "set", "api", *bad) != 0
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err
