"""`queueprocessor demo`: a whole farm on this machine, to watch it work.

A local web server stands in for the services HTTP jobs call (/ok, /slow?ms=N,
/flaky, /import: down for the demo's first minute, /partner: down 20 s a minute).
Node processes join the farm with different simulated clock skews; with the
desktop app, the app's own in-process node is one of them. demo_mix sets the
farm up and feeds it a mix that shows every capability (TOUR says what to look
at). Every process the demo started is stopped when it ends (Ctrl-C, closing
the window, or --seconds running out).
"""

import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import parse_qs, urlsplit

from . import demo_mix
from .farm import Farm
from .rules.errors import QPError
from .rules.states import CHECKING_IN, JobState, MachineState
from .views import Dashboard

# Simulated wall-clock errors of the demo machines, seconds (the first one is the app's own node).
SKEWS = (0.9, -0.7, 0.25, -0.35, 0.55, -1.1, 1.3, 0.0)
IMPORT_DOWN = 60.0  # seconds /import fails from the demo's start: its jobs fail, to be retried in bulk
PARTNER = (60.0, 15.0, 35.0)  # /partner fails from 15 s to 35 s of every minute: the partner queue's breaker trips
DRAIN_GRACE = 1.5  # seconds a node gets to drain before it is told to leave at once
STOP_GRACE = 10.0  # seconds it then gets to leave before it is killed


