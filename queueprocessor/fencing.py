"""The target's half of fencing: refuse a write that carries an older fence than one already seen for its job.

Every claim of a job gives it a new fence token, higher than the last (docs/design.md §3), and every run sends it:
an HTTP job in `X-QP-Fence` (with `X-QP-Job`), a command in `QP_FENCE` and `QP_JOB_ID`, a Python function as
`context.fence` and `context.job_id`. The queue stops a run whose lease it lost, but a request already sent or a
thread already running cannot be recalled: a frozen or partitioned node's write can reach the target after the
run that took its job over. Only the target can refuse it, and this module is what it needs (docs/fencing.md):

- `admit(conn, job_id, fence)`, the SQL guard: in the caller's own transaction, records the fence unless a newer
  one was seen for the job, so the write and its check commit together (the table: `create_table`, or `DDL`).
- `FenceGuard` (WSGI) and `AsgiFenceGuard` (ASGI): middleware that answers 409 to a request whose fence is stale,
  without calling the app, using a `MemoryFences` store (one process) or a `SqlFences` one (many processes).

Web apps import it, so it imports the standard library and SQLAlchemy Core only: nothing of the node.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Protocol

from sqlalchemy import BigInteger, Column, Connection, Engine, Executable, MetaData, Table, select, text
from sqlalchemy.dialects import postgresql, sqlite

__all__ = [
    "DDL",
    "AsgiFenceGuard",
    "FenceGuard",
    "FenceStore",
    "MemoryFences",
    "SqlFences",
    "admit",
    "create_table",
    "fences",
    "seen",
]

JOB_HEADER = "X-QP-Job"
FENCE_HEADER = "X-QP-Fence"
BIGINT = 2**63  # a job id or fence is a non-negative BIGINT
ASGI_HTTP = "http"  # the ASGI scope type of a request (the others: websocket, lifespan)

fences = Table(
    "qp_fences",
    MetaData(),
    Column("job_id", BigInteger, primary_key=True, autoincrement=False),
    Column("fence", BigInteger, nullable=False),
)

DDL = "CREATE TABLE qp_fences (job_id BIGINT NOT NULL PRIMARY KEY, fence BIGINT NOT NULL)"
"""The table `create_table` makes, for a target whose schema is kept by its own migrations."""

# SQL Server has no INSERT ... ON CONFLICT: a MERGE under HOLDLOCK takes the key's range lock, so two first
# admits of one job cannot both insert, and a newer fence's row lock holds an older writer until it commits.
_MSSQL_ADMIT = text(
    "MERGE qp_fences WITH (HOLDLOCK) AS seen"
    " USING (SELECT :job_id AS job_id, :fence AS fence) AS sent ON seen.job_id = sent.job_id"
    " WHEN MATCHED AND seen.fence <= sent.fence THEN UPDATE SET fence = sent.fence"
    " WHEN NOT MATCHED THEN INSERT (job_id, fence) VALUES (sent.job_id, sent.fence);"
)


def _upsert(insert: postgresql.Insert | sqlite.Insert) -> Executable:
    """PostgreSQL's and SQLite's guard: insert the job's fence, or raise it if it is not lower than the one seen."""
    return insert.on_conflict_do_update(
        index_elements=[fences.c.job_id],
        set_={"fence": insert.excluded.fence},
        where=fences.c.fence <= insert.excluded.fence,
    )


# Made once: building an upsert per call cost as much as running it.
_ADMIT = {
    "postgresql": _upsert(postgresql.insert(fences)),
    "sqlite": _upsert(sqlite.insert(fences)),
    "mssql": _MSSQL_ADMIT,
}
_COUNTED = {"preserve_rowcount": True}  # SQLAlchemy keeps an INSERT's or a MERGE's row count only when asked


def create_table(bind: Engine | Connection) -> None:
    """Make `qp_fences` in the target's own database, unless it is there (the same table as `DDL`)."""
    fences.create(bind, checkfirst=True)


