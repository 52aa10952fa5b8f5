"""Bulk actions: retry, cancel or delete every job a JobFilter picks, in batches (docs/design.md §7).

Each batch is one short transaction: it locks up to BATCH of the jobs left, by ascending id after the last batch's
(on PostgreSQL with SKIP LOCKED, so it waits on no claim or finish, and a claim, which skips locked rows too, waits
on none of it), and runs on them the very statement the single action runs on one job (store/jobs.py), with its
state guard. So a bulk action never holds locks for longer than one batch, each job it changes is changed as a
single action would change it, and stopping it between batches (`stop`) or interrupting one (its transaction rolls
back) leaves every job either changed whole or untouched. A job another transaction held at that moment (a claim, a
finish) is skipped and left as it was; the result says how many were changed and how many were so skipped (`busy`:
run the action again for them). When the batches end, are stopped or are interrupted, one event logs the action,
its filter and those counts (docs/design.md §10).
"""

from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace

from sqlalchemy import false, func, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement

from ..rules.events import EventKind
from ..rules.search import BulkAction, JobFilter
from ..rules.states import FINISHED, JobState
from .base import StoreBase
from .events import record_event
from .jobs import RETRYABLE, UNSTARTED, cancel_queued, delete_finished, retried, stop_running
from .matching import all_of, let_bitmaps, matching, picked_rows
from .schema import jobs
from .views import KEYS_PER_STATEMENT

BATCH = 1_000  # jobs a transaction changes: a few milliseconds of locks on PostgreSQL


class Changed(int):
    """How many jobs a bulk action changed (an int, as it always was), and `busy`: how many more it picked but found
    held by another transaction and left unchanged, for a second run to take."""

    busy: int

    def __new__(cls, changed: int, busy: int = 0) -> "Changed":
        made = super().__new__(cls, changed)
        made.busy = busy
        return made

    def busy_said(self) -> str:
        """What an operator is told of the busy jobs, after the count of those changed ("" when there were none)."""
        if not self.busy:
            return ""
        return f"; {self.busy} {'was' if self.busy == 1 else 'were'} busy and left unchanged: run it again"


def acts_on(action: BulkAction) -> ColumnElement[bool]:
    """The jobs `action` can change: failed or cancelled for a retry; queued or waiting, or running and not yet
    asked to stop, for a cancel; finished for a delete."""
    if action is BulkAction.RETRY:
        return jobs.c.state.in_(RETRYABLE)
    if action is BulkAction.CANCEL:
        return or_(
            jobs.c.state.in_(UNSTARTED),
            (jobs.c.state == JobState.RUNNING) & (jobs.c.cancel_requested == false()),
        )
    return jobs.c.state.in_(FINISHED)


def _apply(conn: Connection, action: BulkAction, which: ColumnElement[bool]) -> int:
    """Run the single action's statement (store/jobs.py) on the jobs of `which`; how many it changed."""
    if action is BulkAction.RETRY:
        return retried(conn, which)[0]
    if action is BulkAction.CANCEL:
        stopped = conn.execute(stop_running(which & (jobs.c.cancel_requested == false()))).rowcount
        return stopped + cancel_queued(conn, which)
    return delete_finished(conn, which)


class BulkStore:
    """Bulk actions (Store.bulk), in batches (see the module doc)."""

    def __init__(self, store: StoreBase):
        self.store = store

    def count(self, action: BulkAction, where: JobFilter) -> int:
        """How many jobs `action` would change now (what the app asks an operator to confirm)."""
        picked = all_of([*matching(where), acts_on(action)])
        return int(picked_rows(self.store, select(func.count()).select_from(jobs).where(picked), where)[0][0])

    def run(
        self,
        action: BulkAction,
        where: JobFilter,
        *,
        batch: int = BATCH,
        stop: Callable[[], bool] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Changed:
        """Apply `action` to every job `where` picks, `batch` jobs to a transaction; how many it changed, and how many
        it found busy (see Changed). `stop()` is asked before each batch (true ends the work there); `progress(changed
        so far)` is told after each."""
        chunks = (
            [where]
            if not where.ids
            else [
                replace(where, ids=where.ids[n : n + KEYS_PER_STATEMENT])
                for n in range(0, len(where.ids), KEYS_PER_STATEMENT)
            ]
        )
        changed, busy, stopped = 0, 0, False
        try:
            for chunk in chunks:
                picked = all_of([*matching(chunk), acts_on(action)])
                after = None
                while not (stopped := bool(stop and stop())):
                    with self.store.engine.begin() as conn:
                        let_bitmaps(self.store, conn, chunk)
                        ids = _lock_batch(conn, picked, after, batch)
                        if self.store.dialect != "sqlite":  # SQLite locks the whole database: no row is ever skipped
                            busy += _busy(conn, picked, after, ids, batch)
                        if not ids:
                            break
                        changed += _apply(conn, action, jobs.c.id.in_(ids))
                    after = ids[-1]
                    if progress:
                        progress(changed)
                    if len(ids) < batch:
                        break
                if stopped:
                    break
        except BaseException:
            with suppress(Exception):  # the batches committed are logged if the database lets us; the error goes on
                _log(self.store, action, where, Changed(changed, busy), ", then interrupted")
            raise
        result = Changed(changed, busy)
        _log(self.store, action, where, result, ", then stopped" if stopped else "")
        return result


def _busy(conn: Connection, picked: ColumnElement[bool], after: int | None, ids: list[int], batch: int) -> int:
    """How many jobs of `picked` in the ids a batch went over (after `after`, up to its last if it was full) it did
    not lock: another transaction held them. A plain count, which waits on no lock (SQL Server: READUNCOMMITTED)."""
    span = [jobs.c.id > after] if after is not None else []
    if len(ids) == batch:
        span.append(jobs.c.id <= ids[-1])
    seen = (
        select(func.count()).select_from(jobs).where(picked, *span).with_hint(jobs, "WITH (READUNCOMMITTED)", "mssql")
    )
    return max(0, int(conn.execute(seen).scalar_one()) - len(ids))


def _log(store: StoreBase, action: BulkAction, where: JobFilter, changed: Changed, ending: str) -> None:
    """One event for the whole action, once its batches are done, stopped or interrupted (docs/design.md §10)."""
    with store.engine.begin() as conn:
        told = f"{where.describe()}: {changed} job{'' if changed == 1 else 's'}{ending}{changed.busy_said()}"
        record_event(conn, EventKind.JOBS_BULK, action.value, told, store.actor)


def _lock_batch(conn: Connection, picked: ColumnElement[bool], after: int | None, batch: int) -> list[int]:
    """Lock the next `batch` jobs of `picked` by id, skipping those another transaction holds."""
    statement = select(jobs.c.id).where(picked)
    if after is not None:
        statement = statement.where(jobs.c.id > after)
    statement = (
        statement.order_by(jobs.c.id)
        .limit(batch)
        .with_for_update(skip_locked=True, of=jobs)
        .with_hint(jobs, "WITH (UPDLOCK, ROWLOCK, READPAST)", "mssql")
    )
    return [row[0] for row in conn.execute(statement)]
