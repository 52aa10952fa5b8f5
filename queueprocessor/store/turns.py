"""The turns' rows: one per slot, taken by the machine whose turn it was, with what it claimed (docs/design.md §2)."""

from typing import Any

from sqlalchemy import delete, exc, select, update

from .base import StoreBase
from .dbtime import db_now
from .history import with_machine_name
from .schema import turns
from .sql.turns import looks_statement, turn_statement
from .types import NO_LOOKS, Looks


class TurnStore:
    def __init__(self, store: StoreBase):
        self.store = store

    def take(self, slot: int, machine_id: int, ends: float | None = None) -> bool:
        """Record a turn under its slot number. False if another machine already has that slot, or if the
        record reached the database after `ends`, the slot's end in database time (a node taking its turn
        always gives it; without it, history is written, as tests and tools do)."""
        return self.take_looking(slot, machine_id, NO_LOOKS, 0.0, ends)[0]

    def take_looking(
        self, slot: int, machine_id: int, looks: Looks, horizon: float, ends: float | None
    ) -> tuple[bool, bool | None, bool | None]:
        """`take`, and what the looks saw (None: not asked) if it was ours: on SQLite in the same statement,
        on SQL Server in a second one (PostgreSQL takes a turn with its claim: JobStore.take_turn_and_claim)."""
        guarded, elsewhere = bool(looks.guarded), looks.elsewhere is not None
        params = dict(b_slot=slot, b_machine=machine_id, b_horizon=horizon, b_ends=ends) | looks.params()
        statement = turn_statement(self.store.dialect, guarded, elsewhere, ends is not None)
        try:
            if not self.store.tsql:
                rows = self.store.rows(statement, params)
                if not rows:  # too late for its slot
                    return False, None, None
                [(_slot, *seen)] = rows
                return True, *seen
            if not self.store.count(statement, params):
                return False, None, None
        except exc.IntegrityError:
            return False, None, None
        if not (guarded or elsewhere):
            return True, None, None
        [seen] = self.store.rows(looks_statement(self.store.dialect, guarded, elsewhere), params)
        return True, *seen

    def record(self, slot: int, claimed: int, backlog: bool) -> None:
        """Add what the turn's holder claimed in its slot (its turn, then any claims on push notices)."""
        values: dict[str, Any] = dict(claimed=turns.c.claimed + claimed)
        if backlog:
            values["backlog"] = True
        self.store.count(update(turns).where(turns.c.slot == slot).values(**values))

    def read(self, since: float, limit: int = 100_000) -> list[dict[str, Any]]:
        rows = self.store.rows(
            with_machine_name(select(turns), turns).where(turns.c.taken_at >= since).order_by(turns.c.slot).limit(limit)
        )
        return [dict(r._mapping) for r in rows]

    def prune(self, keep_seconds: float) -> int:
        return self.store.count(delete(turns).where(turns.c.taken_at < db_now() - keep_seconds))
