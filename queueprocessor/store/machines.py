"""The machines' rows: a node registers, checks in, takes an operator's wish and stops; operators read and find
them. (Who is alive, and the roster version a change bumps, are store/roster.py's.)"""

from typing import Any

from sqlalchemy import insert, select, update

from ..rules.errors import NotFound, QPError, echoed
from ..rules.events import EventKind
from ..rules.queues import Served
from ..rules.states import MachineState, Wish
from .base import StoreBase
from .dbtime import db_now
from .events import record_machine_event
from .schema import machines
from .sql.machines import VERSION, bump_roster, checkin_statement, newest_backlog

# The event a machine's check-in in a new state logs (a machine stops through mark_stopped).
STATE_EVENTS: dict[str, EventKind] = {
    MachineState.ACTIVE: EventKind.MACHINE_RESUMED,
    MachineState.PAUSED: EventKind.MACHINE_PAUSED,
    MachineState.DRAINING: EventKind.MACHINE_DRAINING,
}


class MachineStore:
    def __init__(self, store: StoreBase):
        self.store = store

    def register(
        self,
        *,
        name: str,
        host: str,
        instance: str,
        pid: int,
        version: str,
        capacity: int,
        allow: str | None = None,
        queues: str = "",
    ) -> int:
        """A new machine row; `queues` as typed after --queues (queues.Served), "" for every queue."""
        values = dict(
            name=name,
            host=host,
            instance=instance,
            pid=pid,
            version=version,
            capacity=capacity,
            allow=allow,
            queues=queues,
            state=MachineState.ACTIVE,
            running=0,
            done_count=0,
            failed_count=0,
        )
        with self.store.engine.begin() as conn:
            bump_roster(conn, None)
            conn.execute(insert(machines).values(joined_at=db_now(), last_seen=db_now(), changed=VERSION, **values))
            machine_id: int = conn.execute(select(machines.c.id).where(machines.c.instance == instance)).scalar_one()
            joined = f"on {host} pid {pid}, version {version}, capacity {capacity}, queues {queues or 'every queue'}"
            record_machine_event(conn, EventKind.MACHINE_JOINED, machine_id, joined)
            return machine_id

    def heartbeat(
        self,
        machine_id: int,
        *,
        state: str,
        applied_wish: str | None,
        running: int,
        done: int,
        failed: int,
        offset: float | None,
        rtt: float | None,
        error_bound: float | None,
    ) -> bool:
        """Check in. Clears the wish the node just applied (only if nobody wished again since). One statement
        while the machine's state stays as stored; a new state bumps the roster version with it."""
        params: dict[str, Any] = dict(
            b_me=machine_id,
            b_state=state,
            b_running=running,
            b_done=done,
            b_failed=failed,
            b_offset=offset,
            b_rtt=rtt,
            b_bound=error_bound,
        )
        applied = applied_wish is not None
        if applied:
            params["b_applied"] = applied_wish
        if self.store.whole:
            if self.store.hot(checkin_statement(applied, returning=True), params):
                return True
        elif self.store.count(checkin_statement(applied), params):
            return True
        with self.store.engine.begin() as conn:  # a new state, or a check-in after a burial: the roster changed
            stored = conn.execute(select(machines.c.state).where(machines.c.id == machine_id)).scalar()
            if conn.execute(checkin_statement(applied, any_state=True), params).rowcount != 1:
                return False
            bump_roster(conn, machine_id)
            kind = EventKind.MACHINE_BACK if stored == MachineState.DEAD else STATE_EVENTS.get(state)
            if kind is not None and (stored != state or kind is EventKind.MACHINE_BACK):
                record_machine_event(conn, kind, machine_id, f"as asked ({applied_wish})" if applied else None)
        return True

    def read(self, backlog_since: int | None = None) -> tuple[float, int | None, list[dict[str, Any]]]:
        """The database's time, the newest backlog turn since a slot, all machines (an operator's view; a node's
        heartbeat reads O(1) rows instead, see store/roster.py)."""
        rows = self.store.rows(select(db_now(), newest_backlog(backlog_since), *machines.c).order_by(machines.c.id))
        if not rows:
            return self.store.ask_time(), None, []
        # A machine's queues as names, () for every queue, and its own limits for some ({queue: most at once}).
        served = [Served.parse(r.queues or None) for r in rows]
        return (
            rows[0][0],
            rows[0][1],
            [dict(r._mapping) | {"queues": s.names, "caps": dict(s.caps)} for r, s in zip(rows, served)],
        )

    def find(self, ref: str) -> dict[str, Any]:
        """A machine by id, or by name among the machines that are not stopped."""
        with self.store.engine.connect() as conn:
            if ref.isdigit() and int(ref) < 2**63:  # a larger number is no id, but may be a name
                row = conn.execute(select(machines).where(machines.c.id == int(ref))).first()
                if row:
                    return dict(row._mapping)
            rows = conn.execute(
                select(machines).where(machines.c.name == ref, machines.c.state != MachineState.STOPPED)
            ).all()
        if not rows:
            raise NotFound(f"no running machine is named or numbered {echoed(ref)}", what="machine", ref=ref)
        if len(rows) > 1:
            ids = ", ".join(str(r.id) for r in rows)
            raise QPError(f"{len(rows)} machines are named {echoed(ref)} (ids {ids}): give the id instead")
        return dict(rows[0]._mapping)

    def wish(self, machine_id: int, wish: str) -> None:
        """Write an operator's wish on a machine's row; the machine applies it within a heartbeat."""
        if wish not in tuple(Wish):
            raise QPError(f"unknown wish {echoed(wish)}: use one of {', '.join(Wish)}")
        with self.store.engine.begin() as conn:
            if conn.execute(update(machines).where(machines.c.id == machine_id).values(wish=wish)).rowcount != 1:
                raise NotFound(f"no machine with id {machine_id}", what="machine", ref=machine_id)
            record_machine_event(conn, EventKind.MACHINE_ASKED, machine_id, f"to {wish}", self.store.actor)

    def mark_stopped(self, machine_id: int) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(
                update(machines)
                .where(machines.c.id == machine_id)
                .values(state=MachineState.STOPPED, running=0, last_seen=db_now())
            )
            bump_roster(conn, machine_id)
            record_machine_event(conn, EventKind.MACHINE_LEFT, machine_id)
