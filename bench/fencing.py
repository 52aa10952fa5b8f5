"""Fencing at the target: what queueprocessor.fencing costs a service (docs/fencing.md).

Two measures, side by side in one run:

- The middleware: requests a second of a trivial WSGI app ("ok"), served in-process by a threaded wsgiref server and
  asked by one client over HTTP (wsgiref speaks HTTP/1.0: a connection a request), with and without FenceGuard and
  its in-memory store; and the same app called directly, without a server, which shows the guard's own cost per
  request. Every request carries X-QP-Job and X-QP-Fence (a new job each time, so each is admitted and recorded).
  The cases alternate in rounds, so a change of the machine's load falls on both; the best round of each is shown.
- The SQL guard: admit() calls a second, each in a transaction of its own (as a write would carry it), on a SQLite
  file and on a throwaway PostgreSQL server: admit of a new job (its insert), admit of the same job again (its
  update), against a plain INSERT into a table of the same shape, key included.

    python bench/fencing.py            # 5 rounds
    python bench/fencing.py --quick    # 2 rounds, fewer calls
"""

import argparse
import http.client
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import fresh_database, postgres, print_table  # noqa: E402
from sqlalchemy import BigInteger, Column, MetaData, Table, create_engine, insert  # noqa: E402

from queueprocessor.fencing import FenceGuard, admit, create_table  # noqa: E402
from tests.support.logtarget import WsgiServer  # noqa: E402

plain = Table(
    "plain_writes",
    MetaData(),
    Column("job_id", BigInteger, nullable=False),
    Column("fence", BigInteger, nullable=False),
)


def ok(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "3")])
    return [b"ok\n"]


def served(app, requests: int, first_job: int) -> float:
    """Requests a second of `app` behind a real server, each with fence headers for a job of its own."""
    with WsgiServer(app) as server:
        port = int(server.base_url.rsplit(":", 1)[1].strip("/"))
        started = time.perf_counter()
        for job in range(first_job, first_job + requests):
            conn = http.client.HTTPConnection("127.0.0.1", port)
            conn.request("POST", "/", headers={"X-QP-Job": str(job), "X-QP-Fence": "1"})
            answer = conn.getresponse()
            assert answer.status == 200 and answer.read() == b"ok\n"
            conn.close()
        return requests / (time.perf_counter() - started)


def called(app, calls: int, first_job: int) -> float:
    """Calls a second of `app` as a WSGI server calls it, with no server."""
    start_response = lambda status, headers: None  # noqa: E731
    started = time.perf_counter()
    for job in range(first_job, first_job + calls):
        environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/", "HTTP_X_QP_JOB": str(job), "HTTP_X_QP_FENCE": "1"}
        b"".join(app(environ, start_response))
    return calls / (time.perf_counter() - started)


def middleware(rounds: int, requests: int, calls: int) -> list[list[str]]:
    best: dict[str, float] = {}
    job = 1
    for n in range(rounds):
        cases = [("plain", ok), ("FenceGuard", FenceGuard(ok))]
        for name, app in cases if n % 2 == 0 else cases[::-1]:
            for how, measure, count in (("served", served, requests), ("called", called, calls)):
                rate = measure(app, count, job)
                job += count
                best[f"{how} {name}"] = max(best.get(f"{how} {name}", 0.0), rate)
    rows = []
    for how in ("served", "called"):
        bare, guarded = best[f"{how} plain"], best[f"{how} FenceGuard"]
        extra_us = (1 / guarded - 1 / bare) * 1e6
        rows.append([how, f"{bare:,.0f}", f"{guarded:,.0f}", f"{guarded / bare:.0%}", f"{extra_us:+.1f}"])
    return rows


def timed(engine, calls: int, write) -> float:
    """Calls a second of `write(conn, i)`, each in a transaction of its own."""
    started = time.perf_counter()
    for i in range(calls):
        with engine.begin() as conn:
            write(conn, i)
    return calls / (time.perf_counter() - started)


def sql_guard(name: str, url: str, rounds: int, calls: int) -> list[str]:
    engine = create_engine(url)
    write = insert(plain)  # made once, as admit()'s statement is
    try:
        create_table(engine)
        plain.create(engine)
        best = {"new": 0.0, "same": 0.0, "insert": 0.0}
        base = 0
        for _ in range(rounds):
            best["new"] = max(best["new"], timed(engine, calls, lambda conn, i: admit(conn, base + i, 1)))
            best["same"] = max(best["same"], timed(engine, calls, lambda conn, i: admit(conn, 0, base + i + 1)))
            best["insert"] = max(
                best["insert"],
                timed(engine, calls, lambda conn, i: conn.execute(write, {"job_id": base + i, "fence": 1})),
            )
            base += calls
    finally:
        engine.dispose()
    return [name, f"{best['insert']:,.0f}", f"{best['new']:,.0f}", f"{best['same']:,.0f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds and fewer calls")
    args = parser.parse_args()
    rounds = 2 if args.quick else 5
    requests, calls, writes = (500, 20_000, 300) if args.quick else (2_000, 100_000, 1_000)

    print(f"The middleware: a trivial WSGI app, best of {rounds} rounds ({requests} served requests, {calls} calls)")
    print_table(["how", "plain req/s", "FenceGuard req/s", "ratio", "µs added"], middleware(rounds, requests, calls))

    print(f"\nThe SQL guard: statements a second, each in its own transaction, best of {rounds} rounds of {writes}")
    with postgres() as server, tempfile.TemporaryDirectory() as folder:  # a target's tables, not a farm's
        rows = [
            sql_guard("SQLite (file)", f"sqlite:///{Path(folder) / 'target.db'}", rounds, writes),
            sql_guard("PostgreSQL", fresh_database(server, "fencing"), rounds, writes),
        ]
    print_table(["database", "plain INSERT/s", "admit() new job/s", "admit() same job/s"], rows)


if __name__ == "__main__":
    main()