class _Pages(BaseHTTPRequestHandler):
    """The demo's job target: /ok answers at once, /slow?ms=N after N ms, /flaky fails one time in three, /import
    and /partner fail while they are down (IMPORT_DOWN, PARTNER)."""

    started = time.monotonic()

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        up = time.monotonic() - self.started
        if parts.path in ("/import", "/partner"):
            down = up < IMPORT_DOWN if parts.path == "/import" else PARTNER[1] <= up % PARTNER[0] < PARTNER[2]
            self._answer(503 if down else 200, f"{parts.path[1:]}: {'down' if down else 'up'}")
        elif parts.path == "/ok":
            self._answer(200, "ok")
        elif parts.path == "/slow":
            try:
                delay = min(30_000, int(parse_qs(parts.query).get("ms", ["500"])[0]))
            except ValueError:
                return self._answer(400, "ms must be a whole number of milliseconds")
            time.sleep(delay / 1000)
            self._answer(200, f"slept {delay} ms")
        elif parts.path == "/flaky":
            if random.random() < 1 / 3:
                self._answer(500, "flaky: failed this time")
            else:
                self._answer(200, "flaky: worked this time")
        else:
            self._answer(404, "no such page: try /ok, /slow?ms=500, /flaky, /import or /partner")

    do_POST = do_GET

    def _answer(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:  # the demo prints its own status lines
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a node stopped a job mid-request: expected
            super().handle_error(request, client_address)


def start_web_server() -> ThreadingHTTPServer:
    _Pages.started = time.monotonic()  # the outages count from here
    server = _Server(("127.0.0.1", 0), _Pages)
    threading.Thread(target=server.serve_forever, args=(0.1,), name="demo-web", daemon=True).start()
    return server


def _stop_feeding(stop: threading.Event, feeder: threading.Thread) -> None:
    stop.set()
    feeder.join(5)


def _spawn(args: list[str], url: str, log: Path) -> subprocess.Popen[bytes]:
    """A child process with the database in its environment (a password never shows in `ps`)."""
    env = dict(os.environ, QP_DB=url)
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _node_args(name: str, skew: float, base: str) -> list[str]:
    return ["-m", "queueprocessor.cli", "node", "--name", name, *_work_args(skew, base)]


def _work_args(skew: float, base: str) -> list[str]:
    """What every demo node is told: its clock skew, the web target, and the demo's Python jobs allowed."""
    return ["--clock-skew", f"{skew:+.2f}", "--http-base", base, "--allow-module", demo_mix.MODULE]


def _stop_all(children: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM drains a node (it finishes its jobs); one still draining after DRAIN_GRACE (a long report) is told
    again with SIGINT, and leaves at once, its jobs back in the queue; anything alive after STOP_GRACE is killed."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for grace, then in ((DRAIN_GRACE, signal.SIGINT), (STOP_GRACE, signal.SIGKILL)):
        deadline = time.monotonic() + grace
        for child in children:
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.send_signal(then)
    for child in children:
        child.wait()


def status_line(farm: Farm, dashboard: Dashboard, started: float) -> str:
    """One line: each machine with state, offset and the leader star; job counts; recent turns."""
    machines = [m for m in dashboard.machines() if m["status"] != MachineState.STOPPED]
    parts = []
    for m in machines:
        offset = "" if m["clock_offset"] is None else f" {m['clock_offset']:+.3f}s"
        parts.append(f"{'*' if m['leader'] else ' '}{m['name']} {m['status']}{offset}")
    counts = farm.job_counts()
    shown = (JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED)
    jobs = ", ".join(f"{counts[state]} {state}" for state in shown)
    turns = len(farm.turns(10))
    return (
        f"[{time.monotonic() - started:6.1f}s] {' |'.join(parts) or 'no machines yet'} · jobs: {jobs} · "
        f"turns in the last 10 s: {turns}"
    )


def _leave(signum: int, _frame: object) -> NoReturn:
    raise SystemExit(128 + signum)


def window_problem() -> str | None:
    """What the system lacks for the app's window, in one line (ui/xcb.py), asked before any node starts. The
    app's package answers in a process of its own: the core never imports it."""
    asked = subprocess.run([sys.executable, "-m", "ui.xcb"], capture_output=True, text=True, timeout=60, check=False)
    said = asked.stderr.strip()
    return said if asked.returncode == 1 and said.startswith("the desktop app") else None


def _running(machine: dict[str, Any]) -> bool:
    """Does this machine still run? One of this host whose process is gone does not, even before the farm
    judges it dead (a node killed as it started has no time to mark itself stopped)."""
    if machine["status"] not in CHECKING_IN:
        return False
    if machine["host"] != socket.gethostname():
        return True
    try:
        os.kill(machine["pid"], 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process: alive
        pass
    return True


def start_clean(path: Path) -> None:
    """Remove the demo's own file from an earlier run, unless a demo still runs on it: its machines would stay as
    stopped rows with the same names (demo-2 three times), its jobs pile up."""
    if not path.exists():
        return
    try:
        with Farm(f"sqlite:///{path}", read_only=True) as old:
            if any(_running(m) for m in old.status()["machines"]):
                return
    except QPError:  # not a farm this version can read: leave it alone
        return
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def run_demo(url: str, *, nodes: int = 3, seconds: float = 0.0, headless: bool = False, fresh: bool = False) -> None:
    """`fresh`: `url` is the demo's own SQLite file (no --db given), started afresh (start_clean)."""
    if not headless and (lacking := window_problem()):
        print(f"demo: {lacking}; or run the demo with --headless", file=sys.stderr, flush=True)
        raise SystemExit(1)
    if fresh:
        start_clean(Path(url.removeprefix("sqlite:///")))
    signal.signal(signal.SIGTERM, _leave)  # a SIGTERM stops the demo's processes too, like Ctrl-C
    farm = Farm(url)
    dashboard = farm.dashboard()
    logs = Path(tempfile.mkdtemp(prefix="qp-demo-"))
    stop = threading.Event()
    children: list[subprocess.Popen[bytes]] = []
    with ExitStack() as cleanup:
        cleanup.callback(farm.close)
        web = start_web_server()
        cleanup.callback(web.server_close)
        cleanup.callback(web.shutdown)
        base = f"http://127.0.0.1:{web.server_address[1]}/"
        cleanup.callback(_stop_all, children)
        demo_mix.prepare(farm)
        first = 1 if headless else 2
        for n in range(first, nodes + 1):
            children.append(_spawn(_node_args(f"demo-{n}", SKEWS[n - 1], base), url, logs / f"demo-{n}.log"))
        feeder = threading.Thread(target=demo_mix.feed, args=(farm, stop), name="demo-feeder", daemon=True)
        feeder.start()
        cleanup.callback(_stop_feeding, stop, feeder)
        print(f"demo farm on {farm.masked_url}: {nodes} nodes, jobs from {base}, node logs in {logs}", flush=True)
        pids = ", ".join(f"demo-{n} pid {child.pid}" for n, child in enumerate(children, first))
        how = "kill -9 one" if headless else "kill one from the app's Node menu (or kill -9 one)"
        print(f"{how} to watch its jobs move to the others: {pids}", flush=True)
        started = time.monotonic()
        if headless:
            print("Ctrl-C to stop" if not seconds else f"running for {seconds:g} s", flush=True)
            while not seconds or time.monotonic() - started < seconds:
                time.sleep(1.0)
                print(status_line(farm, dashboard, started), flush=True)
        else:
            app = _spawn(
                ["-m", "ui", "--name", "demo-1", "--tour", *_work_args(SKEWS[0], base)],
                url,
                logs / "app.log",
            )
            children.insert(0, app)
            try:
                app.wait(seconds or None)
            except subprocess.TimeoutExpired:
                pass
            if app.returncode not in (None, 0):
                print(
                    f"demo: the desktop app exited with status {app.returncode}; see {logs / 'app.log'}",
                    file=sys.stderr,
                    flush=True,
                )
    print("demo stopped: every node left the farm", flush=True)