def admit(conn: Connection, job_id: int, fence: int) -> bool:
    """Record `fence` for `job_id` and say True, unless a newer fence was already seen for that job: then False, and
    nothing changes. One statement, run in `conn`'s transaction: call it in the transaction of the write it
    guards, and roll that back when it says False. The fence is then recorded only if the write commits, and a
    newer fence's uncommitted row holds an older writer until it commits (then refuses it), so no older write
    can land after a newer one. An equal fence is admitted: one run may write many times.

    At PostgreSQL's default isolation (READ COMMITTED) the older writer waits and gets False; under REPEATABLE
    READ or SERIALIZABLE it gets a serialization error instead, and its retry gets False."""
    statement = _ADMIT.get(conn.dialect.name)
    if statement is None:
        raise NotImplementedError(
            f"admit() runs on PostgreSQL, SQLite and SQL Server, not {conn.dialect.name}: guard the write itself with "
            "UPDATE ... SET fence = :fence WHERE id = :id AND fence <= :fence and check its row count "
            "(docs/fencing.md)"
        )
    return conn.execute(statement, {"job_id": job_id, "fence": fence}, execution_options=_COUNTED).rowcount == 1


def seen(conn: Connection, job_id: int) -> int | None:
    """The highest fence admitted for `job_id`, or None if none was."""
    return conn.execute(select(fences.c.fence).where(fences.c.job_id == job_id)).scalar_one_or_none()


class FenceStore(Protocol):
    """Where a middleware keeps the highest fence seen per job. `blocking`: its calls wait on I/O, so an ASGI
    server runs them in a worker thread rather than on its event loop."""

    blocking: bool

    def admit(self, job_id: int, fence: int) -> bool:
        """Record `fence` unless a newer one was seen for `job_id` (then False)."""
        ...

    def seen(self, job_id: int) -> int | None:
        """The highest fence admitted for `job_id`, or None."""
        ...


class MemoryFences:
    """The fences one process has seen, in memory: for a service that runs as one process. It remembers the
    `keep` jobs admitted most recently; a stale request for a job it has forgotten is admitted."""

    blocking = False

    def __init__(self, keep: int = 100_000) -> None:
        self.keep = keep
        self._fences: OrderedDict[int, int] = OrderedDict()
        self._lock = threading.Lock()

    def admit(self, job_id: int, fence: int) -> bool:
        with self._lock:
            if fence < self._fences.get(job_id, fence):
                return False
            self._fences[job_id] = fence
            self._fences.move_to_end(job_id)
            if len(self._fences) > self.keep:
                self._fences.popitem(last=False)
            return True

    def seen(self, job_id: int) -> int | None:
        with self._lock:
            return self._fences.get(job_id)


class SqlFences:
    """The fences seen by every process of a service, in `qp_fences` of its database (`create_table` first), each
    admit in a transaction of its own. A middleware's check is done when the request starts: a write made later
    by that request can still follow a newer fence's, unless the app calls `admit` in the write's own
    transaction too (docs/fencing.md)."""

    blocking = True

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def admit(self, job_id: int, fence: int) -> bool:
        with self.engine.begin() as conn:
            return admit(conn, job_id, fence)

    def seen(self, job_id: int) -> int | None:
        with self.engine.connect() as conn:
            return seen(conn, job_id)


class _Malformed(ValueError):
    """A fence header that makes no sense, with what is wrong with it."""


def _number(header: str, raw: str) -> int:
    """A header's value as a job id or fence (else _Malformed)."""
    value = raw.strip()
    if value.isascii() and value.isdigit() and int(value) < BIGINT:
        return int(value)
    raise _Malformed(f"{header} must be a whole number from 0 to {BIGINT - 1}, not {raw[:40]!r}")


