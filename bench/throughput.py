"""Throughput: how fast 1, 2 and 4 worker processes drain a backlog, beside PgQueuer and Procrastinate.

Each system gets a fresh database on the same throwaway PostgreSQL server,
the same number of worker processes with the same concurrency each (our node
--capacity, PgQueuer's max_concurrent_tasks, Procrastinate's concurrency),
all started and idle before a backlog of N jobs is enqueued in one go. The
clock runs from the enqueue's commit until the orchestrator, polling every
50 ms, sees the queue empty (a system still at it after --patience seconds,
default 120, is rated by the jobs it finished by then). The CPU time the
workers and PostgreSQL spent, per job, is printed too. Three kinds of job:

- python: a plain no-op function, run in a worker thread, as each system runs
  one: our node calls it in its thread pool; PgQueuer (whose entrypoints must
  be `async def`) through `asyncio.to_thread`, its documented way; Procrastinate
  runs a plain task in a thread itself.
- async: an `async def` no-op on each system's event loop.
- http: a GET of a real local web server (a small asyncio HTTP/1.1 server in
  its own process, keep-alive): ours is the node's HTTP executor; the peers'
  tasks use the same client the same way (one aiohttp session, no connection
  cap, no cookies), and read the answer as it does.

PgQueuer and Procrastinate are installed from PyPI into the benchmark's own
virtualenv (~/.cache/queueprocessor-bench/peers), never into the project.
The target: at least as fast as the faster of the two.

    python bench/throughput.py            # 20,000 jobs; 1, 2, 4 processes; python, async and http
    python bench/throughput.py --quick    # 2,000 jobs; 1 and 2 processes

`--systems queueprocessor,queueprocessor-pgbouncer` runs our nodes directly
and through a PgBouncer in transaction pooling mode (tests.support.pgbouncer,
pool of 20) in front of the same server, side by side (issue 11: within 20 %).
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PEERS_VENV = Path.home() / ".cache" / "queueprocessor-bench" / "peers"
PEER_PACKAGES = ("pgqueuer==1.6.0", "asyncpg>=0.29", "procrastinate==3.10.0", "psycopg[binary]>=3.2", "aiohttp>=3.9")
SYSTEMS = ("queueprocessor", "pgqueuer", "procrastinate")
THROUGH_PGBOUNCER = "queueprocessor-pgbouncer"  # our nodes reach the server through PgBouncer (not a default)


# -- the peers, run inside their own virtualenv --------------------------------------------------


async def peer_main(system: str, role: str, dsn: str, kind: str, count: int, concurrency: int, url: str) -> None:
    import logging
    from datetime import timedelta

    import aiohttp

    logging.getLogger("procrastinate").setLevel(logging.ERROR)  # its advice on where to create the App
    # The session our HTTP executor makes (queueprocessor/executors/http.py), so every system's HTTP job is the
    # same client work.
    session = (aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), cookie_jar=aiohttp.DummyCookieJar())
               if role == "worker" and kind == "http" else None)

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
        await pgq.run(batch_size=max(1, concurrency // 2), max_concurrent_tasks=concurrency,
                      dequeue_timeout=timedelta(seconds=1))
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
            await app.run_worker_async(concurrency=concurrency, wait=True, listen_notify=True,
                                       fetch_job_polling_interval=1.0, install_signal_handlers=False)


# -- the web server the HTTP jobs call ------------------------------------------------------------


async def serve(port: int) -> None:
    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
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


# -- the orchestra --------------------------------------------------------------------------------


def peers_python() -> str:
    """The virtualenv with PgQueuer and Procrastinate, made on first use and whenever PEER_PACKAGES changes."""
    python, installed = PEERS_VENV / "bin" / "python", PEERS_VENV / "installed.txt"
    if not installed.exists() or installed.read_text() != "\n".join(PEER_PACKAGES):
        print(f"installing {', '.join(PEER_PACKAGES)} into {PEERS_VENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PEER_PACKAGES], check=True)
        installed.write_text("\n".join(PEER_PACKAGES))
    return str(python)


class Worker:
    """A worker process that says 'ready' on stdout once it is listening."""

    def __init__(self, command: list[str], cwd: Path):
        self.process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        text=True, env=dict(os.environ, PYTHONPATH=str(cwd)))

    def wait_ready(self) -> None:
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{self.process.args[:4]} did not start (exit {self.process.poll()})")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.process.stdout.close()


def cpu_of(pids: list[int]) -> float:
    """CPU seconds used so far by these processes and the children they have reaped (PostgreSQL's backends)."""
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def postgres_pids(server) -> list[int]:
    children = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True).stdout.split()
    return [server.pid, *map(int, children)]


