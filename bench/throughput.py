"""Throughput: how fast 1, 2 and 4 worker processes drain a backlog, beside the peers and the database alone.

Each system gets a fresh database on the same throwaway PostgreSQL server and
the same number of worker processes, all started and idle before a backlog of
N jobs is enqueued in one go. The clock runs from the enqueue's commit until
the orchestrator, polling every 50 ms, sees the queue empty (a system still at
it after --patience seconds, default 120, is rated by the jobs it finished by
then). The CPU time the workers and PostgreSQL spent, per job, is printed for
every system. Five kinds of job:

- python: a plain no-op function, run in a worker thread, as each system runs
  one: our node calls it in its thread pool; PgQueuer (whose entrypoints must
  be `async def`) through `asyncio.to_thread`, its documented way; Procrastinate
  runs a plain task in a thread itself.
- async: an `async def` no-op on each system's event loop (the Node peers' only
  kind: an async no-op handler).
- http: a GET of a real local web server (a small asyncio HTTP/1.1 server in
  its own process, keep-alive): ours is the node's HTTP executor; the peers'
  tasks use the same client the same way (one aiohttp session, no connection
  cap, no cookies), and read the answer as it does.
- batch: a batch function, an `async def` no-op called with many jobs at once
  (ours: `@job(batch=10_000)`, so a node's --capacity, which bounds its claims,
  sets the size of a call), beside pg-boss's batch handler (`work()` with
  `batchSize`, one call and one completing statement per batch), the only peer
  with one; batch-plain: the same as a plain function, in a worker thread.
  Each job is still enqueued, claimed, leased, fenced and ended on its own.

The systems (--systems), each at one or more settings; the tables name each
peer's best setting:

- queueprocessor: our nodes, `--capacity` C (--concurrency, alias --capacity);
  queueprocessor-pgbouncer: the same through a PgBouncer in transaction pooling
  mode (tests.support.pgbouncer, pool of 20; target: within 20 %);
  with --before REF, also our nodes on the code of a git ref (a before/after
  in the same run, on the same server).
- pgqueuer, procrastinate: from PyPI, in the bench's own virtualenv
  (~/.cache/queueprocessor-bench/peers), at --peer-concurrency (default C) jobs
  at once per process (PgQueuer's max_concurrent_tasks, batches of half that).
- graphile: Graphile Worker 0.17.3 (npm), -j 32, at its defaults and in its
  batching mode (bench/peers/graphile.config.js: localQueue of 500,
  completeJobBatchDelay 0), --graphile.
- pgboss: pg-boss 10.4.2 (npm; the last line for Node 20), L work() loops per
  process each fetching B jobs at a time, --pgboss (`sweep`: B 250 to 8000 x
  L 2 to 8).
- pgbench: the database alone, no worker: pgbench runs bench/peers/ceiling.sql
  (claim B rows FOR UPDATE SKIP LOCKED and commit, then mark them done) with
  one client per process, batches of 1, 32 and 1,000 (--ceiling-batches). Its
  CPU is pgbench's.

Node peers are installed with npm into ~/.cache/queueprocessor-bench/<package>-<version>
on first use, beside copies of their scripts from bench/peers/; never into
the project. A peer that cannot be installed is skipped with one line.
The target: ours at least 1.3x every peer's best.

    python bench/throughput.py            # 20,000 jobs; 1, 2, 4 processes; python, async and http
    python bench/throughput.py --quick    # 2,000 jobs; 1 and 2 processes
    python bench/throughput.py --jobs 100000 --kinds async --processes 1 --concurrency 256 \\
        --systems queueprocessor,graphile,pgbench --graphile batch --ceiling-batches 1000
    python bench/throughput.py --jobs 100000 --kinds batch --processes 1,2 --concurrency 4000 \\
        --systems queueprocessor,pgboss,pgbench --ceiling-batches 1000
"""

import argparse
import asyncio
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

CACHE = Path.home() / ".cache" / "queueprocessor-bench"
PEERS_VENV = CACHE / "peers"
PEER_PACKAGES = ("pgqueuer==1.6.0", "asyncpg>=0.29", "procrastinate==3.10.0", "psycopg[binary]>=3.2", "aiohttp>=3.9")
PEER_FILES = Path(__file__).resolve().parent / "peers"  # the Node peers' scripts and the ceiling's pgbench script
OURS, THROUGH_PGBOUNCER = "queueprocessor", "queueprocessor-pgbouncer"  # the second: not a default
BEFORE = "queueprocessor-before"  # our nodes on the code of --before REF
OUR_SYSTEMS = (OURS, THROUGH_PGBOUNCER, BEFORE)
PYTHON_PEERS = ("pgqueuer", "procrastinate")


