"""A real local HTTP server that stands in for the service HTTP jobs call.

It records every request with the QueueProcessor headers it carried (and its W3C `traceparent`) and when it
started and ended, so tests can check what ran, where, with which attempt and
fence, and prove that a job never ran on two machines at once
(`concurrent_overlaps()`). `/write/<name>` behaves like a downstream service
that honours fencing: it rejects a writer whose token is older than one it has
already accepted for that job.

Routes:
    /ok -> 200            /fail -> 500            /status/<code> -> <code>
    /redirect/<path> -> 302 to /<path>
    /sleep/<seconds> -> 200 after sleeping (503 if the server stops first, 499 and
                        no reply if the caller hangs up first)
    /fails-once/<seconds> -> after sleeping, 500 to the first of its X-QP-Job's
                        requests to finish the sleep, 200 to later ones (a step
                        that fails once and succeeds when retried)
    /throttled/<n>/<seconds>[/date] -> 429 with Retry-After: <seconds> (with /date: the HTTP-date that many
                        seconds from now) to the first <n> requests of its X-QP-Job, 200 to later ones
    /flaky -> 500 while `down` is set, else 200 (a service that fails for a while, then recovers)
    POST /write/<name> -> 200 if X-QP-Fence >= the X-QP-Job's highest accepted fence,
                          else 409 (also when either header is missing)
    anything else -> 404
"""

from __future__ import annotations

import select
import socket
import sys
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["HttpTarget"]

_HEADERS = {"job": "X-QP-Job", "attempt": "X-QP-Attempt", "fence": "X-QP-Fence", "machine": "X-QP-Machine"}
_CLIENT_GONE = 499  # nginx's "client closed request": the caller hung up mid-sleep
_POLL = 0.02  # how often a sleeping request checks for stop or hang-up


def _header_value(raw: str | None) -> int | str | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return raw


