"""A run, from its owner's side: its lease renewed, its real start, its end (finished, or given back), each write
guarded by the owner and the fence it was claimed under; and the runs as read."""

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    Float,
    String,
    Text,
    and_,
    bindparam,
    case,
    false,
    func,
    insert,
    literal,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.engine import Connection

from ..rules.errors import LostLease
from ..rules.job import Claimed, Ending
from ..rules.limits import MAX_SNOOZES
from ..rules.states import JobState, Outcome
from . import dependencies
from .base import StoreBase
from .dbtime import db_now
from .history import run_history, with_machine_name
from .jobs import cancelled_instead
from .progress import progress_arrays, progress_renew_statement, progress_values
from .schema import Id, jobs, runs
from .sql.gates import free_places
from .sql.runs import (
    CANCELLED_BY,
    finish_params,
    finish_statement,
    renew_params,
    renew_statement,
    snoozing,
    successes,
)
from .types import Progress


def _run_ended(machine_id: int, *guard: Any) -> Any:
    """The row of job `b_id`'s run, which ends now with `b_outcome`, `b_error` and `b_output` and not in its job's
    success, written once (`guard`: only if the job is still as the caller holds it). Its attempt, fence and start
    are the job's: a run in progress is its job's row (see run_history); finish_statement writes it so on
    PostgreSQL."""
    return insert(runs).from_select(
        [
            *("job_id", "attempt", "machine_id", "fence", "started_at", "finished_at", "outcome", "error"),
            *("output", "progress", "progress_message"),
        ],
        select(
            jobs.c.id,
            jobs.c.attempts,
            literal(machine_id, Id),
            jobs.c.fence,
            jobs.c.started_at,
            db_now(),
            bindparam("b_outcome", type_=String),
            bindparam("b_error", type_=Text),
            bindparam("b_output", type_=Text),
            jobs.c.progress,
            jobs.c.progress_message,
        ).where(jobs.c.id == bindparam("b_id"), *guard),
    )