def run_case(system: str, kind: str, processes: int, count: int, concurrency: int, server, web_url: str,
             peers: str, patience: float, pgbouncer=None) -> tuple[float, float, float]:
    """Drain `count` jobs with `processes` workers: jobs per second, and CPU per job (microseconds) of the
    workers and of PostgreSQL. A system that has not drained the backlog after `patience` seconds is rated by
    what it finished by then. THROUGH_PGBOUNCER's nodes reach the server through `pgbouncer`."""
    from common import NodeProcess, ROOT, fresh_database, query, stop_all, wait_for
    from sqlalchemy import text

    from queueprocessor.database import open_engine
    from queueprocessor.farm import Farm

    url = fresh_database(server, f"tp_{system}")
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    peer = [peers, str(Path(__file__).resolve()), "--peer", system, "--dsn", dsn, "--kind", kind, "--count",
            str(count), "--concurrency", str(concurrency), "--url", web_url]
    if system.startswith("queueprocessor"):
        farm = Farm(url)
        farm.settings()
        nodes_url = pgbouncer.url_for(url) if system == THROUGH_PGBOUNCER else url
        workers = [NodeProcess(nodes_url, f"node-{i}", http_base=web_url, extra=(
            "--capacity", str(concurrency), "--allow-module", "bench.jobs")) for i in range(processes)]
        wait_for(lambda: len(farm.status()["machines"]) == processes, 60, "nodes to join")
        time.sleep(2.5)  # the join delay: every node takes turns
        pids = [worker.pid for worker in workers]
        cpu = (cpu_of(pids), cpu_of(postgres_pids(server)))
        started = time.monotonic()
        if kind == "http":
            farm.enqueue_http("/", count=count)
        else:
            farm.enqueue_python("bench.jobs:noop" if kind == "python" else "bench.jobs:noop_async", count=count)
        enqueued = time.monotonic()
        left = "SELECT count(*) FROM qp_jobs WHERE state IN ('queued', 'running')"
    else:
        subprocess.run([*peer, "--role", "install"], check=True, cwd=ROOT)
        workers = [Worker([*peer, "--role", "worker"], ROOT) for _ in range(processes)]
        for worker in workers:
            worker.wait_ready()
        time.sleep(1.0)  # listening
        pids = [worker.process.pid for worker in workers]
        cpu = (cpu_of(pids), cpu_of(postgres_pids(server)))
        started = time.monotonic()
        # The enqueue's own process tells when it committed: the workers start then, not once it has exited.
        enqueued = float(subprocess.run([*peer, "--role", "enqueue"], check=True, cwd=ROOT, capture_output=True,
                                        text=True).stdout.split()[-1])
        left = ("SELECT count(*) FROM pgqueuer" if system == "pgqueuer" else
                "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')")
    watcher = open_engine(url, pool_size=1)
    with watcher.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:  # one cheap query per poll
        empty = text(f"SELECT NOT EXISTS ({left.replace('count(*)', '1')})")
        while not conn.execute(empty).scalar() and time.monotonic() - enqueued < patience:
            time.sleep(0.05)  # a no-op backlog drains in 1-2 s: 100 ms would blur it, 20 ms load the server
        done = time.monotonic()
        finished = count - conn.execute(text(left)).scalar()
        used = cpu_of(pids) - cpu[0], cpu_of(postgres_pids(server)) - cpu[1]
    watcher.dispose()
    failed = {
        "queueprocessor": "SELECT count(*) FROM qp_jobs WHERE state IN ('failed', 'cancelled')",
        THROUGH_PGBOUNCER: "SELECT count(*) FROM qp_jobs WHERE state IN ('failed', 'cancelled')",
        "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('failed', 'aborted', 'cancelled')",
        "pgqueuer": "SELECT count(*) FROM pgqueuer_log WHERE status IN ('exception', 'canceled')",
    }[system]
    if query(url, failed)[0][0]:
        raise RuntimeError(f"{system}: {query(url, failed)[0][0]} jobs did not succeed")
    if system.startswith("queueprocessor"):
        stop_all(workers)
        farm.close()
    else:
        for worker in workers:
            worker.stop()
    # Gone before the next case starts: its 20,000 dead rows would have autovacuum working during that case.
    query(server.url, f'DROP DATABASE "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
    partial = "" if finished == count else f", only {finished} of {count} done when it ran out of patience"
    per_job = [1e6 * u / max(1, finished) for u in used]
    print(f"  {system:15} {kind:6} x{processes}: {finished / (done - enqueued):8.0f} jobs/s, CPU per job "
          f"{per_job[0]:.0f} us workers + {per_job[1]:.0f} us postgres (enqueue {enqueued - started:.1f} s, "
          f"drain {done - enqueued:.2f} s{partial})", flush=True)
    return finished / (done - enqueued), per_job[0], per_job[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2,000 jobs, 1 and 2 processes")
    parser.add_argument("--jobs", type=int, help="backlog size (default 20,000; 2,000 with --quick)")
    parser.add_argument("--concurrency", type=int, default=32, help="jobs each worker process runs at once")
    parser.add_argument("--kinds", default="python,async,http")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help="comma-separated systems to run (default: all three; Procrastinate needs the whole "
                             "--patience per case)")
    parser.add_argument("--processes", help="comma-separated worker process counts (default 1,2,4)")
    parser.add_argument("--patience", type=float, default=120.0,
                        help="seconds a system gets to drain the backlog before it is rated by what it finished")
    for hidden in ("--peer", "--role", "--dsn", "--kind", "--url", "--serve"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return asyncio.run(serve(int(args.serve)))
    if args.peer:
        return asyncio.run(peer_main(args.peer, args.role, args.dsn, args.kind, args.count, args.concurrency,
                                     args.url))

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import ROOT, load_average, print_table, start_postgres

    from tests.support.pgbouncer import PgBouncer

    count = args.jobs or (2_000 if args.quick else 20_000)
    processes = [int(p) for p in (args.processes or ("1,2" if args.quick else "1,2,4")).split(",")]
    kinds = args.kinds.split(",")
    peers = peers_python()
    print(f"{count} jobs, concurrency {args.concurrency} per process; {load_average()}", flush=True)
    server = start_postgres()
    pgbouncer = PgBouncer(server).start() if THROUGH_PGBOUNCER in args.systems.split(",") else None
    port = 18000 + os.getpid() % 1000
    web = Worker([sys.executable, str(Path(__file__).resolve()), "--serve", str(port)], ROOT)
    results: dict[tuple[str, int, str], tuple[float, float, float]] = {}
    try:
        web.wait_ready()
        for kind in kinds:
            for n in processes:
                for system in args.systems.split(","):
                    results[kind, n, system] = run_case(system, kind, n, count, args.concurrency, server,
                                                        f"http://127.0.0.1:{port}/", peers, args.patience, pgbouncer)
    finally:
        web.stop()
        if pgbouncer is not None:
            pgbouncer.stop()
        server.stop()
    print(f"\nthroughput, jobs per second ({count} jobs, concurrency {args.concurrency} per process; "
          f"{load_average()})")
    systems = args.systems.split(",")
    rows = []
    for kind in kinds:
        for n in processes:
            rate = {s: results[kind, n, s][0] for s in systems}
            best_peer = max((v for s, v in rate.items() if not s.startswith("queueprocessor")), default=float("nan"))
            nan = float("nan")
            rows.append([kind, n, *(f"{rate[s]:.0f}" for s in systems),
                         f"{rate.get('queueprocessor', nan) / best_peer:.2f}",
                         f"{rate.get(THROUGH_PGBOUNCER, nan) / rate.get('queueprocessor', nan):.2f}"])
    print_table(["jobs", "processes", *systems, "ours / best peer", "through PgBouncer / direct"], rows)
    print("\nCPU per job, microseconds: workers + PostgreSQL (what a job costs, whatever else the cores are doing)")
    rows = [[kind, n, *(f"{results[kind, n, s][1]:.0f} + {results[kind, n, s][2]:.0f}" for s in systems)]
            for kind in kinds for n in processes]
    print_table(["jobs", "processes", *systems], rows)
    print(json.dumps({f"{k}/{n}/{s}": [round(x) for x in v] for (k, n, s), v in results.items()}))


if __name__ == "__main__":
    main()