class NodePeer(NamedTuple):
    package: str
    version: str
    files: tuple[str, ...]  # from bench/peers, copied beside its node_modules; the first is the script


NODE_PEERS = {
    "graphile": NodePeer("graphile-worker", "0.17.3", ("graphile.js", "graphile.config.js")),
    "pgboss": NodePeer("pg-boss", "10.4.2", ("pgboss.js",)),
}
CEILING = "pgbench"
SYSTEMS = (OURS, *PYTHON_PEERS, *NODE_PEERS, CEILING)
GRAPHILE_JOBS = 32  # Graphile Worker's -j in both modes, as in the published comparison
PGBOSS_SWEEP = tuple(f"{loops}x{batch}" for loops in (2, 4, 8) for batch in (250, 1000, 4000, 8000))


# -- the peers, run inside their own virtualenv --------------------------------------------------


async def peer_main(system: str, role: str, dsn: str, kind: str, count: int, concurrency: int, url: str) -> None:
    import logging
    from datetime import timedelta

    import aiohttp

    logging.getLogger("procrastinate").setLevel(logging.ERROR)  # its advice on where to create the App
    # The session our HTTP executor makes (queueprocessor/executors/http.py), so every system's HTTP job is the
    # same client work.
    session = (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), cookie_jar=aiohttp.DummyCookieJar())
        if role == "worker" and kind == "http"
        else None
    )

    def noop():
        pass

    async def work():
        if kind == "http":
            async with session.get(url, allow_redirects=False) as response:
                await response.text()
                response.raise_for_status()
        elif kind == "python":
            await asyncio.to_thread(noop)

    if system == "pgqueuer":
        import asyncpg
        from pgqueuer import PgQueuer, Queries
        from pgqueuer.db import AsyncpgDriver

        # asyncpg, the driver PgQueuer's README and its own benchmark (tools/benchmark.py) use and its docs
        # recommend for throughput. Its psycopg driver waits for notices on the connection its queries use
        # (psycopg's notifies() holds the connection, psycopg#340), so an idle listener delays the next
        # dequeue by up to a second: 44 plain-function jobs/s for one process, in an earlier run of this script.
        driver = AsyncpgDriver(await asyncpg.connect(dsn))
        if role == "install":
            return await Queries(driver).install()
        if role == "enqueue":
            await Queries(driver).enqueue(["job"] * count, [None] * count, [0] * count)
            return print(time.monotonic(), flush=True)  # committed: the drain's clock starts here
        pgq = PgQueuer(driver)

        @pgq.entrypoint("job")
        async def job(_job):
            await work()

        print("ready", flush=True)
        # Idle, it waits for a notice or 1 s (its default is 30 s): Procrastinate's polling interval, our period.
        await pgq.run(
            batch_size=max(1, concurrency // 2), max_concurrent_tasks=concurrency, dequeue_timeout=timedelta(seconds=1)
        )
    else:
        import procrastinate

        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn, max_size=8))

        if kind == "python":

            @app.task(name="job")
            def job():
                noop()
        else:

            @app.task(name="job")
            async def job():
                await work()

        async with app.open_async():
            if role == "install":
                return await app.schema_manager.apply_schema_async()
            if role == "enqueue":
                for start in range(0, count, 5000):
                    await job.batch_defer_async(*([{}] * min(5000, count - start)))
                return print(time.monotonic(), flush=True)
            print("ready", flush=True)
            await app.run_worker_async(
                concurrency=concurrency,
                wait=True,
                listen_notify=True,
                fetch_job_polling_interval=1.0,
                install_signal_handlers=False,
            )


# -- the web server the HTTP jobs call ------------------------------------------------------------


async def serve(port: int) -> None:
    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                if length:
                    await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


# -- what is compared ----------------------------------------------------------------------------


@dataclass
class Config:
    """One system at one setting; a system's column in the comparison is its best config."""

    system: str
    name: str  # short, for the comparison's cells
    setting: str  # in full, for the table of every config
    options: dict = field(default_factory=dict)  # what the system's starter reads