def verdict(store: FenceStore, job_raw: str | None, fence_raw: str | None) -> tuple[int, str] | None:
    """None to let a request through (it has no fence headers, or its fence is admitted), else the status and the
    one-line reason to answer: 400 for headers that make no sense, 409 for a stale fence."""
    if job_raw is None and fence_raw is None:
        return None
    if job_raw is None or fence_raw is None:
        given, missing = (FENCE_HEADER, JOB_HEADER) if job_raw is None else (JOB_HEADER, FENCE_HEADER)
        return 400, f"{given} without {missing}: a fenced request sends both"
    try:
        job_id, fence = _number(JOB_HEADER, job_raw), _number(FENCE_HEADER, fence_raw)
    except _Malformed as error:
        return 400, str(error)
    if store.admit(job_id, fence):
        return None
    return 409, f"stale fence {fence} for job {job_id}: fence {store.seen(job_id)} already seen"


_REASONS = {400: "Bad Request", 409: "Conflict"}


def _body(reason: str) -> bytes:
    return (reason + "\n").encode()


WsgiStartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], WsgiStartResponse], Iterable[bytes]]


class FenceGuard:
    """WSGI middleware: a request carrying X-QP-Job and X-QP-Fence reaches `app` only if `store` admits its fence;
    a stale one gets 409 Conflict ("stale fence 1 for job 7: fence 2 already seen") and malformed ones 400, each
    with a one-line text body. A request without them passes untouched.

    The check is made when the request starts. A long request whose job is taken over meanwhile may still write
    after the newer run did: an app whose writes must never be overtaken calls `admit` in the transaction of
    each write (docs/fencing.md shows it). `store` defaults to a `MemoryFences`, right for one process only."""

    def __init__(self, app: WsgiApp, store: FenceStore | None = None) -> None:
        self.app = app
        self.store: FenceStore = MemoryFences() if store is None else store

    def __call__(self, environ: dict[str, Any], start_response: WsgiStartResponse) -> Iterable[bytes]:
        refused = verdict(self.store, environ.get("HTTP_X_QP_JOB"), environ.get("HTTP_X_QP_FENCE"))
        if refused is None:
            return self.app(environ, start_response)
        status, reason = refused
        body = _body(reason)
        start_response(
            f"{status} {_REASONS[status]}",
            [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
        )
        return [body]


AsgiMessage = MutableMapping[str, Any]
AsgiReceive = Callable[[], Awaitable[AsgiMessage]]
AsgiSend = Callable[[AsgiMessage], Awaitable[None]]
AsgiApp = Callable[[AsgiMessage, AsgiReceive, AsgiSend], Awaitable[None]]


class AsgiFenceGuard:
    """ASGI middleware with FenceGuard's rules (and its limit: the check is made when the request starts). A
    blocking store (`SqlFences`) is asked from a worker thread, so the event loop never waits on the database."""

    def __init__(self, app: AsgiApp, store: FenceStore | None = None) -> None:
        self.app = app
        self.store: FenceStore = MemoryFences() if store is None else store

    async def __call__(self, scope: AsgiMessage, receive: AsgiReceive, send: AsgiSend) -> None:
        if scope["type"] != ASGI_HTTP:
            await self.app(scope, receive, send)
            return
        found: dict[bytes, list[bytes]] = {}
        for name, value in scope.get("headers", ()):
            name = name.lower()
            if name in (b"x-qp-job", b"x-qp-fence"):
                found.setdefault(name, []).append(value)
        if not found:
            await self.app(scope, receive, send)
            return
        # A repeated header is joined with a comma as WSGI servers join it, so it is malformed there as here.
        job, fence = (
            b",".join(found[n]).decode("latin-1") if n in found else None for n in (b"x-qp-job", b"x-qp-fence")
        )
        if self.store.blocking:
            refused = await asyncio.to_thread(verdict, self.store, job, fence)
        else:
            refused = verdict(self.store, job, fence)
        if refused is None:
            await self.app(scope, receive, send)
            return
        status, reason = refused
        body = _body(reason)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
