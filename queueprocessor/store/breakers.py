"""The writes of queues' breakers and adaptive rates (docs/design.md §9; the state machine is rules/breaker.py):
a node's batch of endings counted on its queue's row, an operator's reset. The claim's side (an open breaker
gives no room but a canary's) is in sql/gates.py.

Each write reads the row under its lock (PostgreSQL and SQL Server: FOR UPDATE; SQLite: the transaction's write
lock) and writes it once, guarded by the flow_version it read: two nodes that end failing jobs at once move the row
one after the other, so a breaker opens once, with one event."""

from dataclasses import fields
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection

from ..rules.breaker import Flow, Seen, closed, step
from ..rules.queues import Rate
from .base import StoreBase
from .dbtime import db_now
from .events import record_event
from .schema import queues
from .sql.gates import bucket

_FLOW = [queues.c[f.name] for f in fields(Flow)]
RETRIES = 3  # a guarded write that found the row moved (it cannot under the lock: a safeguard) reads it again


class BreakerStore:
    def __init__(self, store: StoreBase):
        self.store = store

    def note(self, seen: dict[str, Seen], period: float) -> None:
        """What a node's batch of endings did to these queues (each with a breaker or an adaptive rate), counted
        on their rows, one transaction each, in name order; `period`, the farm's, sizes a bucket whose rate moves
        (Rate.burst)."""
        for name in sorted(seen):
            self._move(name, lambda flow, now, s=seen[name]: step(flow, s, now), period)

    def reset(self, name: str, period: float) -> bool:
        """Close queue `name`'s breaker at its configured rate (an operator's reset); whether it had one."""
        return self._move(name, lambda flow, _now: closed(flow, "reset by an operator"), period) is not None

    def _move(self, name: str, how: Any, period: float) -> Flow | None:
        """Apply `how(flow, now) -> (flow, events)` to queue `name`'s row; the row as it was (None: no row)."""
        for _ in range(RETRIES):
            with self.store.engine.begin() as conn:
                read = select(*_FLOW, queues.c.flow_version, db_now().label("now")).where(queues.c.name == name)
                row = conn.execute(read.with_for_update()).first()
                if row is None:
                    return None
                flow = Flow.of(row._mapping)
                new, events = how(flow, row.now)
                if not events and new == flow:
                    return flow
                if self._write(conn, name, flow, new, row.flow_version, period):
                    for kind, detail in events:
                        record_event(conn, kind, name, detail, self.store.actor)
                    return flow
        return flow

    def _write(self, conn: Connection, name: str, old: Flow, new: Flow, version: int | None, period: float) -> bool:
        values: dict[str, Any] = {
            f.name: getattr(new, f.name) for f in fields(Flow) if getattr(new, f.name) != getattr(old, f.name)
        }
        if new.state != old.state or "rate_per" in values:  # nodes re-read the settings at their next heartbeat
            values["changed_at"] = db_now()
        if "rate_per" in values and new.rate_count is not None and new.rate_per:
            # the bucket keeps what it held at the old rate, and refills at the new one from now
            values |= dict(
                tokens=bucket(self.store.dialect, queues),
                refilled_at=db_now(),
                burst=Rate(new.rate_count, new.rate_per).burst(period),
            )
        values["flow_version"] = func.coalesce(queues.c.flow_version, 0) + 1
        guard = queues.c.flow_version.is_(None) if version is None else queues.c.flow_version == version
        return bool(conn.execute(update(queues).where(queues.c.name == name, guard).values(**values)).rowcount)