def configs_of(system: str, args) -> list[Config]:
    if system in (OURS, THROUGH_PGBOUNCER):
        return [Config(system, "", f"--capacity {args.concurrency}", {"capacity": args.concurrency})]
    if system == BEFORE:
        return [
            Config(
                system,
                args.before,
                f"--capacity {args.concurrency}, the code of {args.before}",
                {"capacity": args.concurrency},
            )
        ]
    if system == "pgqueuer":
        return [
            Config(system, f"{c} at once", f"max_concurrent_tasks {c}, batch_size {max(1, c // 2)}", {"concurrency": c})
            for c in args.peer_concurrency
        ]
    if system == "procrastinate":
        return [Config(system, f"{c} at once", f"concurrency {c}", {"concurrency": c}) for c in args.peer_concurrency]
    if system == "graphile":
        modes = {
            "defaults": Config(system, "defaults", f"-j {GRAPHILE_JOBS}", {"BATCHING": "0"}),
            "batch": Config(
                system, "batching", f"-j {GRAPHILE_JOBS}, localQueue 500, completeJobBatchDelay 0", {"BATCHING": "1"}
            ),
        }
        return [modes[mode] for mode in args.graphile]
    if system == "pgboss":
        return [
            Config(
                system,
                spec,
                f"{spec.split('x')[0]} work() loops x batchSize {spec.split('x')[1]}",
                {"LOOPS": spec.split("x")[0], "BATCH_SIZE": spec.split("x")[1]},
            )
            for spec in args.pgboss
        ]
    return [
        Config(
            system, f"batch {b}", f"claim {b} rows FOR UPDATE SKIP LOCKED, commit; mark them done, commit", {"batch": b}
        )
        for b in args.ceiling_batches
    ]


BATCH_KINDS = ("batch", "batch-plain")  # batch functions: pg-boss's batch handler is the only peer's kind like them
OUR_TARGETS = {
    "python": "bench.jobs:noop",
    "async": "bench.jobs:noop_async",
    "batch": "bench.jobs:noop_batch",
    "batch-plain": "bench.jobs:noop_batch_plain",
}


def runs_kind(system: str, kind: str, kinds: list[str]) -> bool:
    """The Node peers run `async def`-like handlers only, and of them only pg-boss has batch handlers; the Python
    peers have no batch functions (nor has a tree older than them: --before fails there); the database alone does
    not depend on the kind, so it runs once, with the first kind."""
    if system == "pgboss":  # its batch handler: beside our batch functions, when they run
        return kind in BATCH_KINDS if set(BATCH_KINDS) & set(kinds) else kind == "async"
    if kind in BATCH_KINDS:
        return system in OUR_SYSTEMS or (system == CEILING and kind == kinds[0])
    if system in NODE_PEERS:
        return kind == "async"
    return kind == kinds[0] if system == CEILING else True


# -- installing the peers, each in its own folder, never in the project --------------------------


def peers_python() -> str | None:
    """The virtualenv with PgQueuer and Procrastinate, made on first use and whenever PEER_PACKAGES changes;
    None (said in one line) if it cannot be made."""
    python, installed = PEERS_VENV / "bin" / "python", PEERS_VENV / "installed.txt"
    if not installed.exists() or installed.read_text() != "\n".join(PEER_PACKAGES):
        print(f"installing {', '.join(PEER_PACKAGES)} into {PEERS_VENV} ...", flush=True)
        made = install(
            "PgQueuer and Procrastinate", [sys.executable, "-m", "venv", str(PEERS_VENV)], CACHE
        ) and install(
            "PgQueuer and Procrastinate", [str(python), "-m", "pip", "install", "--quiet", *PEER_PACKAGES], PEERS_VENV
        )
        if not made:
            return None
        installed.write_text("\n".join(PEER_PACKAGES))
    return str(python)


def node_peer(system: str) -> Path | None:
    """The folder a Node peer is installed in (npm, on first use) with its scripts beside it; None (said in one
    line) if it cannot be installed."""
    peer = NODE_PEERS[system]
    folder = CACHE / f"{peer.package}-{peer.version}"
    if shutil.which("node") is None:
        print(
            f"{peer.package}: node is not on PATH (Node 20: apt-get install nodejs); left out of this run", flush=True
        )
        return None
    installed = folder / "node_modules" / peer.package / "package.json"
    if not installed.exists() or json.loads(installed.read_text())["version"] != peer.version:
        print(f"installing {peer.package}@{peer.version} into {folder} ...", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "package.json").write_text('{"private": true}\n')
        if not install(
            f"{peer.package}@{peer.version}",
            ["npm", "install", "--no-audit", "--no-fund", "--save-exact", f"{peer.package}@{peer.version}"],
            folder,
        ):
            return None
    for name in peer.files:
        shutil.copyfile(PEER_FILES / name, folder / name)
    return folder


def install(what: str, command: list[str], cwd: Path) -> bool:
    """Run an install step; on failure say so in one line (no network, no npm, ...) rather than a traceback."""
    cwd.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"{what}: {Path(command[0]).name} {command[1]} failed ({error}); left out of this run", flush=True)
        return False
    if done.returncode:
        lines = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()
        said = next((line for line in lines if "error" in line.lower()), lines[-1])  # npm's and pip's first word
        print(f"{what}: {Path(command[0]).name} {command[1]} failed ({said.strip()}); left out of this run", flush=True)
    return done.returncode == 0


