"""Push on PostgreSQL: an enqueue wakes an idle farm at once; polling remains the fallback."""

import time

import pytest
from sqlalchemy import text

from queueprocessor.rules.roster import slot_of
from tests.support import pyjobs
from tests.support.work import Nodes, wait_for

pytestmark = pytest.mark.postgres
PERIOD = 2.0  # long turns, so starting within the enqueue's own slot can only be push's doing


@pytest.fixture
def farm(pg_url):
    from queueprocessor.farm import Farm

    with Farm(pg_url) as the_farm:
        yield the_farm


@pytest.fixture
def nodes(farm):
    started = Nodes(farm, period=PERIOD, heartbeat=0.5)
    yield started
    started.stop_all()


def early_in_a_slot(farm):
    """Wait until database time is just past a slot's start (its turn has been taken)."""
    wait_for(lambda: 0.3 < farm._store.ask_time() % PERIOD < 0.5, timeout=5, interval=0.01)


def started_slots(farm, job_id):
    job = wait_for(lambda: (j := farm.job(job_id))["state"] == "succeeded" and j)
    return slot_of(job["created_at"], PERIOD), slot_of(job["runs"][0]["started_at"], PERIOD)


def test_an_enqueue_starts_on_an_idle_farm_without_waiting_for_a_turn(farm, nodes):
    a, b = nodes("a"), nodes("b")
    wait_for(lambda: a.listener.listening.is_set() and b.listener.listening.is_set())
    time.sleep(2 * PERIOD)  # both are in the roster
    for _ in range(3):
        early_in_a_slot(farm)
        enqueued, started = started_slots(farm, farm.enqueue_python(pyjobs.noop)[0])
        assert started == enqueued


def test_without_push_the_work_waits_for_the_next_turn(farm, nodes):
    nodes("a", push=False)
    time.sleep(PERIOD)
    early_in_a_slot(farm)
    enqueued, started = started_slots(farm, farm.enqueue_python(pyjobs.noop)[0])
    assert started == enqueued + 1


def test_a_plain_sql_insert_wakes_the_farm_too(farm, nodes):
    node = nodes("a")
    wait_for(node.listener.listening.is_set)
    time.sleep(PERIOD)
    early_in_a_slot(farm)
    with farm._engine.begin() as conn:
        job_id = conn.execute(
            text(
                "INSERT INTO qp_jobs (executor, target, method, state, priority, run_at, created_at, attempts, "
                "max_attempts, fence, cancel_requested, kind) VALUES ('python', :target, 'GET', 'queued', 0, "
                "extract(epoch from clock_timestamp()), extract(epoch from clock_timestamp()), 0, 1, 0, false, 'job') "
                "RETURNING id"
            ),
            {"target": f"{pyjobs.__name__}:noop"},
        ).scalar_one()
    enqueued, started = started_slots(farm, job_id)
    assert started == enqueued


def test_a_dropped_listening_connection_is_restored(farm, nodes):
    node = nodes("a")
    wait_for(node.listener.listening.is_set)
    with farm._engine.begin() as conn:
        killed = conn.execute(
            text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'")
        ).scalar()
    assert killed == 1
    wait_for(lambda: not node.listener.listening.is_set(), timeout=5, interval=0.01)
    wait_for(node.listener.listening.is_set, timeout=5)
    time.sleep(PERIOD)
    early_in_a_slot(farm)
    enqueued, started = started_slots(farm, farm.enqueue_python(pyjobs.noop)[0])
    assert started == enqueued


def test_through_a_pooler_push_listens_on_the_listen_db(pg_url, bouncer_url):
    """PgBouncer gives LISTEN no session: with --listen-db (the server's own URL) push works through it all the same."""
    from queueprocessor.farm import Farm

    with Farm(bouncer_url) as farm:
        nodes = Nodes(farm, period=PERIOD, heartbeat=0.5)
        try:
            wait_for(nodes("a", listen_db=pg_url).listener.listening.is_set)
            time.sleep(PERIOD)
            early_in_a_slot(farm)
            enqueued, started = started_slots(farm, farm.enqueue_python(pyjobs.noop)[0])
            assert started == enqueued
        finally:
            nodes.stop_all()