class RunStore:
    def __init__(self, store: StoreBase):
        self.store = store
        # By machine: told, once its finish that released children (store/dependencies.py) has committed, how many
        # (its node claims them: node/turn_timer.py). A dict, as in-process nodes of one Farm share its store.
        self.on_release: dict[int, Callable[[int], None]] = {}

    def mark_started(self, job: Claimed) -> None:
        """A job claimed ahead of its time starts now: its run's start becomes the real one (database time)."""
        self.store.count(
            update(jobs)
            .where(jobs.c.id == job.id, jobs.c.fence == job.fence, jobs.c.state == JobState.RUNNING)
            .values(started_at=db_now())
        )

    def renew(
        self,
        machine_id: int,
        held: Iterable[tuple[int, int]],
        lease: float,
        progress: Mapping[tuple[int, int], Progress] | None = None,
    ) -> dict[tuple[int, int], bool]:
        """Extend the leases of the runs (job id, fence) this machine still holds, and write the `progress` some
        reported in the same statement (so it is fenced as the renewal is). Returns {(job id, fence): cancel
        requested} for those renewed; a run missing from the answer was lost (its job taken over, or claimed
        again under a newer fence)."""
        held = list(held)
        if not held:
            return {}
        if self.store.whole:
            rows = self.store.hot(
                progress_renew_statement() if progress else renew_statement(),
                renew_params(machine_id, held, lease) | (progress_arrays(held, progress) if progress else {}),
            )
        else:
            mine = or_(*(and_(jobs.c.id == job_id, jobs.c.fence == fence) for job_id, fence in held))
            rows = self.store.rows(
                update(jobs)
                .where(jobs.c.owner == machine_id, jobs.c.state == JobState.RUNNING, mine)
                .values(lease_until=db_now() + lease, **progress_values(progress or {}))
                .returning(jobs.c.id, jobs.c.fence, jobs.c.cancel_requested)
            )
        return {(job_id, fence): bool(cancel) for job_id, fence, cancel in rows}

    def finish(
        self,
        job: Claimed,
        machine_id: int,
        outcome: Outcome,
        *,
        error: str | None = None,
        retry_in: float | None = None,
        output: str | None = None,
    ) -> str:
        """Record how a run ended, guarded by owner and fence. Returns the job's new state.

        `retry_in` puts a failed job back in the queue after that many seconds,
        when it has attempts left; a singleton goes back however its run ended.
        Raises LostLease if the fence moved on.
        """
        [state] = self.finish_many(machine_id, [Ending(job, outcome, error, retry_in, output)])
        if state is None:
            raise LostLease(f"job {job.id} fence {job.fence}: another machine owns it now")
        return state

    def finish_many(self, machine_id: int, endings: Sequence[Ending]) -> list[str | None]:
        """finish() for many runs in one transaction (a busy node's results, a few round trips for all).
        Returns each job's new state, None where the fence moved on: a run that would put its job back in the
        queue while a cancel of it was asked ends it cancelled (sql.runs.stopped). A snoozed run puts its job back
        after its delay with its attempt refunded (see _write_endings). The batch's statements match
        jobs without children only: a parent (store/dependencies.py) is finished apart, in a transaction with its
        children's release or cancellation, so a job with no dependencies costs no statement more."""
        succeeded = self.store.whole and bool(endings) and successes(endings)
        if succeeded or (self.store.whole and endings and not snoozing(endings)):  # snoozes: the plain finish
            ours = self.store.held(finish_statement(succeeded), finish_params(machine_id, endings, succeeded))
            if succeeded and len(ours) == len(endings):  # every run was still ours and childless (each is in
                return [JobState.SUCCEEDED.value] * len(endings)  # `endings` once), and a success stays one
            still = {(job_id, fence): state for job_id, fence, state in ours}
            states = [still.get((e.job.id, e.job.fence)) for e in endings]
            if len(ours) == len(endings):
                return states
        else:
            states = self._finish_plain(machine_id, endings)
        return [state if state is not None else self._finish_parent(machine_id, e) for state, e in zip(states, endings)]

    def _finish_plain(self, machine_id: int, endings: Sequence[Ending]) -> list[str | None]:
        """finish_many of jobs without children, elsewhere than on PostgreSQL, or of a batch with snoozes (rare: a
        snooze reads its job's count of them first, see _bounded)."""
        engine = self.store.engine
        if len(endings) > 1 and engine.dialect.supports_sane_multi_rowcount:
            with engine.connect() as conn:
                with conn.begin() as transaction:
                    if (states := _write_endings(conn, machine_id, endings)) is not None:
                        return states
                    transaction.rollback()  # someone's fence moved on, or a job has children: find which, one by one
        found: list[str | None] = []
        for ending in endings:
            with engine.begin() as conn:
                found.append((_write_endings(conn, machine_id, [ending]) or [None])[0])
        return found

    def _finish_parent(self, machine_id: int, ending: Ending) -> str | None:
        """A run the plain finish did not match: a job with children, ended with their release in one transaction
        under the same guard (owner and fence); None if it was not ours either (the fence moved on)."""
        released: list[int] = []
        with self.store.engine.begin() as conn:
            state = (_write_endings(conn, machine_id, [ending], parents=True, released=released) or [None])[0]
        if released and (told := self.on_release.get(machine_id)) is not None:
            told(len(released))
        return state

    def release(self, job: Claimed, machine_id: int, reason: str) -> bool:
        """Give a job back to the queue without spending an attempt (the node stopped it, e.g. when
        it fenced itself off); its run ends as lost. A job whose cancel was asked ends cancelled instead, its
        children with it (store/jobs.py cancelled_instead). False if it was no longer ours."""
        ours = (jobs.c.owner == machine_id, jobs.c.fence == job.fence, jobs.c.state == JobState.RUNNING)
        with self.store.engine.begin() as conn:
            conn.execute(
                _run_ended(machine_id, *ours),
                dict(b_id=job.id, b_outcome=Outcome.LOST, b_error=reason, b_output=None),
            )
            if cancelled_instead(conn, and_(jobs.c.id == job.id, *ours)):
                count = 1
            else:
                count = conn.execute(
                    update(jobs)
                    .where(jobs.c.id == job.id, *ours)
                    .values(
                        state=JobState.QUEUED,
                        owner=None,
                        lease_until=None,
                        run_at=case((jobs.c.run_at > db_now(), jobs.c.run_at), else_=db_now()),  # claimed early
                        attempts=jobs.c.attempts - 1,
                        last_error=reason,
                    )
                ).rowcount
            if count:
                free_places(conn, [job.queue])
        return count == 1

    def read(self, *, since: float = -math.inf, job_id: int | None = None, limit: int = 10_000) -> list[dict[str, Any]]:
        """The newest runs (of job `job_id`; those in progress or ended since `since`), with `machine_name`."""
        history = run_history()
        statement = with_machine_name(select(history), history).order_by(history.c.started_at.desc()).limit(limit)
        if job_id is not None:
            statement = statement.where(history.c.job_id == job_id)
        if since != -math.inf:
            statement = statement.where(or_(history.c.finished_at.is_(None), history.c.finished_at >= since))
        return [dict(r._mapping) for r in self.store.rows(statement)]


def kept(ending: Ending) -> str | None:
    """The output a finish writes on its job's row: a success's that ends the job (the run's record is the job's
    row then: history.kept_successes), else none."""
    return ending.output if ending.state == JobState.SUCCEEDED else None


def _requeued(**more: Any) -> dict[str, Any]:
    """What a run that puts its job back in the queue writes on its row (`more` besides): queued again after
    `b_retry` seconds, unless a cancel was asked meanwhile, which ends it cancelled (sql.runs.stopped)."""
    cancel = jobs.c.cancel_requested == true()
    return dict(
        state=case((cancel, JobState.CANCELLED.value), else_=JobState.QUEUED.value),
        last_error=case((cancel, CANCELLED_BY), else_=bindparam("b_error", type_=Text)),
        lease_until=None,
        run_at=case((cancel, jobs.c.run_at), else_=db_now() + bindparam("b_retry", type_=Float)),
        owner=case((cancel, jobs.c.owner), else_=None),
        finished_at=case((cancel, db_now()), else_=jobs.c.finished_at),
        **more,
    )


