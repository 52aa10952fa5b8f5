"""The target's half of fencing with real parts: the SQL guard on SQLite and PostgreSQL, in concurrent transactions;
the WSGI guard behind a real server and the ASGI one called as a server calls it; and a frozen node's late request,
from a real node process, refused by a real target after another node took its job over (docs/fencing.md)."""

import asyncio
import json
import signal
import threading
import urllib.error
import urllib.request
import uuid

import pytest
from sqlalchemy import create_engine, event, text

from queueprocessor.farm import Farm
from queueprocessor.fencing import AsgiFenceGuard, FenceGuard, SqlFences, admit, seen
from tests.support.logtarget import Answers, Gate, WsgiServer, append, create_tables, records_app, rows
from tests.support.work import NodeProcesses, wait_for

RECORD = {"request": "req-7f3a", "seq": 1, "message": "GET /orders 200"}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def target(request, tmp_path):
    """The target's own database, with its tables: an engine as a web app makes it."""
    url = f"sqlite:///{tmp_path / 'target.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    engine = create_engine(url)
    create_tables(engine)
    yield engine
    engine.dispose()


def test_the_guard_records_the_newest_fence_and_refuses_an_older_one(target):
    with target.begin() as conn:
        assert [admit(conn, 7, fence) for fence in (1, 2, 2, 1, 3)] == [True, True, True, False, True]
        assert admit(conn, 8, 1)
    with target.connect() as conn:
        assert (seen(conn, 7), seen(conn, 8), seen(conn, 9)) == (3, 1, None)


def test_a_fence_whose_write_rolls_back_is_not_recorded(target):
    with target.connect() as conn:
        with conn.begin() as transaction:
            assert append(conn, 7, 2, RECORD)
            transaction.rollback()  # the write failed: its fence must not refuse the run that retries it
        assert seen(conn, 7) is None
    with target.begin() as conn:
        assert append(conn, 7, 1, RECORD)
    assert rows(target) == [("req-7f3a", 1, 7, 1)]


def concurrently(engine, first_fence: int, second_fence: int) -> bool:
    """Two writes of job 7: the first's transaction admits and writes, the second's starts while it is open (on
    PostgreSQL, until it waits for the first's row lock), then the first commits. Whether the second was admitted."""
    admitted = []
    sent = threading.Event()
    with engine.connect() as first, engine.connect() as second:
        event.listen(second, "before_cursor_execute", lambda *args: sent.set())

        def write_second():
            with second.begin():
                admitted.append(append(second, 7, second_fence, RECORD))

        with first.begin():
            assert append(first, 7, first_fence, RECORD)
            thread = threading.Thread(target=write_second, name="second-writer")
            thread.start()
            wait_for(sent.is_set)
            if engine.dialect.name == "postgresql":
                with engine.connect() as look:
                    waiting = text(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    )
                    wait_for(lambda: look.execute(waiting).scalar())
        thread.join(30)
    return admitted == [True]


def test_an_older_fence_waits_for_a_newer_ones_transaction_and_is_then_refused(target):
    assert not concurrently(target, first_fence=2, second_fence=1)
    assert rows(target) == [("req-7f3a", 1, 7, 2)]


def test_a_newer_fence_waits_for_an_older_ones_transaction_and_both_are_admitted(target):
    assert concurrently(target, first_fence=1, second_fence=2)
    assert rows(target) == [("req-7f3a", 1, 7, 1), ("req-7f3a", 1, 7, 2)]


def test_the_plain_pattern_for_a_row_one_job_owns(target):
    """docs/fencing.md's guarded UPDATE, for a table the target already has: its row count says whether it wrote."""
    guarded = text("UPDATE reports SET body = :body, fence = :fence WHERE day = :day AND fence <= :fence")
    with target.begin() as conn:
        conn.execute(text("CREATE TABLE reports (day TEXT PRIMARY KEY, body TEXT, fence BIGINT NOT NULL)"))
        conn.execute(text("INSERT INTO reports VALUES ('2026-11-22', NULL, 0)"))
        written = [
            conn.execute(guarded, {"body": body, "fence": fence, "day": "2026-11-22"}).rowcount
            for body, fence in (("first", 1), ("taken over", 2), ("late", 1))
        ]
        assert written == [1, 1, 0]
        assert conn.execute(text("SELECT body, fence FROM reports")).one() == ("taken over", 2)


def post(base_url: str, headers: dict[str, str], body: dict = RECORD) -> tuple[int, str]:
    request = urllib.request.Request(base_url + "records", data=json.dumps(body).encode(), method="POST")
    for name, value in headers.items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_wsgi_guard_of_one_process_refuses_a_stale_fence_before_the_app_sees_it(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'target.db'}")
    create_tables(engine)
    try:
        with WsgiServer(FenceGuard(records_app(engine))) as server:
            fenced = {"X-QP-Job": "7", "X-QP-Fence": "2"}
            assert post(server.base_url, fenced) == (200, "appended\n")
            assert post(server.base_url, fenced | {"X-QP-Fence": "1"}) == (
                409,
                "stale fence 1 for job 7: fence 2 already seen\n",
            )
            assert post(server.base_url, {"X-QP-Job": "7", "X-QP-Fence": "soon"}) == (
                400,
                "X-QP-Fence must be a whole number from 0 to 9223372036854775807, not 'soon'\n",
            )
        assert rows(engine) == [("req-7f3a", 1, 7, 2)]
    finally:
        engine.dispose()