def test_through_a_pooler_without_a_listen_db_the_farm_polls_and_says_so_once(bouncer_url, caplog):
    from queueprocessor.farm import Farm

    with Farm(bouncer_url) as farm:
        nodes = Nodes(farm, period=PERIOD, heartbeat=0.5)
        try:
            node = nodes("a")
            wait_for(lambda: "push is off" in caplog.text)
            [line] = [r.getMessage() for r in caplog.records if "push is off" in r.getMessage()]
            assert "--listen-db" in line and ":***@" in line
            time.sleep(PERIOD)
            early_in_a_slot(farm)
            enqueued, started = started_slots(farm, farm.enqueue_python(pyjobs.noop)[0])
            assert started == enqueued + 1 and not node.listener.listening.is_set()
        finally:
            nodes.stop_all()


def test_a_listener_whose_relay_fails_says_so_and_listens_again(farm, caplog):
    """A failure that is not the database's (a bug in what a notice is handed to) used to end the listener thread
    silently: push was off for good, and nothing said so."""
    from queueprocessor.node.push import Listener

    heard: list[str] = []

    def relay(payload: str) -> None:
        if not heard:
            heard.append("failed")
            raise RuntimeError("a bug in the relay")
        heard.append(payload)

    listener = Listener(farm._engine.url, relay).start()
    try:
        wait_for(listener.listening.is_set)
        with caplog.at_level("ERROR", logger="queueprocessor.push"):
            with farm._engine.begin() as conn:
                conn.execute(text("SELECT pg_notify('qp_jobs', 'first')"))
            wait_for(lambda: heard == ["failed"] and not listener.listening.is_set())
        wait_for(listener.listening.is_set)
        with farm._engine.begin() as conn:
            conn.execute(text("SELECT pg_notify('qp_jobs', 'second')"))
        wait_for(lambda: heard == ["failed", "second"])
    finally:
        listener.stop()
    [said] = [r.getMessage() for r in caplog.records]
    assert "a bug in the relay" in said and "listens again" in said


LONG = 10.0  # a turn every 10 s: a chain that hands over by turns takes a slot a link


def chain_of(farm, links: int) -> list[int]:
    """A workflow of `links` no-op steps, each after the one before: their job ids, in order."""
    flow = farm.workflow("chain").step("0", farm.python_spec(pyjobs.noop))
    for n in range(1, links):
        flow.step(str(n), farm.python_spec(pyjobs.noop), after=[str(n - 1)])
    steps = farm.workflow_info(flow.enqueue())["steps"]
    return [step["job_id"] for step in steps]  # in the order they were enqueued


def slots_of_a_chain(farm, links: int) -> tuple[int, int, int]:
    """Enqueue a chain early in a slot of LONG: the slot it was enqueued in, and those its first and its last link
    started in."""
    wait_for(lambda: 0.3 < farm._store.ask_time() % LONG < 2.0, timeout=2 * LONG, interval=0.01)
    ids = chain_of(farm, links)
    wait_for(lambda: farm.job(ids[-1])["state"] == "succeeded", timeout=links * LONG)
    first, last = farm.job(ids[0]), farm.job(ids[-1])
    return tuple(
        slot_of(t, LONG) for t in (first["created_at"], first["runs"][0]["started_at"], last["runs"][0]["started_at"])
    )


@pytest.mark.parametrize("push", [True, False], ids=["push", "no-push"])
def test_a_released_child_starts_without_waiting_for_a_turn(farm, push):
    """Each link of a chain of 8 is released by its parent's finish: the node that finished it claims it at once
    (on every dialect), and with push the slot's holder hears of it too. By turns alone each link would wait for the
    next slot, 10 s away: the whole chain runs within the slot its first link started in (with push, the slot it
    was enqueued in; without, the next one, whose turn takes the first link)."""
    started = Nodes(farm, period=LONG, heartbeat=0.5)
    try:
        a, b = started("a", push=push), started("b", push=push)
        if push:
            wait_for(lambda: a.listener.listening.is_set() and b.listener.listening.is_set())
        time.sleep(2.0)  # both are in the roster
        enqueued, first, last = slots_of_a_chain(farm, 8)
        assert last == first == (enqueued if push else enqueued + 1)
    finally:
        started.stop_all()
