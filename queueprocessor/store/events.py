"""The farm's log of what happened and who did it (docs/design.md §11): machines joining, leaving, judged dead,
fencing themselves and steered; queues and schedules changed; bulk actions; outages a node noticed.

An event is written in the same transaction as the change it tells of (`record_event`), so the log never says
something happened that did not, nor misses what did; nothing is written on an idle farm. Housekeeping deletes
events past `keep_events`, with the history's hourly roll-up (see TurnTimer._write_history): on PostgreSQL by
dropping days whole (store/partitions.py).
"""

import os
from typing import Any

from sqlalchemy import and_, delete, insert, or_, select
from sqlalchemy.engine import Connection

from ..rules.events import EventKind, machine_label
from ..rules.output import format_time
from ..rules.urls import mask
from .base import StoreBase
from .database import client_name
from .dbtime import db_now
from .partitions import upkeep
from .schema import events, machines

MAX_DETAIL = 2000


def actor_of(client: str | None = None) -> str:
    """Who a process is, in the log: its program and host (the label of its connections), and its pid."""
    return f"{client or client_name()} pid {os.getpid()}"


def record_event(
    conn: Connection, kind: EventKind, subject: str, detail: str | None = None, actor: str | None = None
) -> None:
    """Log an event in the transaction `conn` is in: written if and only if the change beside it is."""
    detail = None if detail is None else mask(detail)[:MAX_DETAIL]  # a target may hold credentials
    conn.execute(insert(events).values(at=db_now(), kind=kind, subject=subject, detail=detail, actor=actor))


def record_machine_event(
    conn: Connection, kind: EventKind, machine_id: int, detail: str | None = None, actor: str | None = None
) -> None:
    """Log an event about a machine by its id (its name read in the same transaction); the machine itself is the
    actor unless another is given."""
    name = conn.execute(select(machines.c.name).where(machines.c.id == machine_id)).scalar_one()
    subject = machine_label(name, machine_id)
    record_event(conn, kind, subject, detail, actor or subject)


class EventStore:
    """Reads and trims qp_events."""

    def __init__(self, store: StoreBase):
        self.store = store

    def read(self, since: float, kind: str | None = None, limit: int = 10_000) -> list[dict[str, Any]]:
        """The events of the last `since` seconds (database time), oldest first; `kind`: one kind, or a family
        (`machine`: every machine.* event). At most `limit`, the newest."""
        where = [events.c.at >= db_now() - since]
        if kind is not None:
            where.append(or_(events.c.kind == kind, events.c.kind.startswith(kind + ".", autoescape=True)))
        newest = select(events).where(and_(*where)).order_by(events.c.at.desc(), events.c.id.desc()).limit(limit)
        rows = [dict(row._mapping) for row in self.store.rows(newest)]
        return rows[::-1]

    def outage(self, machine_id: int, since: float, until: float, fences: int) -> None:
        """A machine was cut off from the database from `since` to `until` (database time), and stopped its
        own jobs `fences` times meanwhile (see node/watchdog.py)."""
        with self.store.engine.begin() as conn:
            gap = f"no contact for {until - since:.1f} s, since {format_time(since)}"
            record_machine_event(conn, EventKind.DATABASE_OUTAGE, machine_id, gap)
            if fences:
                fenced = f"stopped its jobs before their leases ran out ({fences} time{'s' if fences > 1 else ''})"
                record_machine_event(conn, EventKind.MACHINE_FENCED, machine_id, fenced)

    def prune(self, keep: float) -> int:
        """Delete the events older than `keep` seconds (housekeeping); how many. On PostgreSQL the days past `keep`
        are dropped whole instead, and the days ahead made (store/partitions.py)."""
        if self.store.whole:
            return upkeep(self.store.engine, events, self.store.ask_time(), keep)
        return self.store.count(delete(events).where(events.c.at < db_now() - keep))
