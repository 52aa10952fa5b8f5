"""What every benchmark needs: a real PostgreSQL server, real node processes, figures.

Benchmarks run against the same parts a farm runs on: a throwaway PostgreSQL
server (tests.support.pgserver) and node processes started exactly as an
operator would, through the `queueprocessor` CLI. Run them from the repository
root (`python bench/<name>.py`); this module puts the root on sys.path.
"""

import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402

from queueprocessor.rules.output import print_table  # noqa: E402
from queueprocessor.store.database import open_engine  # noqa: E402
from tests.support.pgserver import PostgresServer  # noqa: E402

__all__ = [
    "NodeProcess",
    "WakeProbe",
    "cpu_of",
    "cpu_seconds",
    "fresh_database",
    "load_average",
    "ms",
    "percentile",
    "postgres_pids",
    "print_table",
    "query",
    "rss_mb",
    "start_postgres",
    "stop_all",
    "wait_for",
]


def start_postgres(stat_statements: bool = False, max_connections: int | None = None) -> PostgresServer:
    """A throwaway server; with `stat_statements`, one that counts every statement it runs; with
    `max_connections`, one that accepts no more clients than that (PostgreSQL's default is 100)."""
    server = PostgresServer().start()
    if stat_statements:
        query(server.url, "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    if max_connections is not None:
        query(server.url, f"ALTER SYSTEM SET max_connections = {int(max_connections)}")
    if stat_statements or max_connections is not None:
        server.restart()
    if stat_statements:
        query(server.url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return server


def source_tree(ref: str, into: Path) -> Path:
    """The repository at git `ref`, extracted as files into `into` (no worktree, nothing written to the
    repository): the "before" side of a benchmark that compares code."""
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def rss_mb(pid: int) -> float:
    """A process's resident memory (VmRSS), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def fresh_database(server: PostgresServer, prefix: str = "bench") -> str:
    return server.create_database(f"{prefix}_{uuid.uuid4().hex[:10]}")


def query(url: str, sql: str, **params) -> list[tuple]:
    """Run one statement in autocommit on its own short-lived connection; rows if it returns any."""
    engine = open_engine(url, pool_size=1)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            result = conn.execute(text(sql), params)
            return [tuple(r) for r in result.all()] if result.returns_rows else []
    finally:
        engine.dispose()


class NodeProcess:
    """One `queueprocessor node` process, as an operator starts it; its log goes to a temp file."""

    def __init__(
        self,
        url: str,
        name: str,
        skew: float = 0.0,
        http_base: str = "http://127.0.0.1:9/",
        extra: tuple[str, ...] = (),
        root: Path = ROOT,
    ):
        """`root`: the source tree whose code runs (another one: a baseline checked out from git)."""
        self.name = name
        self.skew = skew
        self.log = tempfile.NamedTemporaryFile(prefix=f"qp-bench-{name}-", suffix=".log", delete=False)
        command = [
            sys.executable,
            "-m",
            "queueprocessor.cli",
            "--db",
            url,
            "node",
            "--name",
            name,
            "--clock-skew",
            repr(skew),
            "--http-base",
            http_base,
            *extra,
        ]
        self.process = subprocess.Popen(
            command,
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONPATH=str(root)),
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the machine dies without a word to anyone."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (drain and leave), then SIGKILL if it does not."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def discard_log(self) -> None:
        Path(self.log.name).unlink(missing_ok=True)


def stop_all(nodes: list[NodeProcess]) -> None:
    """Stop nodes together (each drains in parallel), keep the logs of those that failed."""
    for node in nodes:
        if node.alive():
            node.process.send_signal(signal.SIGTERM)
    for node in nodes:
        node.stop()
        if node.process.returncode in (0, -signal.SIGKILL, -signal.SIGTERM):
            node.discard_log()
        else:
            print(f"node {node.name} exited with {node.process.returncode}; log kept: {node.log.name}", file=sys.stderr)


def wait_for(condition, timeout: float, what: str, poll: float = 0.1):
    """Poll `condition()` until it returns something truthy; fail loudly after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


class WakeProbe:
    """How late a sleeping thread wakes on this machine right now: a loaded machine's scheduler,
    not the code under test, is what shows in the tails of timing figures. Use as a context manager
    around a measuring window; `late` holds each oversleep of a 10 ms sleep, in seconds."""

    def __init__(self, interval: float = 0.01):
        self.interval = interval
        self.late: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-wake-probe", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            time.sleep(self.interval)
            self.late.append(time.monotonic() - start - self.interval)

    def __enter__(self) -> "WakeProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (/proc/<pid>/stat utime + stime)."""
    return cpu_of([pid], reaped=False)


def cpu_of(pids: list[int], reaped: bool = True) -> float:
    """CPU seconds used so far by these processes, with (`reaped`) the children they have reaped (PostgreSQL's
    backends). A process that exited since it was listed counts nothing: its CPU is its parent's now."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += sum(int(f) for f in fields[11 : 15 if reaped else 13]) / os.sysconf("SC_CLK_TCK")
    return total


def postgres_pids(server: PostgresServer) -> list[int]:
    """The postmaster and every backend it forked: freezing only the postmaster would not stall queries."""
    root = server.pid
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == root:
                children.append(int(entry.name))
    return [root, *children]


def percentile(values, q: float) -> float:
    """The q-th percentile (0-100), linear between closest ranks; nan for no values."""
    data = sorted(values)
    if not data:
        return math.nan
    rank = (len(data) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (rank - low)


def ms(seconds: float, signed: bool = False) -> str:
    if math.isnan(seconds):
        return "-"
    return f"{seconds * 1000:+.2f}" if signed else f"{seconds * 1000:.2f}"


def rotated(cases: list, round_number: int) -> list:
    """The cases (or code trees) in the order of round `round_number`: each round starts one case later, so that
    no case always runs first, last or after the same neighbour while the shared machine's load drifts."""
    k = round_number % len(cases)
    return cases[k:] + cases[:k]


def load_average() -> str:
    """The machine's load, printed beside every figure: other work on the cores skews timing."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"