def test_the_wsgi_guards_of_many_processes_share_the_fences_in_the_database(target):
    """Two servers, as two processes of one service behind a balancer: the newer fence reaches one, the older the
    other, which refuses it from what the first recorded."""
    with WsgiServer(FenceGuard(records_app(target), SqlFences(target))) as one:
        with WsgiServer(FenceGuard(records_app(target), SqlFences(target))) as other:
            assert post(one.base_url, {"X-QP-Job": "7", "X-QP-Fence": "2"}) == (200, "appended\n")
            assert post(other.base_url, {"X-QP-Job": "7", "X-QP-Fence": "1"}) == (
                409,
                "stale fence 1 for job 7: fence 2 already seen\n",
            )
    assert rows(target) == [("req-7f3a", 1, 7, 2)]


def test_the_asgi_guard_asks_a_database_store_off_its_event_loop(target):
    called = []

    async def app(scope, receive, send):
        called.append(dict(scope["headers"])[b"x-qp-fence"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    guard = AsgiFenceGuard(app, SqlFences(target))

    async def call(fence: str) -> tuple[int, bytes, bool]:
        """One request as an ASGI server makes it; its status, body, and whether the loop stayed free meanwhile."""
        sent = []
        ticks = 0

        async def ticking():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)

        ticker = asyncio.create_task(ticking())
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/",
            "headers": [(b"x-qp-job", b"7"), (b"x-qp-fence", fence.encode())],
        }
        await guard(scope, receive, send)
        ticker.cancel()
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]), ticks > 1

    assert asyncio.run(call("2")) == (204, b"", True)
    assert asyncio.run(call("1")) == (409, b"stale fence 1 for job 7: fence 2 already seen\n", True)
    assert called == [b"2"]


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize(
    "where",
    [
        pytest.param("network", id="held-in-the-network-refused-by-the-middleware"),
        pytest.param("request", id="long-request-refused-by-the-guard-in-its-write"),
    ],
)
def test_a_frozen_nodes_late_request_is_refused_by_the_target(pg_server, pg_url, tmp_path, where):
    """Node a claims an HTTP job (fence 1) and sends its request, which the target holds (a Gate): held before the
    middleware it is a request the network delivers late (a partitioned or frozen node's); held after it, a long
    request that was admitted when it started and writes late. Node a is frozen (SIGSTOP); node b takes the job
    over (fence 2) and its request is written. Then a is continued and its request goes on: the target answers
    409 and writes nothing for fence 1. Without the guard it would append the record a second time, after fence
    2's (the Gate makes that order certain, not a race)."""
    target = create_engine(pg_server.create_database(f"target_{uuid.uuid4().hex[:12]}"))
    create_tables(target)
    service = records_app(target)
    if where == "network":
        gate = Gate(FenceGuard(service, SqlFences(target)))
        answers = Answers(gate)
    else:
        gate = Gate(service)
        answers = Answers(FenceGuard(gate, SqlFences(target)))
    nodes = NodeProcesses(pg_url, tmp_path)
    frozen = None
    try:
        with WsgiServer(answers) as server, Farm(pg_url) as farm:
            frozen = nodes("a", "--http-base", server.base_url, capacity=1)
            wait_for(lambda: [m["status"] for m in farm.status()["machines"]] == ["active"], 30)
            [job_id] = farm.enqueue_http("/records", method="POST", payload=json.dumps(RECORD))
            assert gate.arrived.wait(30)
            assert gate.held == {"job": str(job_id), "fence": "1"}
            frozen.send_signal(signal.SIGSTOP)
            nodes("b", "--http-base", server.base_url, capacity=1)
            wait_for(lambda: farm.job(job_id)["state"] == "succeeded", 30)
            assert rows(target) == [("req-7f3a", 1, job_id, 2)]
            frozen.send_signal(signal.SIGCONT)
            frozen = None
            gate.release()
            wait_for(lambda: len(answers.given) == 2, 30)
    finally:
        gate.release()
        if frozen is not None:
            frozen.send_signal(signal.SIGCONT)
        nodes.kill_all()
    refusal = (
        b"stale fence 1 for job %d: fence 2 already seen\n" % job_id
        if where == "network"
        else b"a newer run of this job wrote\n"
    )
    assert answers.given == [(2, 200, b"appended\n"), (1, 409, refusal)]
    assert rows(target) == [("req-7f3a", 1, job_id, 2)]
    target.dispose()
