"""The worked example of docs/fencing.md as tests run it: the seed workload's target, a service that appends each
processed log record to its own table, guarded by queueprocessor.fencing, served by a real WSGI server.

`records_app(engine)` is the service: POST /records with a log record as its JSON body appends it to
`esb_processed` together with the job and fence that wrote it, after `admit()` in the same transaction (409 if a
newer run of the job came first). `WsgiServer` serves any WSGI app from a thread (wsgiref, one thread a request).
`Gate` holds the first request that reaches it until the test releases it: put before the guard it is a request
held in the network (it reaches the guard late); put after it, a long request (admitted at its start, writing
late). `Answers` records each request's fence and the status and body it was answered.
"""

from __future__ import annotations

import json
import sys
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, Text, insert, select

from queueprocessor.fencing import admit, create_table

metadata = MetaData()
processed = Table(
    "esb_processed",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("request_id", Text, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("message", Text),
    Column("job_id", BigInteger, nullable=False),
    Column("fence", BigInteger, nullable=False),
)


def create_tables(engine) -> None:
    """The target's own tables: its log of processed records and the fences it has seen."""
    metadata.create_all(engine)
    create_table(engine)


def append(conn, job_id: int, fence: int, record: dict) -> bool:
    """Append one processed log record, unless a newer run of its job came first (then False, nothing written)."""
    if not admit(conn, job_id, fence):
        return False
    conn.execute(
        insert(processed).values(
            request_id=record["request"], seq=record["seq"], message=record["message"], job_id=job_id, fence=fence
        )
    )
    return True


def records_app(engine):
    """The service: POST /records appends the record in its JSON body, its fence checked in the write's transaction."""

    def app(environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        record = json.loads(environ["wsgi.input"].read(length))
        job_id, fence = int(environ["HTTP_X_QP_JOB"]), int(environ["HTTP_X_QP_FENCE"])
        with engine.begin() as conn:
            written = append(conn, job_id, fence, record)
        status, body = ("200 OK", b"appended\n") if written else ("409 Conflict", b"a newer run of this job wrote\n")
        start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def rows(engine) -> list[tuple]:
    """What the service wrote: (request, seq, job, fence) in order."""
    with engine.connect() as conn:
        query = select(processed.c.request_id, processed.c.seq, processed.c.job_id, processed.c.fence)
        return [tuple(row) for row in conn.execute(query.order_by(processed.c.id))]


class Gate:
    """WSGI middleware that holds the first request through it until release(); `arrived` is set when it comes."""

    def __init__(self, app) -> None:
        self.app = app
        self.arrived = threading.Event()
        self._released = threading.Event()
        self._first = threading.Lock()
        self.held: dict | None = None

    def __call__(self, environ, start_response):
        if self._first.acquire(blocking=False):
            self.held = {"job": environ.get("HTTP_X_QP_JOB"), "fence": environ.get("HTTP_X_QP_FENCE")}
            self.arrived.set()
            self._released.wait()
        return self.app(environ, start_response)

    def release(self) -> None:
        self._released.set()


class Answers:
    """WSGI middleware recording (fence, status code, body) of each answer, in the order they were given."""

    def __init__(self, app) -> None:
        self.app = app
        self.given: list[tuple[int | None, int, bytes]] = []
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        answer = []

        def noting(status, headers, *exc_info):
            answer.append(status)
            return start_response(status, headers, *exc_info)

        body = b"".join(self.app(environ, noting))
        fence = environ.get("HTTP_X_QP_FENCE")
        with self._lock:
            self.given.append((None if fence is None else int(fence), int(answer[0].split()[0]), body))
        return [body]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a request still held when the test ends does not hold the process

    def handle_error(self, request, client_address):
        """A caller that hung up (a node stopped its call) is no error of the server's."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):
        """No line on stderr per request."""


class WsgiServer:
    """A real wsgiref server on 127.0.0.1 (random port) serving `app` from a thread, a thread per request."""

    def __init__(self, app) -> None:
        self._server = make_server("127.0.0.1", 0, app, server_class=_Server, handler_class=_QuietHandler)
        self.base_url = f"http://127.0.0.1:{self._server.server_port}/"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="wsgi", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> WsgiServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