def installed_systems(systems: list[str], server, before: str | None) -> dict[str, str | Path]:
    """What runs each system but ours (a Python, a Node peer's folder, pgbench, the tree of `before`); a system
    that cannot run is left out, with one line."""
    found: dict[str, str | Path] = {}
    python = peers_python() if set(systems) & set(PYTHON_PEERS) else None
    for system in systems:
        if system == BEFORE:
            where = older_tree(before)
        elif system in PYTHON_PEERS:
            where = python
        elif system in NODE_PEERS:
            where = node_peer(system)
        elif system == CEILING:
            where = server.bin_dir / "pgbench" if (server.bin_dir / "pgbench").exists() else None
            if where is None:
                print(f"pgbench: not in {server.bin_dir} (Debian: postgresql-15); left out of this run", flush=True)
        else:
            continue
        if where is not None:
            found[system] = where
    return found


def older_tree(ref: str) -> Path | None:
    """The repository at `ref`, extracted into a temporary folder (removed at the end of the run)."""
    from common import source_tree

    try:
        return source_tree(ref, Path(tempfile.mkdtemp(prefix="qp-before-")))
    except subprocess.CalledProcessError as error:
        print(
            f"--before {ref}: git archive failed ({error.stderr.decode().strip() or error.returncode}); "
            "left out of this run",
            flush=True,
        )
        return None


# -- the orchestra --------------------------------------------------------------------------------


@dataclass
class Bench:
    """What every case of a run shares."""

    server: object  # tests.support.pgserver.PostgresServer
    count: int
    patience: float
    web_url: str
    pgbouncer: object | None  # tests.support.pgbouncer.PgBouncer, for THROUGH_PGBOUNCER
    installed: dict  # installed_systems()


class Running(NamedTuple):
    """A system's workers, started and idle, with what run_case needs to measure their drain."""

    pids: list[int]
    enqueue: Callable[[], float]  # writes the backlog; when it committed (time.monotonic())
    stop: Callable[[], None]


# SQL: the jobs not finished yet, and those that failed (the clock stops once the first has none).
LEFT = {
    OURS: "SELECT count(*) FROM qp_jobs WHERE state IN ('queued', 'running')",
    "pgqueuer": "SELECT count(*) FROM pgqueuer",
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
    "graphile": "SELECT count(*) FROM graphile_worker._private_jobs",  # it deletes a job that succeeded
    "pgboss": "SELECT count(*) FROM pgboss.job WHERE state < 'completed'",
}
FAILED = {
    OURS: "SELECT count(*) FROM qp_jobs WHERE state IN ('failed', 'cancelled')",
    "pgqueuer": "SELECT count(*) FROM pgqueuer_log WHERE status IN ('exception', 'canceled')",
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('failed', 'aborted', 'cancelled')",
    "graphile": "SELECT count(*) FROM graphile_worker._private_jobs WHERE last_error IS NOT NULL",
    "pgboss": "SELECT count(*) FROM pgboss.job WHERE state = 'failed'",
}


class Worker:
    """A worker process that says 'ready' on stdout once it is listening."""

    def __init__(self, command: list, cwd: Path, env: dict | None = None):
        self.process = subprocess.Popen(
            command,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env or dict(os.environ, PYTHONPATH=str(cwd)),
        )

    def wait_ready(self) -> None:
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError(
                f"{' '.join(map(str, self.process.args[:3]))} did not start (exit {self.process.poll()})"
            )

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.process.stdout.close()


def start_workers(commands: list[list], cwd: Path, env: dict | None = None) -> list[Worker]:
    """Worker processes, each ready and listening; none left running if one fails to start."""
    workers = [Worker(command, cwd, env) for command in commands]
    try:
        for worker in workers:
            worker.wait_ready()
        time.sleep(1.0)  # listening
    except BaseException:  # also a SIGTERM of the whole run
        for worker in workers:
            worker.stop()
        raise
    return workers


def stopping(workers: list[Worker]) -> Callable[[], None]:
    def stop() -> None:
        for worker in workers:
            worker.stop()

    return stop


