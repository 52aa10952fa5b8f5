"""Tests for the test-support servers, against real parts: the suite's fault and
benchmark tests are only as trustworthy as these."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
import sqlalchemy as sa

from tests.support.httptarget import HttpTarget
from tests.support.pgserver import PostgresServer
from tests.support.tcpproxy import TcpProxy


@pytest.fixture(scope="module")
def pg():
    with PostgresServer() as server:
        yield server


def _scalar(url: str, query: str = "select 1", **engine_args):
    engine = sa.create_engine(url, **engine_args)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(query)).scalar()
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_pg_server_accepts_queries(pg):
    assert pg.url == f"postgresql+psycopg://postgres:{pg.password}@127.0.0.1:{pg.port}/postgres"
    assert _scalar(pg.url) == 1
    assert _scalar(pg.url, "show fsync") == "off"
    assert (pg.data_dir / "PG_VERSION").exists()


@pytest.mark.postgres
def test_pg_wrong_password_is_refused(pg):
    bad = pg.url.replace(pg.password, pg.password + "x")
    with pytest.raises(sa.exc.OperationalError, match="password authentication failed"):
        _scalar(bad)


@pytest.mark.postgres
def test_pg_create_database(pg):
    url = pg.create_database("fresh_one")
    assert url.endswith("/fresh_one")
    assert _scalar(url, "select current_database()") == "fresh_one"


@pytest.mark.postgres
def test_pg_restart_keeps_port_and_data(pg):
    url = pg.create_database("survives_restart")
    old_pid, old_port = pg.pid, pg.port
    os.kill(old_pid, signal.SIGSTOP)  # restart must cope with a frozen postmaster
    pg.restart()
    assert pg.pid != old_pid and pg.port == old_port
    assert _scalar(url, "select current_database()") == "survives_restart"


@pytest.mark.postgres
def test_pg_through_delayed_proxy_then_cut(pg):
    with TcpProxy("127.0.0.1", pg.port) as proxy:
        url = pg.url.replace(f":{pg.port}/", f":{proxy.port}/")
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                assert conn.execute(sa.text("select 1")).scalar() == 1
                proxy.up_delay = proxy.down_delay = 0.05
                started = time.perf_counter()
                conn.execute(sa.text("select 2"))
                assert time.perf_counter() - started >= 0.1
                proxy.cut()
                with pytest.raises(sa.exc.OperationalError):
                    conn.execute(sa.text("select 3"))
        finally:
            engine.dispose()


@pytest.fixture
def echo_port():
    """A tiny TCP echo server (one thread per connection)."""
    listener = socket.create_server(("127.0.0.1", 0))
    threads = []

    def echo(conn):
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def accept():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=echo, args=(conn,), daemon=True)
            thread.start()
            threads.append(thread)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    yield listener.getsockname()[1]
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    acceptor.join(5)


def _round_trip(sock: socket.socket, payload: bytes) -> float:
    started = time.perf_counter()
    sock.sendall(payload)
    received = b""
    while len(received) < len(payload):
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        received += chunk
    assert received == payload
    return time.perf_counter() - started


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(2)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_proxy_forwards_and_delays(echo_port):
    with TcpProxy("127.0.0.1", echo_port, up_delay=0.1, down_delay=0.1) as proxy:
        assert proxy.port
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            assert _round_trip(sock, b"hello") >= 0.2
            big = os.urandom(4_000_000)
            assert _round_trip(sock, big) < 2  # latency, not a throughput cap
            proxy.up_delay = proxy.down_delay = 0.0
            assert _round_trip(sock, b"fast") < 0.2
    assert not [t for t in threading.enumerate() if t.name.startswith("TcpProxy")]


def test_proxy_cut_and_restore(echo_port):
    with TcpProxy("127.0.0.1", echo_port) as proxy:
        sock = socket.create_connection(("127.0.0.1", proxy.port))
        _round_trip(sock, b"before")
        proxy.cut()
        assert _closed(sock)
        with socket.create_connection(("127.0.0.1", proxy.port)) as refused:
            assert _closed(refused)
        proxy.restore()
        with socket.create_connection(("127.0.0.1", proxy.port)) as again:
            _round_trip(again, b"after")
        sock.close()


def test_proxy_freeze_holds_bytes_until_restore(echo_port):
    with TcpProxy("127.0.0.1", echo_port) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            proxy.freeze()
            sock.sendall(b"held")
            sock.settimeout(0.3)
            with pytest.raises(TimeoutError):
                sock.recv(4)
            proxy.restore()
            sock.settimeout(2)
            assert sock.recv(4) == b"held"


def _call(url: str, data: bytes | None = None, headers: dict | None = None) -> int:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_http_target_routes_and_records_headers():
    with HttpTarget() as target:
        base = target.base_url
        headers = {"X-QP-Job": "7", "X-QP-Attempt": "2", "X-QP-Fence": "41", "X-QP-Machine": "node-a"}
        assert _call(base + "ok", headers=headers) == 200
        assert _call(base + "fail") == 500
        assert _call(base + "status/418") == 418
        assert _call(base + "nowhere") == 404
        assert _call(base + "sleep/0.05") == 200
        ok = target.requests("/ok")[0]
        assert (ok["job"], ok["attempt"], ok["fence"], ok["machine"]) == (7, 2, 41, "node-a")
        assert (ok["method"], ok["status"]) == ("GET", 200)
        assert ok["started"] <= ok["ended"]
        assert target.requests("/fail")[0]["job"] is None
        sleep = target.requests("/sleep")[0]
        assert sleep["ended"] - sleep["started"] >= 0.05
        assert len(target.requests()) == 5


def test_http_target_rejects_stale_fence():
    with HttpTarget() as target:

        def write(fence):
            headers = {"X-QP-Job": "9", "X-QP-Fence": str(fence)}
            return _call(target.base_url + "write/report", data=b"row", headers=headers)

        assert [write(3), write(5), write(4), write(5)] == [200, 200, 409, 200]
        assert [r["accepted"] for r in target.requests("/write")] == [True, True, False, True]
        assert target.requests("/write")[0]["body"] == "row"
        assert _call(target.base_url + "write/report", data=b"row") == 409  # no fence at all


def test_http_target_finds_overlapping_runs_of_a_job():
    with HttpTarget() as target:

        def run(job, seconds):
            _call(f"{target.base_url}sleep/{seconds}", headers={"X-QP-Job": str(job)})

        callers = [threading.Thread(target=run, args=args) for args in [(1, 0.2), (1, 0.2), (2, 0.2)]]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        run(2, 0)
        overlaps = target.concurrent_overlaps()
        assert len(overlaps) == 1
        assert {a["job"] for pair in overlaps for a in pair} == {1}


def test_http_target_stop_cuts_sleeps_short():
    target = HttpTarget()
    caller = threading.Thread(target=_call, args=(target.base_url + "sleep/30",))
    caller.start()
    while not target.requests():
        time.sleep(0.01)
    started = time.perf_counter()
    target.stop()
    caller.join(5)
    assert time.perf_counter() - started < 2
    assert target.requests()[0]["status"] == 503


def test_http_target_notices_caller_hanging_up():
    with HttpTarget() as target:
        with socket.create_connection(("127.0.0.1", target.port)) as sock:
            sock.sendall(b"GET /sleep/30 HTTP/1.0\r\nX-QP-Job: 5\r\n\r\n")
            while not target.requests():
                time.sleep(0.01)
        deadline = time.monotonic() + 2
        while target.requests()[0]["status"] is None and time.monotonic() < deadline:
            time.sleep(0.01)
        record = target.requests()[0]
        assert record["status"] == 499
        assert record["ended"] - record["started"] < 1
