"""What every benchmark needs: a real PostgreSQL server, real node processes, figures.

Benchmarks run against the same parts a farm runs on: a throwaway PostgreSQL
server (tests.support.pgserver) and node processes started exactly as an
operator would, through the `queueprocessor` CLI. Every script sets them up
through one harness, `farm(...)` (with `postgres(...)` for a server that
outlives several farms), which tears down whatever it started, whatever
happens. Run them from the repository root (`python bench/<name>.py`); this
module puts the root on sys.path.
"""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    # After PYTHONPATH's entries, before the installed packages: a child process a benchmark starts on another
    # tree's code (its --before side, PYTHONPATH=<that tree>) imports that tree's queueprocessor, not this one's.
    given = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path.insert(1 + len(given), str(ROOT))

from sqlalchemy import text  # noqa: E402

from queueprocessor.rules.output import print_table  # noqa: E402
from queueprocessor.store.database import open_engine  # noqa: E402
from tests.support.pgserver import PostgresServer  # noqa: E402

__all__ = [
    "FarmRun",
    "NodeProcess",
    "WakeProbe",
    "cpu_of",
    "cpu_seconds",
    "farm",
    "fresh_database",
    "node_args",
    "load_average",
    "ms",
    "percentile",
    "postgres",
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
    try:
        if stat_statements:
            query(server.url, "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        if max_connections is not None:
            query(server.url, f"ALTER SYSTEM SET max_connections = {int(max_connections)}")
        if stat_statements or max_connections is not None:
            server.restart()
        if stat_statements:
            query(server.url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    except BaseException:
        server.stop()
        raise
    return server


def source_tree(ref: str, into: Path) -> Path:
    """The repository at git `ref`, extracted as files into `into` (no worktree, nothing written to the
    repository): the "before" side of a benchmark that compares code."""
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_on(root: Path, script: str, *args: str) -> dict:
    """`script` run with `args` in a process of its own on the code in `root` (its tree, then its bench/, first on
    PYTHONPATH): the figures it printed last, as a JSON object. The child adds the path of the queueprocessor it
    imported as "code" (`{..., "code": queueprocessor.__file__}`), so a --before side that measured another
    tree is refused instead of reported; a child that failed stops the benchmark with the end of its stderr."""
    done = subprocess.run(
        [sys.executable, script, *args],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{root / 'bench'}"),
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"{root}: {done.stderr.strip()[-3000:] or done.returncode}")
    figures = json.loads(done.stdout.splitlines()[-1])
    loaded = Path(figures.pop("code")).resolve()
    if not loaded.is_relative_to(root.resolve()):
        raise SystemExit(f"the measurement meant for {root} ran the code in {loaded}: check PYTHONPATH")
    return figures


def rss_mb(pid: int) -> float:
    """A process's resident memory (VmRSS), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def fresh_database(server: PostgresServer, prefix: str = "bench") -> str:
    return server.create_database(f"{prefix}_{uuid.uuid4().hex[:10]}")


# Every run that ended, as SQL (`FROM {RUNS} r`): the rows of qp_runs, and the successes kept on their jobs' rows
# (schema 13: queueprocessor/store/history.py), one of them read where an older node wrote both. Also right on a
# database of an older schema (its successes are all in qp_runs).
RUNS = (
    "(SELECT job_id, attempt, machine_id, fence, started_at, finished_at, outcome, error FROM qp_runs UNION ALL "
    "SELECT j.id, j.attempts, j.owner, j.fence, j.started_at, j.finished_at, 'succeeded', j.last_error FROM qp_jobs j "
    "WHERE j.state = 'succeeded' AND NOT EXISTS (SELECT 1 FROM qp_runs o WHERE o.job_id = j.id AND o.fence = j.fence))"
)


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
        self.url, self.http_base, self.extra, self.root = url, http_base, extra, root  # what a restart repeats
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


# -- the harness: a server, a farm database, node processes, torn down whatever happens ---------------------------


@contextmanager
def postgres(stat_statements: bool = False, max_connections: int | None = None) -> Iterator[PostgresServer]:
    """A throwaway server (see start_postgres) for the block, stopped and deleted at its end, an exception or a
    Ctrl-C included: for a script that runs several farms, each `farm(server=...)`, on one server."""
    server = start_postgres(stat_statements, max_connections)
    try:
        yield server
    finally:
        server.stop()


def node_args(**options) -> tuple[str, ...]:
    """`queueprocessor node` options from keywords: `capacity=4` is `--capacity 4`, `push=False` is `--no-push`,
    `no_push=True` is `--no-push`, a list or tuple repeats its flag (`allow_module=["a", "b"]`), None is left out."""
    args: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, (list, tuple)):
            for item in value:
                args += [flag, str(item)]
        else:
            args += [flag, str(value)]
    return tuple(args)


class FarmRun:
    """What `farm(...)` yields: the database's URL, its server (None on SQLite), an open Farm (None if not asked
    for), the node processes it started (`nodes`), and ways to start, stop, kill and restart one. Every node
    started through it, in-process ones included, is stopped when the block ends."""

    def __init__(self, url: str, server: PostgresServer | None, root: Path, http_base: str, options: dict):
        self.url = url
        self.server = server
        self.root = root
        self.http_base = http_base
        self.options = options  # the node options every node gets unless start() says otherwise
        self.farm = None  # a queueprocessor.farm.Farm on `url`, if farm(open=True)
        self.bouncer = None  # a tests.support.pgbouncer.PgBouncer the nodes go through, if farm(pgbouncer=True)
        self.nodes: list[NodeProcess] = []
        self.in_process: list = []  # queueprocessor.node.node.Node, started by start_in_process

    def start(
        self,
        name: str,
        *,
        url: str | None = None,
        http_base: str | None = None,
        skew: float = 0.0,
        root: Path | None = None,
        **options,
    ) -> NodeProcess:
        """One more node process (`queueprocessor node --name name`), with the farm's node options updated by
        `options` (see node_args); `url`: another way to the same database (a proxy's)."""
        where = url or (self.bouncer.url_for(self.url) if self.bouncer is not None else self.url)
        node = NodeProcess(
            where,
            name,
            skew=skew,
            http_base=http_base or self.http_base,
            extra=node_args(**(self.options | options)),
            root=root or self.root,
        )
        self.nodes.append(node)
        return node

    def start_in_process(self, **settings):
        """A node in this process (Farm.node(**settings).start()), for what only in-process code can do: step its
        clock, count its calls. Stopped (no drain) when the block ends."""
        node = self.farm.node(**settings).start()
        self.in_process.append(node)
        return node

    def live(self) -> list[NodeProcess]:
        return [n for n in self.nodes if n.alive()]

    def kill(self, node: NodeProcess) -> None:
        """SIGKILL: the machine dies without a word to anyone."""
        node.kill()

    def stop(self, node: NodeProcess) -> None:
        """SIGTERM (drain and leave), then SIGKILL if it does not; its log kept only if it failed."""
        stop_all([node])

    def restart(self, node: NodeProcess) -> NodeProcess:
        """Kill `node` if it still runs and start a new process under its name, with the same options."""
        if node.alive():
            node.kill()
        again = NodeProcess(
            node.url, node.name, skew=node.skew, http_base=node.http_base, extra=node.extra, root=node.root
        )
        self.nodes.append(again)
        return again

    def wait_joined(self, count: int | None = None, timeout: float = 60) -> None:
        """Until the farm's status shows `count` machines (default: every node process started)."""
        count = len(self.nodes) if count is None else count
        wait_for(lambda: len(self.farm.status()["machines"]) == count, timeout, "nodes to join")

    def log_paths(self) -> dict[str, str]:
        """Each node process's log file, by its name and pid."""
        return {f"{n.name}#{n.pid}": n.log.name for n in self.nodes}

    def close(self) -> None:
        """Every node stopped (the processes drain together), the Farm closed."""
        try:
            for node in self.in_process:
                node.stop(drain=False)
        finally:
            try:
                stop_all(self.nodes)
            finally:
                if self.farm is not None:
                    self.farm.close()


@contextmanager
def farm(
    nodes: int = 0,
    backend: str = "postgresql",
    *,
    server: PostgresServer | None = None,
    url: str | None = None,
    stat_statements: bool = False,
    max_connections: int | None = None,
    pgbouncer: bool = False,
    prefix: str = "bench",
    open: bool = True,
    settings: dict | None = None,
    drop: bool = False,
    names: str = "node-{}",
    http_base: str = "http://127.0.0.1:9/",
    root: Path = ROOT,
    **node_options,
) -> Iterator[FarmRun]:
    """One farm for the block: a database (a fresh one on `server`, on a throwaway server of its own when none is
    given, or a SQLite file with backend="sqlite"; `url`: an existing one), a Farm on it (`open`, with
    `settings` applied when given), then `nodes` node processes named `names` with `node_options` (node_args),
    through a PgBouncer with `pgbouncer`. At the block's end, an exception or Ctrl-C included: the nodes stopped,
    the Farm closed, the database dropped (`drop`) or the file deleted, the server it started stopped."""
    if backend not in ("postgresql", "sqlite"):
        raise ValueError(f"backend must be postgresql or sqlite, not {backend!r}")
    with ExitStack() as stack:
        if url is None and backend == "sqlite":
            folder = tempfile.mkdtemp(prefix="qp-bench-")
            stack.callback(shutil.rmtree, folder, ignore_errors=True)
            url = f"sqlite:///{folder}/farm.db"
        elif url is None:
            if server is None:
                server = stack.enter_context(postgres(stat_statements, max_connections))
            url = fresh_database(server, prefix)
            if drop:
                stack.callback(query, server.url, f'DROP DATABASE "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
        run = FarmRun(url, server, root, http_base, node_options)
        if pgbouncer:
            from tests.support.pgbouncer import PgBouncer

            run.bouncer = stack.enter_context(PgBouncer(server))
        stack.callback(run.close)
        if open:
            from queueprocessor.farm import Farm

            run.farm = Farm(url)
            if settings is not None:
                run.farm.settings(**settings)
        for i in range(nodes):
            run.start(names.format(i))
        yield run


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