def start_ours(bench: Bench, config: Config, kind: str, processes: int, url: str) -> Running:
    """Our nodes, and the farm's calls made by the same code (this checkout's, or --before's) in processes of
    their own (farm_main): an older tree gets the schema and the enqueue of its own code."""
    from common import ROOT, NodeProcess, stop_all

    root = bench.installed[BEFORE] if config.system == BEFORE else ROOT
    env = dict(os.environ, PYTHONPATH=str(root))

    def farm(action: str, count: int) -> list[str]:
        return [
            sys.executable,
            str(Path(__file__).resolve()),
            "--farm",
            action,
            "--dsn",
            url,
            "--kind",
            kind,
            "--count",
            str(count),
        ]

    subprocess.run(farm("settings", 0), cwd=root, env=env, check=True, capture_output=True)
    nodes_url = bench.pgbouncer.url_for(url) if config.system == THROUGH_PGBOUNCER else url
    nodes = [
        NodeProcess(
            nodes_url,
            f"node-{i}",
            http_base=bench.web_url,
            root=root,
            extra=("--capacity", str(config.options["capacity"]), "--allow-module", "bench.jobs"),
        )
        for i in range(processes)
    ]
    try:
        subprocess.run(farm("joined", processes), cwd=root, env=env, check=True, capture_output=True, text=True)
        time.sleep(2.5)  # the join delay: every node takes turns
    except BaseException:  # also a SIGTERM of the whole run
        stop_all(nodes)
        raise
    return Running(
        [node.pid for node in nodes], committed_at(farm("enqueue", bench.count), root, env), lambda: stop_all(nodes)
    )


def farm_main(action: str, url: str, kind: str, count: int) -> None:
    """One farm call for start_ours, by the queueprocessor on PYTHONPATH: make the schema, wait until `count`
    nodes have joined, or enqueue `count` jobs of `kind` and print when they committed."""
    from queueprocessor.farm import Farm

    farm = Farm(url)
    try:
        if action == "settings":
            farm.settings()
        elif action == "joined":
            deadline = time.monotonic() + 60
            while len(farm.status()["machines"]) != count:
                if time.monotonic() > deadline:
                    sys.exit(f"{count} nodes did not join within 60 s")
                time.sleep(0.1)
        else:
            if kind == "http":
                farm.enqueue_http("/", count=count)
            else:
                farm.enqueue_python(OUR_TARGETS[kind], count=count)
            print(time.monotonic(), flush=True)  # committed
    finally:
        farm.close()


def start_python_peer(bench: Bench, config: Config, kind: str, processes: int, url: str) -> Running:
    from common import ROOT

    peer = [
        bench.installed[config.system],
        str(Path(__file__).resolve()),
        "--peer",
        config.system,
        "--dsn",
        dsn_of(url),
        "--kind",
        kind,
        "--count",
        str(bench.count),
        "--concurrency",
        str(config.options["concurrency"]),
        "--url",
        bench.web_url,
    ]
    subprocess.run([*peer, "--role", "install"], check=True, cwd=ROOT)
    workers = start_workers([[*peer, "--role", "worker"]] * processes, ROOT)
    return Running(
        [w.process.pid for w in workers], committed_at([*peer, "--role", "enqueue"], ROOT), stopping(workers)
    )


def start_node_peer(bench: Bench, config: Config, kind: str, processes: int, url: str) -> Running:
    folder, script = bench.installed[config.system], NODE_PEERS[config.system].files[0]
    env = dict(os.environ, DSN=dsn_of(url), COUNT=str(bench.count), CONCURRENCY=str(GRAPHILE_JOBS), **config.options)
    subprocess.run(["node", script, "install"], check=True, cwd=folder, env=env, capture_output=True)
    workers = start_workers([["node", script, "worker"]] * processes, folder, env)
    return Running(
        [w.process.pid for w in workers], committed_at(["node", script, "enqueue"], folder, env), stopping(workers)
    )


def committed_at(command: list, cwd: Path, env: dict | None = None) -> Callable[[], float]:
    """A peer's enqueue, in a process of its own that prints when its backlog committed, by CLOCK_MONOTONIC (the
    clock time.monotonic() reads): the peer's workers start then, not once that process has exited."""
    return lambda: float(
        subprocess.run(command, check=True, cwd=cwd, env=env, capture_output=True, text=True).stdout.split()[-1]
    )


STARTERS = {
    **dict.fromkeys(OUR_SYSTEMS, start_ours),
    **dict.fromkeys(PYTHON_PEERS, start_python_peer),
    **dict.fromkeys(NODE_PEERS, start_node_peer),
}