def _requeued_params(endings: list[Ending]) -> list[dict[str, Any]]:
    """The parameters of _requeued's update (and of a snoozed run's row, _run_ended) for `endings`."""
    return [
        dict(b_id=e.job.id, b_fence=e.job.fence, b_error=e.error, b_retry=e.retry_in, b_outcome=e.outcome)
        | dict(b_output=e.output)
        for e in endings
    ]


REQUEUED = _requeued()  # a failure with attempts left, a singleton's end
# A snooze refunds the attempt its run spent (as RunStore.release does) and is counted on its job's row.
SNOOZED = _requeued(attempts=jobs.c.attempts - 1, snoozes=func.coalesce(jobs.c.snoozes, 0) + 1)


def _bounded(conn: Connection, endings: Sequence[Ending]) -> list[Ending]:
    """`endings`, each snooze of a job that has snoozed MAX_SNOOZES times already made an ordinary failure (an
    attempt spent, run again after the delay it asked for if attempts are left), its error saying so. The counts are
    read in the finish's transaction; only the job's owner, under its fence, changes them."""
    ids = [e.job.id for e in endings if e.outcome == Outcome.SNOOZED]
    counts = dict(conn.execute(select(jobs.c.id, jobs.c.snoozes).where(jobs.c.id.in_(ids))).all())
    return [
        e._replace(outcome=Outcome.FAILED, error=f"snoozed {counts[e.job.id]} times: {e.error}")
        if e.outcome == Outcome.SNOOZED and (counts.get(e.job.id) or 0) >= MAX_SNOOZES
        else e
        for e in endings
    ]


def _write_endings(
    conn: Connection,
    machine_id: int,
    endings: Sequence[Ending],
    parents: bool = False,
    released: list[int] | None = None,
) -> list[str | None] | None:
    """The guarded updates for `endings`, one executemany per kind, and the rows of their runs that did not end their
    job in success (a success is its job's row: history.kept_successes); the jobs' new states if
    every one was ours, else None (and the caller rolls back). They match jobs without children, or with `parents`
    jobs with children only, whose children are then released or cancelled in the same transaction
    (store/dependencies.py). A job that would go back to the queue while a cancel was asked ends cancelled. A
    snoozed run's row is written before its job's (its attempt is the one it spent, refunded on the job)."""
    mine = and_(
        jobs.c.id == bindparam("b_id"),
        jobs.c.owner == machine_id,
        jobs.c.fence == bindparam("b_fence"),
        jobs.c.state == JobState.RUNNING,
        jobs.c.has_children == (true() if parents else false()),
    )
    again = [e for e in endings if e.state == JobState.QUEUED]
    snoozed: list[Ending] = []
    if again and snoozing(again):
        endings = _bounded(conn, endings)
        again = [e for e in endings if e.state == JobState.QUEUED and e.outcome != Outcome.SNOOZED]
        snoozed = [e for e in endings if e.outcome == Outcome.SNOOZED]
    done = [e for e in endings if e.state != JobState.QUEUED]
    count = 0
    if again:
        count += conn.execute(update(jobs).where(mine).values(REQUEUED), _requeued_params(again)).rowcount
    if snoozed:
        conn.execute(_run_ended(machine_id, mine), params := _requeued_params(snoozed))
        count += conn.execute(update(jobs).where(mine).values(SNOOZED), params).rowcount
    if done:
        count += conn.execute(
            update(jobs)
            .where(mine)
            .values(
                state=bindparam("b_state"),
                last_error=bindparam("b_error"),
                lease_until=None,
                finished_at=db_now(),
                output=bindparam("b_output", type_=Text),
            ),
            [
                dict(b_id=e.job.id, b_fence=e.job.fence, b_error=e.error, b_state=e.state, b_output=kept(e))
                for e in done
            ],
        ).rowcount
    if count != len(endings):
        return None
    states = [str(e.state) for e in endings]
    if again or snoozed:
        back = [e.job.id for e in (*again, *snoozed)]
        now = dict(conn.execute(select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(back))).all())
        states = [str(now[e.job.id]) if e.state == JobState.QUEUED else state for e, state in zip(endings, states)]
    ended = [e for e, state in zip(endings, states) if state != JobState.SUCCEEDED and e.outcome != Outcome.SNOOZED]
    if ended:
        conn.execute(
            _run_ended(machine_id),
            [dict(b_id=e.job.id, b_outcome=e.outcome, b_error=e.error, b_output=e.output) for e in ended],
        )
    free_places(conn, [e.job.queue for e in endings])
    if parents:
        freed = dependencies.ended(conn, [(e.job.id, state) for e, state in zip(endings, states)])
        if released is not None:
            released += freed
    return list(states)
