"""What a PostgreSQL connection is told when it opens, directly or through a pooler (docs/pgbouncer.md).

A pooler in transaction mode (PgBouncer) hands each transaction to whichever
server connection is free, so nothing may live in a session: a SET would stay
behind on a server connection another client gets next, and PgBouncer 1.18
keeps no prepared statement past the transaction that made it. Every statement
of the farm stands on its own; only these per-connection extras depend on the
path, and they are chosen here, once per connection, when it opens:

- through a pooler: psycopg's automatic prepared statements are turned off
  (prepare_threshold None), and no session setting is made;
- directly: the planner hint below, and for a read-only farm (the app's
  watch-only mode) the server's own refusal of writes.

A pooler is recognised, not configured: it answers the connection itself, so
the process id it gives the client for cancelling (BackendKeyData) is its own
invention, never the server process that runs the client's statements.

A connection taken from the pool is checked without a round trip:
an idle connection hears from the server only when it is being closed (a
restart, a failover, pg_terminate_backend, a pooler going down), so one whose
socket has anything to read, or that psycopg knows is broken, is discarded and
a new one opened. A ping per checkout (SQLAlchemy's pool_pre_ping) cost every
statement a second round trip: a node's turn, the one statement whose timing
the farm's turns depend on, waited for the server twice.
"""

import select
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.engine import Engine

# A backlog enqueued in one go is missing from the table's statistics until autovacuum analyses it (a minute
# later at best): planned on them, the claim read and sorted the whole backlog on every call (15 ms at 18,000
# queued jobs instead of 0.85) and the finish looked its jobs up by bitmap. A node's statements only ever want
# their index paths, so its direct connections are told not to plan bitmap scans. Through a pooler they cannot
# be: give the pooler's connect_query (PgBouncer) the same setting instead (docs/pgbouncer.md).
#
# plan_cache_mode is left to the server on purpose. Forced to plan a prepared statement once for every value,
# the claim is costed for an unknown LIMIT (the planner assumes a tenth of the queue): at 80,000 queued jobs
# with fresh statistics that passed jit_above_cost, and every claim was JIT-compiled, 70-80 ms a claim
# instead of 0.8. Left to choose, the server keeps a statement's one plan only while it costs no more than a
# plan for the values at hand, and plans for the values otherwise (so a statement must not make its kept plan
# look dearer than it is: see sql.gates.held_queues).
#
# Nor is JIT compilation ever worth it for them: planned on fresh statistics, a backlog claim of 2,000 jobs (a node
# of capacity 4,000 claims half of it at a time) costs past jit_above_cost, and compiling it took 38 ms of a 58 ms
# claim, 20-44 us a job where a claim of 1,000, under the threshold, took 8-9 (bench/claim_cost.py --batch 2000).
PLANNER_HINT = "SET enable_bitmapscan = off"
NO_JIT = "SET jit = off"
READ_ONLY = "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"


def prepare(engine: Engine, read_only: bool) -> None:
    """Set up each new connection of `engine` (PostgreSQL) for the path it takes to the server."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: object) -> None:
        if reaches_pooler(dbapi_connection):
            dbapi_connection.prepare_threshold = None
            return
        with dbapi_connection.cursor() as cursor:
            cursor.execute(PLANNER_HINT)
            cursor.execute(NO_JIT)
            if read_only:
                cursor.execute(READ_ONLY)
        dbapi_connection.commit()  # a SET inside a transaction that is rolled back would be undone

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, _record: object, _proxy: object) -> None:
        if closing(dbapi_connection):
            raise exc.DisconnectionError("the server closed this connection")  # the pool opens a new one


def closing(dbapi_connection: Any) -> bool:
    """Has the server given up this idle psycopg connection (see the module's docstring)?"""
    if dbapi_connection.closed or dbapi_connection.broken:
        return True
    readable, _, _ = select.select([dbapi_connection.fileno()], [], [], 0)
    return bool(readable)


def reaches_pooler(dbapi_connection: Any) -> bool:
    """Is this psycopg connection to a pooler rather than to the server itself (see the module's docstring)?"""
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        server_pid = cursor.fetchone()[0]
    if not dbapi_connection.autocommit:
        dbapi_connection.commit()
    return bool(server_pid != dbapi_connection.info.backend_pid)
