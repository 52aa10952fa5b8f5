"""The target's half of fencing (queueprocessor/fencing.py), its pure logic: what a store admits, what the
middleware answers to each pair of headers, that it never calls the app for a refused request, and that a web app
importing it loads nothing of the node. The SQL guard on real databases and the middleware behind real servers:
tests/acceptance/test_target_fencing.py."""

import asyncio
import json
import subprocess
import sys

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.dialects.mssql import pyodbc

from queueprocessor.fencing import _MSSQL_ADMIT, DDL, AsgiFenceGuard, FenceGuard, MemoryFences, admit, fences, verdict


def test_a_store_admits_the_newest_fence_and_an_equal_one_and_refuses_an_older_one_per_job():
    store = MemoryFences()
    assert [store.admit(7, fence) for fence in (1, 2, 2, 1, 3)] == [True, True, True, False, True]
    assert store.admit(8, 1), "another job's fences are its own"
    assert (store.seen(7), store.seen(8), store.seen(9)) == (3, 1, None)


def test_a_store_forgets_the_jobs_admitted_longest_ago_beyond_its_keep():
    store = MemoryFences(keep=2)
    store.admit(1, 5)
    store.admit(2, 5)
    store.admit(1, 6)  # job 1 is now the most recent
    store.admit(3, 5)
    assert (store.seen(1), store.seen(2), store.seen(3)) == (6, None, 5)


@pytest.mark.parametrize(
    ("job", "fence", "answer"),
    [
        (None, None, None),
        ("7", "2", None),
        (" 7 ", "2", None),
        ("7", "1", (409, "stale fence 1 for job 7: fence 2 already seen")),
        ("7", None, (400, "X-QP-Job without X-QP-Fence: a fenced request sends both")),
        (None, "2", (400, "X-QP-Fence without X-QP-Job: a fenced request sends both")),
        ("7", "two", (400, "X-QP-Fence must be a whole number from 0 to 9223372036854775807, not 'two'")),
        ("-7", "2", (400, "X-QP-Job must be a whole number from 0 to 9223372036854775807, not '-7'")),
        ("7", "1,2", (400, "X-QP-Fence must be a whole number from 0 to 9223372036854775807, not '1,2'")),
        ("7", str(2**63), (400, f"X-QP-Fence must be a whole number from 0 to {2**63 - 1}, not '{2**63}'")),
        ("7", "", (400, "X-QP-Fence must be a whole number from 0 to 9223372036854775807, not ''")),
    ],
)
def test_each_pair_of_headers_gets_its_answer(job, fence, answer):
    store = MemoryFences()
    store.admit(7, 2)
    assert verdict(store, job, fence) == answer


def wsgi_call(app, headers):
    """Call a WSGI app as a server does; (status, headers, body)."""
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/write"} | {
        "HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()
    }
    started = []
    body = b"".join(app(environ, lambda status, response_headers: started.append((status, response_headers))))
    [(status, response_headers)] = started
    return status, dict(response_headers), body


def recording_wsgi_app(calls):
    def app(environ, start_response):
        calls.append(environ.get("HTTP_X_QP_FENCE"))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"written\n"]

    return app


def test_the_wsgi_guard_answers_a_stale_fence_itself_and_lets_the_rest_through():
    calls = []
    guard = FenceGuard(recording_wsgi_app(calls))
    assert wsgi_call(guard, {})[0] == "200 OK"
    assert wsgi_call(guard, {"X-QP-Job": "7", "X-QP-Fence": "2"})[0] == "200 OK"
    status, headers, body = wsgi_call(guard, {"X-QP-Job": "7", "X-QP-Fence": "1"})
    assert (status, body) == ("409 Conflict", b"stale fence 1 for job 7: fence 2 already seen\n")
    assert headers == {"Content-Type": "text/plain; charset=utf-8", "Content-Length": str(len(body))}
    status, _headers, body = wsgi_call(guard, {"X-QP-Fence": "3"})
    assert (status, body) == ("400 Bad Request", b"X-QP-Fence without X-QP-Job: a fenced request sends both\n")
    assert calls == [None, "2"], "the app was called for a refused request"


def asgi_call(app, headers):
    """Call an ASGI app as a server does; (status, body)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/write",
        "headers": [(name.lower().encode(), value.encode()) for name, value in headers],
    }
    asyncio.run(app(scope, receive, send))
    start, *bodies = sent
    return start["status"], b"".join(message.get("body", b"") for message in bodies)


def recording_asgi_app(calls):
    async def app(scope, receive, send):
        calls.append(dict(scope["headers"]).get(b"x-qp-fence"))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"written\n"})

    return app


def test_the_asgi_guard_answers_as_the_wsgi_guard_does():
    calls = []
    guard = AsgiFenceGuard(recording_asgi_app(calls))
    assert asgi_call(guard, [("Content-Type", "application/json")]) == (200, b"written\n")
    assert asgi_call(guard, [("X-QP-Job", "7"), ("X-QP-Fence", "2")]) == (200, b"written\n")
    assert asgi_call(guard, [("X-QP-Job", "7"), ("X-QP-Fence", "1")]) == (
        409,
        b"stale fence 1 for job 7: fence 2 already seen\n",
    )
    assert asgi_call(guard, [("X-QP-Job", "7"), ("X-QP-Fence", "1"), ("X-QP-Fence", "3")]) == (
        400,
        b"X-QP-Fence must be a whole number from 0 to 9223372036854775807, not '1,3'\n",
    )
    assert calls == [None, b"2"], "the app was called for a refused request"


def test_the_asgi_guard_leaves_other_kinds_of_scope_to_the_app():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    asyncio.run(AsgiFenceGuard(app)({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]


def test_the_sql_server_guard_is_one_merge_under_a_range_lock_with_two_parameters():
    compiled = _MSSQL_ADMIT.compile(dialect=pyodbc.dialect())
    sql = str(compiled)
    assert sql.startswith("MERGE qp_fences WITH (HOLDLOCK)") and sql.endswith(";")
    assert "WHEN MATCHED AND seen.fence <= sent.fence THEN UPDATE" in sql
    assert sorted(compiled.params) == ["fence", "job_id"]


def test_a_web_app_that_imports_the_guard_loads_nothing_of_the_node():
    probe = "import json, sys, queueprocessor.fencing; print(json.dumps(sorted(sys.modules)))"
    modules = set(json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, check=True).stdout))
    ours = {m for m in modules if m.startswith("queueprocessor")}
    assert ours == {"queueprocessor", "queueprocessor.fencing", "queueprocessor.version"}
    assert not {"aiohttp", "psycopg", "pyodbc", "croniter", "prometheus_client"} & modules


def test_the_documented_ddl_makes_the_table_the_guard_writes():
    engine = create_engine("sqlite://")
    with engine.begin() as conn:
        conn.execute(text(DDL))
        assert [admit(conn, 7, fence) for fence in (2, 1)] == [True, False]
        columns = {c["name"]: (str(c["type"]), c["nullable"]) for c in inspect(conn).get_columns("qp_fences")}
        assert columns == {c.name: (str(c.type), c.nullable) for c in fences.columns}
        assert inspect(conn).get_pk_constraint("qp_fences")["constrained_columns"] == ["job_id"]