class HttpTarget:
    """A ThreadingHTTPServer on 127.0.0.1 (random port) recording what it receives."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[dict] = []
        self._fences: dict[object, int] = {}  # job -> highest accepted fence
        self._failed_once: set[object] = set()  # jobs /fails-once/ has failed
        self._throttled: dict[object, int] = {}  # job -> requests /throttled/ has answered 429
        self._stopping = threading.Event()
        self.down = threading.Event()  # /flaky fails while set
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        self._server.daemon_threads = False  # let stop() join request threads
        self._server.handle_error = _ignore_hang_ups(self._server.handle_error)
        self.port = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(_POLL,), name="HttpTarget", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving, cut sleeps short, and join every thread."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def requests(self, path_prefix: str | None = None) -> list[dict]:
        """Snapshot of recorded requests (in arrival order), optionally by path prefix.

        Each is ``{"path", "method", "job", "attempt", "fence", "machine", "traceparent",
        "started", "ended", "status", "body", "accepted"}``; `ended` and
        `status` are None while the request is in flight, `accepted` is None
        except for /write.
        """
        with self._lock:
            return [dict(r) for r in self._records if path_prefix is None or r["path"].startswith(path_prefix)]

    def concurrent_overlaps(self) -> list[tuple[dict, dict]]:
        """Pairs of requests for the same job whose [started, ended] intervals overlap.

        An in-flight request counts as running until now. Empty means the job
        never ran twice at once.
        """
        now = time.time()
        by_job: dict[object, list[dict]] = {}
        for record in self.requests():
            if record["job"] is not None:
                by_job.setdefault(record["job"], []).append(record)
        overlaps = []
        for records in by_job.values():
            for i, a in enumerate(records):
                for b in records[i + 1 :]:
                    if a["started"] < (b["ended"] or now) and b["started"] < (a["ended"] or now):
                        overlaps.append((a, b))
        return overlaps

    def _begin(self, record: dict) -> None:
        with self._lock:
            self._records.append(record)

    def _finish(self, record: dict, status: int) -> None:
        with self._lock:
            record["status"] = status
            record["ended"] = time.time()

    def _accept_fence(self, job: object, fence: object) -> bool:
        """Admit a write only if its fence is at least the job's highest admitted so far."""
        if job is None or not isinstance(fence, int):
            return False
        with self._lock:
            if fence < self._fences.get(job, fence):
                return False
            self._fences[job] = fence
            return True

    def _first_failure(self, job: object) -> bool:
        """True the first time only for `job` (always for a request without X-QP-Job)."""
        with self._lock:
            first = job is None or job not in self._failed_once
            self._failed_once.add(job)
            return first

    def _throttle(self, job: object, times: int) -> bool:
        """True for the first `times` requests of `job`."""
        with self._lock:
            seen = self._throttled.get(job, 0)
            self._throttled[job] = seen + 1
            return seen < times

    def _sleep(self, seconds: float, conn: socket.socket) -> int:
        """Sleep `seconds` and return the status to record, ending early on stop or hang-up."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._stopping.is_set():
                return 503
            # Woken by the caller's hang-up as it arrives, so the record's end is the hang-up's time to the
            # millisecond, not to the poll: a run that starts right after its predecessor hung up must not look
            # as if the two overlapped.
            readable, _, _ = select.select([conn], [], [], min(left, _POLL))
            if readable:
                if _hung_up(conn):
                    return _CLIENT_GONE
                self._stopping.wait(min(left, _POLL))  # it sent more: nothing to wake on but the poll
        return 200

    def __enter__(self) -> HttpTarget:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _hung_up(conn: socket.socket) -> bool:
    readable, _, _ = select.select([conn], [], [], 0)
    if not readable:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _ignore_hang_ups(handle_error):
    """Wrap the server's error printer so callers that hang up don't spam stderr."""

    def wrapper(request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):
            handle_error(request, client_address)

    return wrapper


def _handler_class(target: HttpTarget) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._serve()

        do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

        def log_message(self, format: str, *args: object) -> None:
            """Silence the default per-request stderr log."""

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
            record = {
                "path": self.path,
                "method": self.command,
                **{key: _header_value(self.headers.get(name)) for key, name in _HEADERS.items()},
                "traceparent": self.headers.get("traceparent"),
                "started": time.time(),
                "ended": None,
                "status": None,
                "body": body,
                "accepted": None,
            }
            target._begin(record)
            status = self._route(record)
            target._finish(record, status)  # before replying, so a caller that got its reply sees the record
            if status != _CLIENT_GONE:
                reply = b"" if status in (204, 304) else f"{status}\n".encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                if "location" in record:
                    self.send_header("Location", record["location"])
                if "retry_after" in record:
                    self.send_header("Retry-After", record["retry_after"])
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        def _route(self, record: dict) -> int:
            parts = self.path.split("?", 1)[0].strip("/").split("/")
            match parts:
                case ["ok"]:
                    return 200
                case ["fail"]:
                    return 500
                case ["flaky"]:
                    return 500 if target.down.is_set() else 200
                case ["redirect", *rest]:
                    record["location"] = "/" + "/".join(rest)
                    return 302
                case ["status", code] if code.isdigit() and 200 <= int(code) <= 599:
                    return int(code)
                case ["sleep", seconds] if _is_seconds(seconds):
                    return target._sleep(float(seconds), self.connection)
                case ["fails-once", seconds] if _is_seconds(seconds):
                    status = target._sleep(float(seconds), self.connection)
                    return 500 if status == 200 and target._first_failure(record["job"]) else status
                case ["throttled", times, seconds, *form] if (
                    times.isdigit() and seconds.isdigit() and form in ([], ["date"])
                ):
                    if not target._throttle(record["job"], int(times)):
                        return 200
                    when = formatdate(time.time() + int(seconds), usegmt=True) if form else seconds
                    record["retry_after"] = when
                    return 429
                case ["write", _] if self.command == "POST":
                    record["accepted"] = target._accept_fence(record["job"], record["fence"])
                    return 200 if record["accepted"] else 409
            return 404

    return Handler


def _is_seconds(text: str) -> bool:
    try:
        return float(text) >= 0
    except ValueError:
        return False


def most_at_once(records: list[dict]) -> int:
    """The most of `records` (requests, see HttpTarget.requests) the target was serving at the same moment."""
    edges = sorted([(r["started"], 1) for r in records] + [(r["ended"], -1) for r in records])
    most = now = 0
    for _time, step in edges:
        now += step
        most = max(most, now)
    return most
