"""Push on PostgreSQL: new work wakes an idle farm in milliseconds instead of at the next turn.

A commit that queues work, whoever makes it (CLI, API, qp_enqueue, a plain SQL
INSERT, a parent's finish releasing its children), NOTIFYs the jobs channel, at
most once per PUSH_EVERY for the whole farm (store/sql/push.py). A node LISTENs
on its own connection and, on a notice, lets the machine that owns the current
turn slot claim at once, and once more FOLLOW_UP later: a commit that skipped
its notice because another had just sent one is visible by then. A turn that
finds a backlog notifies too, so every node with free capacity joins in without
waiting for its heartbeat. Polling stays the fallback: a lost notice or a
dropped listening connection only costs the latency of the next turn. SQLite
and SQL Server have no push and poll only; on every dialect a node claims at
once the children its own finishes release (turn_timer.TurnTimer.released).

LISTEN needs a session of its own, which a pooler in transaction mode
(PgBouncer) does not give: a farm reached through one listens on the server's
own address (--listen-db), or polls, and says so once in its log.
"""

import logging
import selectors
import socket
import threading
from collections.abc import Callable
from contextlib import suppress

import psycopg
from sqlalchemy import text
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import URL, Connection

from ..rules.logs import one_line
from ..rules.urls import mask
from ..store.connections import reaches_pooler
from ..store.database import labelled, listen_url, query_value, unlabelled
from ..store.schema import JOBS_CHANNEL
from ..store.sql.push import PUSH_EVERY

log = logging.getLogger("queueprocessor.push")

BACKLOG = "backlog"
# After answering a notice, the slot's holder claims again this long after it: a commit that skipped its notice for
# that one decided within PUSH_EVERY of it and committed right after (the decision is its last act); the rest is a
# margin for its commit's own flush.
FOLLOW_UP = PUSH_EVERY + 0.01
RECONNECT = 1.0  # seconds between attempts to listen again after losing the connection


def where_to_listen(farm_url: URL, listen_db: str | None) -> URL:
    """The farm's own URL, or `listen_db` when given, carrying the same name as the farm's connections."""
    if listen_db is None:
        return farm_url
    return labelled(listen_url(listen_db), query_value(farm_url.query["application_name"]))


def notify_backlog(conn: Connection) -> None:
    """Tell every listening node that a turn found more work than its holder could take."""
    conn.execute(text("SELECT pg_notify(:channel, :payload)"), {"channel": JOBS_CHANNEL, "payload": BACKLOG})


class Listener:
    """A thread that LISTENs on the jobs channel and calls `on_notice(payload)` for each notice."""

    def __init__(self, url: URL, on_notice: Callable[[str], None]):
        self.url = url
        # The engine's own reading of the URL (its hosts, its application_name, ...), for a plain psycopg connection.
        self.params = PGDialect_psycopg().create_connect_args(url)[1]
        self.on_notice = on_notice
        self.listening = threading.Event()
        self._stop = threading.Event()
        self._bell, self._bell_ear = socket.socketpair()  # stop() rings it: the listener sleeps on no timer
        self._thread = threading.Thread(target=self._serve, name="qp-listen", daemon=True)
        self._last_bug: str | None = None  # the last failure not the database's, logged once (see _listen)

    def start(self) -> "Listener":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with suppress(OSError):  # the listener has ended already, and closed its bell
            self._bell.send(b"\0")
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _serve(self) -> None:
        try:
            self._listen()
        finally:
            self.listening.clear()
            self._bell.close()
            self._bell_ear.close()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(**self.params, autocommit=True, connect_timeout=5) as conn:
                    if reaches_pooler(conn):
                        log.warning(
                            "push is off, the farm polls: %s reaches a pooler, where LISTEN cannot work; "
                            "give --listen-db (QP_LISTEN_DB, listen-db in the config) the PostgreSQL "
                            "server's own URL",
                            mask(unlabelled(self.url)),
                        )
                        return
                    conn.execute(f"LISTEN {JOBS_CHANNEL}")
                    self.listening.set()
                    self._relay(conn)
            except psycopg.Error as error:
                if self.listening.is_set():
                    log.warning(
                        "push: stopped listening (%s); polling carries on",
                        mask(str(error).strip().splitlines()[0] if str(error) else type(error).__name__),
                    )
                self.listening.clear()
                self._stop.wait(RECONNECT)
            except Exception as error:  # not the database's: a bug, said aloud once per message; listening goes on
                said = mask(one_line(error))
                if said != self._last_bug:
                    self._last_bug = said
                    log.error(
                        "push: the listener failed (%s); it listens again, polling carries on", said, exc_info=error
                    )
                self.listening.clear()
                self._stop.wait(RECONNECT)

    def _relay(self, conn: psycopg.Connection) -> None:
        """Hand on each notice as it arrives, until stopped. The thread sleeps on the connection's socket and
        on stop()'s bell, not on a timer (psycopg's notifies(timeout) wakes every 0.1 s to look, which was
        a third of an idle node's CPU); a connection the server drops wakes it too, and raises."""
        with selectors.DefaultSelector() as selector:
            selector.register(conn.fileno(), selectors.EVENT_READ)
            selector.register(self._bell_ear, selectors.EVENT_READ)
            while not self._stop.is_set():
                selector.select()
                for notice in conn.notifies(timeout=0):  # what has arrived; none if the bell woke us
                    self.on_notice(notice.payload)
