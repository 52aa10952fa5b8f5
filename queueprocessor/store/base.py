"""What every store shares: the engine and what its dialect allows, the runners of statements (a statement on its
own, or a hot one straight to the driver), and the database's clock.

The rules the stores rely on (docs/design.md §3):
- Times are written by the database (`db_now()`), never by a machine.
- A job is claimed by one atomic UPDATE that only matches claimable rows:
  queued and due, or running with a lease that ran out. The claim bumps the
  job's fence token.
- Renewals and completions match `owner = :me AND fence = :token`; when they
  match nothing the caller lost the job to another machine (LostLease).
"""

import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import exc, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql import Select

from ..rules.clock import Sample
from .dbtime import db_now
from .sql.claim import ClaimShape

CLOCK = select(db_now())  # built once: Raw compiles each statement it is given once
KEEP = 5.0  # seconds a node without jobs keeps the connection for their results after its last use (see Held)

Params = dict[str, Any]


class Raw:
    """Hot statements straight to the driver, each compiled once: SQLAlchemy's execution and row layers cost a
    busy node a fifth of its interpreter time, for statements whose columns need no conversion. Rows come back
    as plain tuples; driver errors are raised as SQLAlchemy's, as any other statement's are, and a connection
    the server dropped is invalidated, so the pool connects again."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._compiled: dict[Any, Any] = {}  # statement -> its SQL for the driver (the hot statements are built once)

    def run(self, conn: Connection, statement: Any, params: Params) -> list[tuple[Any, ...]]:
        compiled = self._compiled.get(statement)
        if compiled is None:
            compiled = self._compiled[statement] = statement.compile(dialect=self.engine.dialect)
        dbapi_connection: Any = conn.connection.dbapi_connection
        dbapi: Any = self.engine.dialect.loaded_dbapi
        try:
            with dbapi_connection.cursor() as cursor:  # autocommit: one round trip
                cursor.execute(compiled.string, compiled.construct_params(params))
                rows: list[tuple[Any, ...]] = cursor.fetchall()
                return rows
        except dbapi.Error as error:
            if self.engine.dialect.is_disconnect(error, dbapi_connection, None):
                conn.invalidate()
            raise exc.DBAPIError.instance(
                compiled.string, params, error, dbapi.Error, hide_parameters=True, dialect=self.engine.dialect
            ) from None


class Held:
    """A pooled connection that the runner's result writer keeps between its statements (no checkout per batch,
    and psycopg's prepared statements stay on it), also over the short idle spells of a node whose jobs come in
    bursts: given back to the pool beside the one it keeps, it would be closed, and the next busy moment would
    open one again (connection set-up, and statements planned afresh, on the hot path at every flip). Unused for
    KEEP seconds it is given back (`rest`, see StoreBase.idle), so that an idle node holds one connection for
    statements. A call made while another is under way takes its own from the pool instead of waiting."""

    def __init__(self, engine: Engine, raw: Raw):
        self.engine = engine
        self.raw = raw
        self.conn: Connection | None = None
        self.used = 0.0  # time.monotonic() of its last statement
        self.lock = threading.Lock()

    def run(self, statement: Any, params: Params) -> list[tuple[Any, ...]]:
        if not self.lock.acquire(blocking=False):
            with self.engine.connect() as conn:
                return self.raw.run(conn, statement, params)
        try:
            if self.conn is None:
                self.conn = self.engine.connect()
            self.used = time.monotonic()
            try:
                return self.raw.run(self.conn, statement, params)
            except BaseException:
                self._give_back()
                raise
        finally:
            self.lock.release()

    def rest(self) -> None:
        """Give the connection back if no statement used it for KEEP seconds (and none is using it now)."""
        if not self.lock.acquire(blocking=False):
            return
        try:
            if time.monotonic() - self.used >= KEEP:
                self._give_back()
        finally:
            self.lock.release()

    def release(self) -> None:
        with self.lock:
            self._give_back()

    def _give_back(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            _close_quietly(conn)


def _close_quietly(conn: Connection) -> None:
    try:
        conn.close()
    except Exception:  # the connection is already gone: nothing left to give back
        pass


class StoreBase:
    """The farm's database as every store reaches it. Thread-safe: each call checks out its own connection.

    What the dialect allows is decided here, once, so that no store asks for a dialect by name: `whole`
    (PostgreSQL) runs the hot statements straight to the driver (Raw) and does in one statement, with
    data-modifying CTEs and arrays, what elsewhere takes a transaction of several; `tsql` (SQL Server) says TOP
    only for a plain number and allows no sub-select in OUTPUT."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.dialect = engine.dialect.name
        self.whole = self.dialect == "postgresql"
        self.tsql = self.dialect == "mssql"
        # Who changes the farm through this store, as the event log names operators (the Farm sets its label).
        self.actor = f"{socket.gethostname()} pid {os.getpid()}"
        # Single statements run in autocommit (one round trip each); SQLite
        # keeps its explicit BEGIN IMMEDIATE so writers queue instead of failing.
        self._auto = engine if self.dialect == "sqlite" else engine.execution_options(isolation_level="AUTOCOMMIT")
        self._read = self._auto.execution_options(read_only=True)
        if self.whole:  # the statements a busy node runs thousands of times a minute
            self._raw = Raw(self._auto)
            self._results = Held(self._auto, self._raw)

    def claim_shape(self, limit: int, **shape: Any) -> ClaimShape:
        """The claim statement's shape for this dialect (see sql.claim.ClaimShape): on SQL Server the limit is
        part of it."""
        return ClaimShape(self.dialect, top=limit if self.tsql else None, **shape)

    def idle(self) -> None:
        """This node holds no jobs (its heartbeat says so at every beat): give back the connection kept for their
        results once no result was written for KEEP seconds (see Held). A node working off a backlog, which holds
        no job for a moment between two claims, or fed bursts of jobs a moment apart, keeps it. (Given back at
        once, a drain of 100,000 jobs opened 150 connections, each a new server process that parsed and planned
        the node's statements afresh: a third of the database's CPU per job.)"""
        if self.whole:
            self._results.rest()

    def give_back(self) -> None:
        """The farm is closing: give back the connection kept for results now."""
        if self.whole:
            self._results.release()

    def hot(self, statement: Any, params: Params) -> list[tuple[Any, ...]]:
        """A statement built once (a claim, a check-in), straight to the driver on a pooled connection (see
        Raw)."""
        with self._auto.connect() as conn:
            return self._raw.run(conn, statement, params)

    def held(self, statement: Any, params: Params) -> list[tuple[Any, ...]]:
        """A hot statement on the connection kept for the runner's results (see Held)."""
        return self._results.run(statement, params)

    def rows(self, statement: Any, params: Any = None) -> list[Any]:
        """Run one statement on its own (a read on the read-only engine) and return its rows: a SELECT's,
        or what a write RETURNs."""
        with (self._read if isinstance(statement, Select) else self._auto).connect() as conn:
            rows = list(conn.execute(statement, params).all())
            conn.commit()
            return rows

    def count(self, statement: Any, params: Any = None) -> int:
        """Run one write on its own and return how many rows it matched."""
        with self._auto.connect() as conn:
            count: int = conn.execute(statement, params).rowcount
            conn.commit()
            return count

    def ask_time(self) -> float:
        """The database's clock, one short round trip."""
        now: float = self.rows(CLOCK)[0][0]
        return now

    def timed(
        self, statement: Any, stamp: Callable[[], float], params: Params | None = None
    ) -> tuple[Sample, list[Any]]:
        """Run a read built once whose first column is db_now(), reading `stamp()` just around the statement,
        after the connection is checked out: a clock sample times one round trip. On PostgreSQL
        it goes straight to the driver (see Raw), its rows plain tuples."""
        with self._read.connect() as conn:
            t0 = stamp()
            rows: list[Any]
            if self.whole:
                rows = self._raw.run(conn, statement, params or {})
            else:
                rows = list(conn.execute(statement, params).all())
            t1 = stamp()
            conn.commit()
        return Sample(t0, t1, rows[0][0]), rows

    def sample_clock(self, stamp: Callable[[], float]) -> Sample:
        """One sample of the database's clock against the local monotonic clock `stamp`."""
        return self.timed(CLOCK, stamp)[0]