def dsn_of(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


class Result(NamedTuple):
    rate: float  # jobs per second
    workers_us: float  # CPU per job, microseconds
    postgres_us: float


def run_case(bench: Bench, config: Config, kind: str, processes: int) -> Result:
    """Drain `bench.count` jobs with `processes` workers of one system at one setting (PostgreSQL alone: that
    many pgbench clients). A system that has not drained the backlog after `bench.patience` seconds is rated by
    what it finished by then."""
    from common import farm

    # Dropped before the next case starts: its dead rows would have autovacuum working during that case.
    with farm(server=bench.server, prefix=f"tp_{config.system}", open=False, drop=True) as run:
        if config.system == CEILING:
            return run_ceiling(bench, config, processes, run.url)
        return drain(bench, config, kind, processes, run.url)


def drain(bench: Bench, config: Config, kind: str, processes: int, url: str) -> Result:
    from common import cpu_of, postgres_pids, query
    from sqlalchemy import text

    from queueprocessor.store.database import open_engine

    table = OURS if config.system in OUR_SYSTEMS else config.system
    running = STARTERS[config.system](bench, config, kind, processes, url)
    try:
        cpu = (cpu_of(running.pids), cpu_of(postgres_pids(bench.server)))
        started = time.monotonic()
        enqueued = running.enqueue()
        watcher = open_engine(url, pool_size=1)
        with watcher.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:  # one cheap query a poll
            empty = text(f"SELECT NOT EXISTS ({LEFT[table].replace('count(*)', '1')})")
            while not conn.execute(empty).scalar() and time.monotonic() - enqueued < bench.patience:
                time.sleep(0.05)  # a no-op backlog drains in 1-2 s: 100 ms would blur it, 20 ms load the server
            done = time.monotonic()
            finished = bench.count - conn.execute(text(LEFT[table])).scalar()
            used = cpu_of(running.pids) - cpu[0], cpu_of(postgres_pids(bench.server)) - cpu[1]
        watcher.dispose()
        failed = query(url, FAILED[table])[0][0]
        shared = shares(url, processes) if table == OURS and processes > 1 else ""
    finally:
        running.stop()
    if failed:
        raise RuntimeError(f"{config.system}: {failed} jobs did not succeed")
    return report(
        config,
        kind,
        processes,
        finished,
        bench.count,
        done - enqueued,
        used,
        f"enqueue {enqueued - started:.1f} s, {shared}",
    )


def shares(url: str, processes: int) -> str:
    """How evenly our machines shared the backlog: the busiest one's runs over the idlest one's (the target is
    at most 1.25 over a drain of 100,000); a machine that ran nothing counts as 0."""
    from common import RUNS, query

    ran = [
        n
        for _, n in query(
            url, f"SELECT machine_id, count(*) FROM {RUNS} r WHERE outcome = 'succeeded' GROUP BY machine_id"
        )
    ]
    counts = sorted([0] * (processes - len(ran)) + ran)
    spread = f"{counts[-1] / counts[0]:.2f}" if counts[0] else "inf"
    return f"jobs per machine {'/'.join(map(str, counts))}, max/min {spread}, "


def run_ceiling(bench: Bench, config: Config, clients: int, url: str) -> Result:
    """The database alone: `clients` pgbench clients claim and complete the backlog in batches, no worker."""
    from common import cpu_of, postgres_pids, query

    query(
        url,
        "CREATE TABLE ceiling_jobs (id bigserial PRIMARY KEY, state smallint NOT NULL DEFAULT 0, "
        "payload jsonb NOT NULL DEFAULT '{}')",
    )
    query(url, "CREATE INDEX ceiling_queued ON ceiling_jobs (id) WHERE state = 0")
    query(url, "INSERT INTO ceiling_jobs (state) SELECT 0 FROM generate_series(1, :n)", n=bench.count)
    query(url, "VACUUM ANALYZE ceiling_jobs")
    server, batch = bench.server, config.options["batch"]
    transactions = math.ceil(bench.count / batch / clients)  # SKIP LOCKED: the clients' batches never overlap
    command = [
        str(bench.installed[CEILING]),
        "--no-vacuum",
        "--protocol",
        "prepared",
        "--file",
        str(PEER_FILES / "ceiling.sql"),
        "--define",
        f"batch={batch}",
        "--client",
        str(clients),
        "--jobs",
        str(clients),
        "--transactions",
        str(transactions),
        "--host",
        "127.0.0.1",
        "--port",
        str(server.port),
        "--username",
        server.user,
        url.rsplit("/", 1)[1],
    ]
    cpu = (resource.getrusage(resource.RUSAGE_CHILDREN), cpu_of(postgres_pids(server)))
    started = time.monotonic()
    done = subprocess.run(command, env=dict(os.environ, PGPASSWORD=server.password), capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if done.returncode:
        raise RuntimeError(f"pgbench failed: {(done.stderr.strip() or 'no output').splitlines()[-1]}")
    mine = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (mine.ru_utime + mine.ru_stime - cpu[0].ru_utime - cpu[0].ru_stime, cpu_of(postgres_pids(server)) - cpu[1])
    finished = query(url, "SELECT count(*) FROM ceiling_jobs WHERE state = 2")[0][0]
    return report(config, "-", clients, finished, bench.count, elapsed, used, "")


def failure(error: Exception) -> str:
    """What went wrong in a case, in one line (a failed command's own words, not its arguments: they hold the
    database's password)."""
    if isinstance(error, subprocess.CalledProcessError):
        said = (error.stderr or b"").decode() if isinstance(error.stderr, bytes) else (error.stderr or "")
        return f"its {Path(str(error.cmd[1])).name} exited with {error.returncode}" + (
            f": {said.strip().splitlines()[-1]}" if said.strip() else ""
        )
    return str(error)


def report(
    config: Config,
    kind: str,
    processes: int,
    finished: int,
    count: int,
    seconds: float,
    used: tuple[float, float],
    detail: str,
) -> Result:
    partial = "" if finished == count else f", only {finished} of {count} done when it ran out of patience"
    result = Result(finished / seconds, *(1e6 * u / max(1, finished) for u in used))
    print(
        f"  {config.system:21} {config.name:12} {kind:6} x{processes}: {result.rate:8.0f} jobs/s, CPU per job "
        f"{result.workers_us:.0f} us workers + {result.postgres_us:.0f} us postgres ({detail}"
        f"drain {seconds:.2f} s{partial})",
        flush=True,
    )
    return result


# -- the tables -----------------------------------------------------------------------------------


Results = dict[tuple[str, int, str, str], Result]  # (kind, processes, system, config name)


def best(results: Results, kind: str, processes: int, system: str) -> tuple[str, Result] | None:
    """A system's best config in one case (the ceiling: whatever the kind)."""
    found = [(name, r) for (k, n, s, name), r in results.items() if s == system and n == processes and k in (kind, "-")]
    return max(found, key=lambda item: item[1].rate, default=None)


def print_comparison(results: Results, systems: list[str], kinds: list[str], processes: list[int]) -> None:
    from common import print_table

    peers = [s for s in systems if s not in (*OUR_SYSTEMS, CEILING)]
    ratios = {
        "ours / best peer": (OURS, "best peer"),
        "ours / PostgreSQL alone": (OURS, CEILING),
        "ours / before": (OURS, BEFORE),
        "through PgBouncer / direct": (THROUGH_PGBOUNCER, OURS),
    }
    ratios = {title: pair for title, pair in ratios.items() if set(pair) - {"best peer"} <= set(systems)}
    rows = []
    for kind in kinds:
        for n in processes:
            top = {s: best(results, kind, n, s) for s in systems}
            rate = {s: found[1].rate if found else math.nan for s, found in top.items()}
            rate["best peer"] = max((rate[s] for s in peers if top[s]), default=math.nan)
            cells = [
                f"{found[1].rate:.0f}" + (f" ({found[0]})" if found[0] else "") if found else "-"
                for found in top.values()
            ]
            rows.append([kind, n, *cells, *(ratio(rate[a], rate[b]) for a, b in ratios.values())])
    print_table(["jobs", "processes", *systems, *ratios], rows)


def ratio(a: float, b: float) -> str:
    return "-" if math.isnan(a) or math.isnan(b) else f"{a / b:.2f}"


def print_every_config(results: Results, configs: list[Config]) -> None:
    from common import print_table

    setting = {(c.system, c.name): c.setting for c in configs}
    print_table(
        ["system", "setting", "jobs", "processes", "jobs/s", "CPU per job, us: workers + PostgreSQL"],
        [
            [system, setting[system, name], kind, n, f"{r.rate:.0f}", f"{r.workers_us:.0f} + {r.postgres_us:.0f}"]
            for (kind, n, system, name), r in results.items()
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2,000 jobs, 1 and 2 processes")
    parser.add_argument("--jobs", type=int, help="backlog size (default 20,000; 2,000 with --quick)")
    parser.add_argument(
        "--concurrency",
        "--capacity",
        dest="concurrency",
        type=int,
        default=32,
        help="our nodes' --capacity (and the Python peers' concurrency, unless --peer-concurrency)",
    )
    parser.add_argument(
        "--peer-concurrency",
        type=numbers,
        help="comma-separated concurrencies for PgQueuer and Procrastinate (default: --concurrency)",
    )
    parser.add_argument("--kinds", default="python,async,http,batch", help="python, async, http, batch, batch-plain")
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated systems to run (default: {','.join(SYSTEMS)}; also "
        f"{THROUGH_PGBOUNCER}; Procrastinate needs the whole --patience per case)",
    )
    parser.add_argument("--processes", help="comma-separated worker process counts (default 1,2,4)")
    parser.add_argument(
        "--patience",
        type=float,
        default=120.0,
        help="seconds a system gets to drain the backlog before it is rated by what it finished",
    )
    parser.add_argument(
        "--graphile",
        type=choices("defaults", "batch"),
        default=["defaults", "batch"],
        help="Graphile Worker's modes: defaults, batch (default: both)",
    )
    parser.add_argument(
        "--pgboss",
        type=pgboss_specs,
        default=["2x8000", "4x4000"],
        help="pg-boss settings, LOOPSxBATCH_SIZE, comma-separated, or 'sweep' (batch 250 to 8000 x "
        "2 to 8 loops; default 2x8000,4x4000)",
    )
    parser.add_argument(
        "--ceiling-batches", type=numbers, default=[1, 32, 1000], help="pgbench's batch sizes (default 1,32,1000)"
    )
    parser.add_argument(
        "--before",
        metavar="REF",
        help="also run our nodes on the code of this git ref (e.g. main, 20f9f88), in the same run",
    )
    for hidden in ("--peer", "--role", "--dsn", "--kind", "--url", "--serve", "--farm"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return asyncio.run(serve(int(args.serve)))
    if args.peer:
        return asyncio.run(peer_main(args.peer, args.role, args.dsn, args.kind, args.count, args.concurrency, args.url))
    if args.farm:
        return farm_main(args.farm, args.dsn, args.kind, args.count)
    systems = [s.strip() for s in args.systems.split(",")]
    unknown = set(systems) - {*SYSTEMS, THROUGH_PGBOUNCER}
    if unknown:
        parser.error(
            f"unknown --systems {', '.join(sorted(unknown))}: choose from {', '.join(SYSTEMS)}, {THROUGH_PGBOUNCER}"
        )
    args.peer_concurrency = args.peer_concurrency or [args.concurrency]
    if args.before:
        systems.insert(systems.index(OURS) + 1 if OURS in systems else 0, BEFORE)
    run_all(args, systems)


def numbers(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated whole numbers, like 1,32,1000") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every number must be at least 1")
    return values


def choices(*allowed: str) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        chosen = [part.strip() for part in text.split(",")]
        if not set(chosen) <= set(allowed):
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(allowed)}")
        return chosen

    return parse


def pgboss_specs(text: str) -> list[str]:
    if text == "sweep":
        return list(PGBOSS_SWEEP)
    specs = [part.strip() for part in text.split(",")]
    for spec in specs:
        loops, _, batch = spec.partition("x")
        if not (loops.isdigit() and batch.isdigit() and int(loops) >= 1 and int(batch) >= 1):
            raise argparse.ArgumentTypeError(f"{spec!r}: expected LOOPSxBATCH_SIZE, like 2x8000, or 'sweep'")
    return specs


def run_all(args, systems: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import ROOT, load_average, postgres

    from tests.support.pgbouncer import PgBouncer

    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped (SIGTERM)"))  # the finally below still cleans up
    count = args.jobs or (2_000 if args.quick else 20_000)
    processes = [int(p) for p in (args.processes or ("1,2" if args.quick else "1,2,4")).split(",")]
    kinds = [k.strip() for k in args.kinds.split(",")]
    print(f"{count} jobs; ours at --capacity {args.concurrency} per process; {load_average()}", flush=True)
    port = 18000 + os.getpid() % 1000
    web = Worker([sys.executable, str(Path(__file__).resolve()), "--serve", str(port)], ROOT)
    results: Results = {}
    installed: dict[str, str | Path] = {}
    servers = ExitStack()  # the server, and the PgBouncer in front of it: stopped in the reverse order
    try:
        server = servers.enter_context(postgres())
        pgbouncer = servers.enter_context(PgBouncer(server)) if THROUGH_PGBOUNCER in systems else None
        installed.update(installed_systems(systems, server, args.before))
        bench = Bench(server, count, args.patience, f"http://127.0.0.1:{port}/", pgbouncer, installed)
        systems = [s for s in systems if s in (OURS, THROUGH_PGBOUNCER) or s in bench.installed]
        configs = [config for system in systems for config in configs_of(system, args)]
        web.wait_ready()
        for kind in kinds:
            for n in processes:
                for config in configs:
                    if not runs_kind(config.system, kind, kinds):
                        continue
                    try:
                        result = run_case(bench, config, kind, n)
                    except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as error:
                        print(
                            f"  {config.system:21} {config.name:12} {kind:6} x{n}: failed, {failure(error)}", flush=True
                        )
                        continue
                    results["-" if config.system == CEILING else kind, n, config.system, config.name] = result
    finally:
        web.stop()
        servers.close()
        if BEFORE in installed:
            shutil.rmtree(installed[BEFORE])
    print(
        f"\nthroughput, jobs per second, each peer at its best setting here ({count} jobs; ours at --capacity "
        f"{args.concurrency}; {load_average()})"
    )
    print_comparison(results, systems, kinds, processes)
    print(
        "\nevery setting; CPU per job in microseconds (what a job costs, whatever else the cores are doing; "
        "for PostgreSQL alone, pgbench's CPU stands for the workers')"
    )
    print_every_config(results, configs)
    print(json.dumps({f"{k}/{n}/{s}/{c}": [round(x) for x in r] for (k, n, s, c), r in results.items()}))


if __name__ == "__main__":
    main()
