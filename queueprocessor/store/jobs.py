"""The jobs' rows, from the queue's side: enqueue, claim (with a turn, on PostgreSQL in one statement), take over
leases that ran out, cancel, retry, read, and prune. (A run's writes under its lease are store/runs.py's.)"""

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import and_, delete, exc, false, func, insert, literal, select, true, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement, Update

from ..rules.errors import DuplicateKey, NotFound, QPError, echoed
from ..rules.job import Claimed, JobSpec
from ..rules.keys import check_enqueue
from ..rules.states import FINISHED, JobState, Kind, Outcome
from . import dependencies, job_partitions, key_flow, key_holds
from .base import StoreBase
from .dbtime import db_now
from .history import last_output, with_owner_name
from .inserts import insert_jobs
from .schema import deps, flow_jobs, jobs, machines, queues, runs
from .sql.claim import LOST, claim_statement
from .sql.due import unpaused
from .sql.fair import tag
from .sql.gates import free_places, gated_now, taken_statement
from .sql.runs import CANCELLED_BY
from .turns import TurnStore
from .types import NO_LOOKS, ClaimRequest, Looks, Turn

SETTLE_TRIES = 10  # inserts of a keyed job that found its key taken, then free, before giving up


class Made(NamedTuple):
    """The jobs an enqueue made, or the one job holding its key it answered with, and how (key_holds.Settled)."""

    ids: list[int]
    settled: str | None = None


PRUNE_BATCH = 500  # finished jobs deleted per transaction (retention): short enough never to hold up the queue


class JobStore:
    def __init__(self, store: StoreBase, turns: TurnStore):
        self.store = store
        self.turns = turns

    def enqueue(self, spec: JobSpec, *, delay: float = 0.0, at: float | None = None, count: int = 1) -> list[int]:
        """Insert `count` copies of a job, due after `delay` seconds or at epoch `at` (database time)."""
        return self.made(spec, delay=delay, at=at, count=count).ids

    def made(self, spec: JobSpec, *, delay: float = 0.0, at: float | None = None, count: int = 1) -> "Made":
        """As enqueue, and how a key held by another job was settled (store/key_holds.py): the insert is tried
        first, so a job whose key is free, or that has none, costs what it always did."""
        check_enqueue(spec.terms, count=count, delay=delay, at=at)
        if spec.terms.debounce is not None:
            delay = spec.terms.debounce
        for _ in range(SETTLE_TRIES):
            try:
                with self.store.engine.begin() as conn:
                    return Made(insert_jobs(conn, self.store.whole, spec, delay=delay, at=at, count=count))
            except exc.IntegrityError:
                if spec.key is None or count != 1:
                    raise DuplicateKey(spec.key) from None
            with self.store.engine.begin() as conn:
                settled = key_holds.settle(conn, spec, delay=delay, at=at)
            if settled is not None:
                return Made([settled.job_id], settled.how)
        raise DuplicateKey(spec.key)  # given up and taken again each time: a key fought over beyond reason

    def claim(self, request: ClaimRequest) -> list[Claimed]:
        """Atomically take up to `request.limit` claimable jobs of the queues its plan names, best priority first.

        Claimable (see ClaimRequest): queued with run_at within the horizon from now, or (with
        take_expired) running with a lease that ran out, and ran out before
        `expired_before` (database time) if given: a claim that a stalled database
        holds up must not take the leases that ran out during the stall. One
        UPDATE; the subquery skips rows another machine is claiming at the same moment.
        A plan with limited or rated queues claims them within their rows' running count and rate bucket, and
        adds what it started to both before the rows' lock is let go: on PostgreSQL the claim statement does
        all of it; elsewhere a transaction locks the rows first and writes the counts after the claim.
        """
        if request.limit <= 0:
            return []
        machine_id, plan = request.machine_id, request.plan
        params = request.params()
        shape = self.store.claim_shape(request.limit, **request.shape())
        if self.store.whole and not any(shape.keyed):  # the statement ends lost runs, counts what it took itself
            rows = self.store.hot(claim_statement(shape), params)
            return self._not_stopped(machine_id, [Claimed(*row) for row in rows])
        if self.store.whole:
            # A limit per key is counted from the running jobs themselves, which the statement sees as of its
            # snapshot: taken after the rows' lock, it sees every job the claim before ours started.
            with self.store.engine.begin() as conn:
                _lock_queues(conn, plan.locks)
                claimed = [Claimed(*row) for row in conn.execute(claim_statement(shape), params)]
                key_flow.spend(conn, self.store.dialect, [c.id for c in claimed])
            return self._not_stopped(machine_id, claimed)
        with self.store.engine.begin() as conn:  # a take-over and the lost run's row are written together, or neither
            _lock_queues(conn, plan.locks)
            leaving = _expired_runs(conn, request.expired_before) if request.take_expired else {}
            claimed = _most_urgent_first(Claimed(*row) for row in conn.execute(claim_statement(shape), params))
            _end_lost(conn, [(c.id, c.attempts - 1, *leaving[c.id], c.fence - 1) for c in claimed if c.id in leaving])
            claimed = _stop_asked(conn, machine_id, claimed)
            if any(shape.keyed):
                key_flow.spend(conn, self.store.dialect, [c.id for c in claimed])
            started = Counter(c.queue for c in claimed if c.queue in plan.locks and c.id not in leaving)
            if started:
                conn.execute(
                    taken_statement(self.store.dialect),
                    [dict(b_queue=q, b_spent=n) for q, n in sorted(started.items())],
                )
        return claimed

    def take_turn_and_claim(
        self, slot: int, request: ClaimRequest, *, looks: Looks = NO_LOOKS, ends: float | None = None
    ) -> Turn:
        """Record the turn of `slot` (as TurnStore.take, before `ends`) and, only if it was ours to take, claim as
        `claim` does and look as `looks` asks (while guarded work is due, claim nothing).

        On PostgreSQL all of it is one statement, so an idle farm costs the
        database one statement per period, roles and limited queues or not;
        elsewhere, and for a plan that locks queues, two.
        """
        if not self.store.whole or request.limit <= 0 or request.plan.locks:
            won, guarded_due, elsewhere_due = self.turns.take_looking(
                slot, request.machine_id, looks, request.horizon, ends
            )
            if not won:
                return Turn(False, [])
            claimed = [] if guarded_due else self.claim(request)
            return Turn(True, claimed, guarded_due, elsewhere_due)
        params = request.params() | dict(b_slot=slot, b_ends=ends) | looks.params()
        shape = self.store.claim_shape(
            request.limit,
            turn=True,
            guarded=bool(looks.guarded),
            elsewhere=looks.elsewhere is not None,
            ends=ends is not None,
            **request.shape(),
        )
        rows = self.store.hot(claim_statement(shape), params)
        won, guarded_due, elsewhere_due = rows[0][:3]
        if not won:
            return Turn(False, [])
        claimed = self._not_stopped(request.machine_id, [Claimed(*row[3:]) for row in rows if row[3] is not None])
        return Turn(True, claimed, guarded_due, elsewhere_due)

    def traceparents(self, ids: list[int]) -> dict[int, str]:
        """The W3C traceparents the jobs `ids` keep, by id (those without one left out): read once a claim, by a
        tracing node only (docs/design.md §12)."""
        with self.store.engine.connect() as conn:
            found = conn.execute(
                select(jobs.c.id, jobs.c.traceparent).where(jobs.c.id.in_(ids), jobs.c.traceparent.is_not(None))
            )
            return {job_id: traceparent for job_id, traceparent in found}

    def _not_stopped(self, machine_id: int, claimed: list[Claimed]) -> list[Claimed]:
        """PostgreSQL's claim, made in one statement: the jobs it took whose cancel was asked end cancelled, in a
        transaction of their own (see _stop_asked); the others, most urgent first."""
        if any(c.cancel_requested for c in claimed):
            with self.store.engine.begin() as conn:
                claimed = _stop_asked(conn, machine_id, claimed)
        return _most_urgent_first(claimed)

    def requeue_expired(self, before: float) -> int:
        """Put running jobs whose lease ran out (before `before`, database time) back in the queue.

        Their attempt stays spent, and their runs end as lost; the next claim fails
        the job if that was its last attempt (Claimed.exhausted). One whose cancel was asked ends cancelled.
        """
        with self.store.engine.begin() as conn:
            leaving = _expired_runs(conn, before)
            if not leaving:
                return 0
            which = and_(jobs.c.id.in_(list(leaving)), *_ran_out(before))
            taken = cancelled_instead(conn, which)
            taken += conn.execute(
                update(jobs)
                .where(which)
                .values(
                    state=JobState.QUEUED,
                    owner=None,
                    lease_until=None,
                    last_error="lease expired: its machine stopped renewing it",
                )
                .returning(jobs.c.id, jobs.c.attempts, jobs.c.fence, jobs.c.queue)
            ).all()
            _end_lost(conn, [(job_id, attempts, *leaving[job_id], fence) for job_id, attempts, fence, _ in taken])
            free_places(conn, [queue for *_, queue in taken])
        return len(taken)

    def any_due(self, among: tuple[str, ...] = (), besides: tuple[str, ...] = ()) -> bool:
        """Is any queued job due that a claim's main branch takes: in a queue that is not held back (paused, or
        limited or rated farm-wide: those are claimed apart), one of `among` (() for any) and none of `besides`?
        (Cheap: it stops at the first, where a count reads the whole backlog.)"""
        due = select(jobs.c.id).where(
            jobs.c.state == JobState.QUEUED, jobs.c.gated == false(), jobs.c.run_at <= db_now(), unpaused(jobs)
        )
        if among:
            due = due.where(jobs.c.queue.in_(among))
        if besides:
            due = due.where(jobs.c.queue.notin_(besides))
        return bool(self.store.rows(select(due.exists()))[0][0])

    def any_expired(self) -> bool:
        """Is any running job's lease out, in a queue that is not paused (one a settled machine's claim takes
        over)? (Cheap: it stops at the first.)"""
        out = select(jobs.c.id).where(*_ran_out(), unpaused(jobs))
        return bool(self.store.rows(select(out.exists()))[0][0])

    def cancel(self, job_id: int) -> str:
        """Cancel a queued job at once; ask the owner of a running one to stop it (within a heartbeat)."""
        with self.store.engine.begin() as conn:
            if cancel_queued(conn, jobs.c.id == job_id):
                return JobState.CANCELLED
            if conn.execute(stop_running(jobs.c.id == job_id)).rowcount:
                return "cancelling"
            state = conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar()
        if state is None:
            raise NotFound(f"no job with id {job_id}", what="job", ref=job_id)
        raise QPError(f"job {job_id} is already {state}; only waiting, queued or running jobs can be cancelled")

    def retry(self, job_id: int) -> str:
        """Put a failed or cancelled job back in the queue for one more attempt (or to waiting, if it runs after
        jobs that have not all succeeded yet); the jobs its failure cancelled wait for it again
        (store/dependencies.py). Its state now; a job whose parent failed for good is held for that parent's retry,
        and told."""
        with self.store.engine.begin() as conn:
            count, held = retried(conn, jobs.c.id == job_id)
            now = conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar()
        if held:
            [(parent, why)] = held.values()
            raise QPError(
                f"job {job_id} stays cancelled: {why}; retry job {parent}, and job {job_id} waits for it again"
            )
        if count != 1:
            state = self.store.rows(select(jobs.c.state).where(jobs.c.id == job_id))
            if not state:
                raise NotFound(f"no job with id {job_id}", what="job", ref=job_id)
            raise QPError(f"job {job_id} is {state[0][0]}; only failed or cancelled jobs can be retried")
        return str(now)

    def get(self, job_id: int) -> dict[str, Any]:
        """The job's row, with `owner_name`: the name of the machine that holds (or last held) it."""
        rows = self.store.rows(with_owner_name(select(jobs)).where(jobs.c.id == job_id))
        if not rows:
            raise NotFound(f"no job with id {job_id}", what="job", ref=job_id)
        return dict(rows[0]._mapping)

    def keyed(self, *, key: str | None = None, job_id: int | None = None) -> dict[str, Any] | None:
        """The job holding `key` (or with that id), with `machine_name` (of its owner) and `last_output` (of its
        last run): what a refused grab tells about its winner."""
        rows = self.store.rows(
            select(jobs, machines.c.name.label("machine_name"))
            .select_from(jobs.outerjoin(machines, machines.c.id == jobs.c.owner))
            .where(jobs.c.key == key if job_id is None else jobs.c.id == job_id)
        )
        if not rows:
            return None
        job = dict(rows[0]._mapping)
        last = self.store.rows(last_output(job["id"]))
        return job | {"last_output": last[0][0] if last else None}

    def free_key(self, key: str) -> int:
        """A finished job holding `key` gives it up (keeping its history), so the key can be used again."""
        return self.store.count(update(jobs).where(jobs.c.key == key, jobs.c.state.in_(FINISHED)).values(key=None))

    def singletons(self) -> list[dict[str, Any]]:
        """The jobs of the singletons that exist (those removed gave their key up), by key."""
        statement = (
            with_owner_name(select(jobs))
            .where(jobs.c.kind == Kind.SINGLETON, jobs.c.key.isnot(None))
            .order_by(jobs.c.key)
        )
        return [dict(r._mapping) for r in self.store.rows(statement)]

    def newest(self, state: str | None = None, limit: int = 100, *, queue: str | None = None) -> list[dict[str, Any]]:
        """The newest jobs (in `state`, of `queue`, if given), each with `owner_name` (see `get`)."""
        statement = with_owner_name(select(jobs)).order_by(jobs.c.id.desc()).limit(limit)
        if state:
            if state not in tuple(JobState):
                raise QPError(f"unknown job state {echoed(state)}: use one of {', '.join(JobState)}")
            statement = statement.where(jobs.c.state == state)
        if queue is not None:
            statement = statement.where(jobs.c.queue == queue)
        return [dict(r._mapping) for r in self.store.rows(statement)]

    def counts(self) -> dict[str, int]:
        """How many jobs are in each state (every state named, 0 where none are)."""
        rows = self.store.rows(select(jobs.c.state, func.count()).group_by(jobs.c.state))
        return {state: 0 for state in JobState} | {state: n for state, n in rows}

    def prune(self, keep_seconds: float, batch: int = PRUNE_BATCH, now: float | None = None) -> int:
        """Delete up to `batch` jobs that finished more than `keep_seconds` ago (or their queue's own `keep`, where
        it has one), with their runs, the rows naming their parents and their places in workflows and groups, in
        one transaction (retention, as Oban's pruner and Hangfire's expiration do). Returns how many: fewer than
        `batch` means none are left. A job retried meanwhile is no longer finished, and stays. On PostgreSQL a job
        of a closed range waits GRACE more for its range to go whole (prune_ranges). Oldest ids first, by the
        primary key: a scan of the table would read again, each batch, every row the batches before deleted
        (bench/prune.py --held: 8,500 jobs/s against 30,000). `now`: database time, for a test (by default the
        database's own)."""
        with self.store.engine.begin() as conn:
            kept = _kept(conn)
            closed = job_partitions.closed_ids(conn) if conn.dialect.name == "postgresql" else None
            old = and_(jobs.c.state.in_(FINISHED), _past_keep(kept, keep_seconds, now, closed))
            ids = [row[0] for row in conn.execute(select(jobs.c.id).where(old).order_by(jobs.c.id).limit(batch))]
            if ids:
                delete_finished(conn, and_(jobs.c.id.in_(ids), old))
        return len(ids)

    def prune_ranges(self, keep_seconds: float, now: float | None = None) -> int:
        """PostgreSQL: make the ranges of job ids ahead and drop each closed range whose every job finished and is
        past its keep (`keep_seconds`, or its queue's own), with its runs, payloads and keys
        (store/job_partitions.py); how many jobs went. prune deletes the rest. Elsewhere nothing (0). `now`:
        database time, for a test."""
        if self.store.engine.dialect.name != "postgresql":
            return 0
        now = self.store.ask_time() if now is None else now
        job_partitions.upkeep(self.store.engine, now)
        with self.store.engine.connect() as conn:
            kept = _kept(conn)
        past = _past_keep(kept, keep_seconds, now)
        return job_partitions.drop_ranges(self.store.engine, now, [keep_seconds, *kept.values()], past)


def _lock_queues(conn: Connection, names: tuple[str, ...]) -> None:
    """Lock the rows of queues `names` in name order, as every claim does (see sql.gates.freed): no deadlock."""
    if names:
        conn.execute(select(queues.c.name).where(queues.c.name.in_(names)).order_by(queues.c.name).with_for_update())


def _kept(conn: Connection) -> dict[str, float]:
    """The queues that keep their finished jobs for a time of their own: seconds, by name."""
    return dict(conn.execute(select(queues.c.name, queues.c.keep).where(queues.c.keep.isnot(None))).all())


# The actions on jobs picked by `which` (a condition on qp_jobs), each guarded by the states it acts on and run
# in the caller's transaction: the single actions above pick one job by id, a bulk action (store/bulk.py) a batch
# of ids. Each keeps dependencies whole (store/dependencies.py): a cancelled parent's waiting children are
# cancelled or released, a retried parent's children wait for it again.
RETRYABLE = (JobState.FAILED, JobState.CANCELLED)
UNSTARTED = (JobState.QUEUED, JobState.WAITING)


def cancel_queued(conn: Connection, which: ColumnElement[bool], reason: str = CANCELLED_BY) -> int:
    """Queued or waiting jobs are cancelled at once (no place of a limited queue is theirs: nothing to free), with
    `reason` as their last error, and their waiting children with them (an operator's cancel, a schedule's pause,
    removal, edit or dropped misses: every cancel of jobs that have not started); how many."""
    rows = conn.execute(
        update(jobs)
        .where(which, jobs.c.state.in_(UNSTARTED))
        .values(state=JobState.CANCELLED, finished_at=db_now(), last_error=reason)
        .returning(jobs.c.id, jobs.c.has_children)
    ).all()
    parents = [(job_id, JobState.CANCELLED.value) for job_id, has_children in rows if has_children]
    if parents:
        dependencies.ended(conn, parents)
    return len(rows)


def cancelled_instead(
    conn: Connection, which: ColumnElement[bool], *, refund: bool = False
) -> list[tuple[int, int, int, str]]:
    """The running jobs of `which` whose cancel was asked, about to go back to the queue (a release, a lease taken
    back, a claim of one), end cancelled instead, as the cancel asked, their children with them as a cancel
    does (with `refund`, the attempt their claim counted is given back). Each (id, attempts, fence, queue)."""
    rows = conn.execute(
        update(jobs)
        .where(which, jobs.c.state == JobState.RUNNING, jobs.c.cancel_requested == true())
        .values(
            state=JobState.CANCELLED,
            finished_at=db_now(),
            lease_until=None,
            last_error=CANCELLED_BY,
            **({"attempts": jobs.c.attempts - 1} if refund else {}),
        )
        .returning(jobs.c.id, jobs.c.attempts, jobs.c.fence, jobs.c.queue, jobs.c.has_children)
    ).all()
    parents = [(row[0], JobState.CANCELLED.value) for row in rows if row[4]]
    if parents:
        dependencies.ended(conn, parents)
    return [(job_id, attempts, fence, queue) for job_id, attempts, fence, queue, _ in rows]


def stop_running(which: ColumnElement[bool]) -> Update:
    """Running jobs are asked to stop: the owner stops each within a heartbeat and ends it under its fence."""
    return update(jobs).where(which, jobs.c.state == JobState.RUNNING).values(cancel_requested=True)


def retried(conn: Connection, which: ColumnElement[bool]) -> tuple[int, dict[int, tuple[int, str]]]:
    """Failed or cancelled jobs go back in the queue for one more attempt, gated as their queue says now, or, if
    they run after parents not all met, back to waiting for them; one whose parent failed for good or was
    cancelled stays cancelled, held by that parent, and waits for it again when that parent is retried
    (dependencies.rejoined). How many went back, and those held: {id: (parent, why)}."""
    rows = conn.execute(
        update(jobs)
        .where(which, jobs.c.state.in_(RETRYABLE))
        .values(
            state=JobState.QUEUED,
            run_at=db_now(),
            owner=None,
            finished_at=None,
            cancel_requested=False,
            max_attempts=jobs.c.attempts + 1,
            gated=gated_now(jobs.c.queue),
            vtag=tag(jobs.c.queue, jobs.c.fair_key, maybe_null=True),  # in a fair queue, a turn from now on
            held_by=None,
        )
        .returning(jobs.c.id, jobs.c.has_children)
    ).all()
    for job_id, has_children in rows:
        if has_children:
            dependencies.restore(conn, job_id)
    held = dependencies.rejoined(conn, [job_id for job_id, _ in rows])
    return len(rows) - len(held), held


def _past_keep(
    kept: dict[str, float], default: float, now: float | None = None, closed: ColumnElement[bool] | None = None
) -> ColumnElement[bool]:
    """A job that finished longer ago than its queue keeps them: `kept` by the queues with a time of their own
    (seconds, by name; few), `default` by every other. Written out per queue, not a join per row. With `closed`
    (PostgreSQL: the jobs of closed ranges, job_partitions.closed_ids), those only GRACE past their keep: their
    range goes whole first unless it is held. `now`: database time, for a test (by default the database's own)."""
    at = db_now() if now is None else literal(now)

    def past(keep: float) -> ColumnElement[bool]:
        if closed is None:
            return jobs.c.finished_at < at - keep
        waited = ~closed | (jobs.c.finished_at < at - keep - job_partitions.GRACE)
        return and_(jobs.c.finished_at < at - keep, waited)

    found = past(default)
    if kept:
        found = and_(jobs.c.queue.notin_(sorted(kept)), found)
    for name, keep in sorted(kept.items()):
        found = found | and_(jobs.c.queue == name, past(keep))
    return found


def delete_finished(conn: Connection, which: ColumnElement[bool]) -> int:
    """Delete the finished jobs of `which`, their runs and their places in dependencies and flows; how many went."""
    gone = [row[0] for row in conn.execute(delete(jobs).where(which, jobs.c.state.in_(FINISHED)).returning(jobs.c.id))]
    if gone:
        conn.execute(delete(runs).where(runs.c.job_id.in_(gone)))
        conn.execute(delete(deps).where(deps.c.child_id.in_(gone)))
        conn.execute(delete(flow_jobs).where(flow_jobs.c.job_id.in_(gone)))
    return len(gone)


def _ran_out(before: float | None = None) -> list[Any]:
    """A running job whose lease ran out (before `before` too, database time, if given): what a take-over takes,
    as the statements outside the claim state it (the claim states it with its own bound time: see
    sql.claim.claim_statement)."""
    return [
        jobs.c.state == JobState.RUNNING,
        jobs.c.lease_until < db_now(),
        *([jobs.c.lease_until < before] if before is not None else []),
    ]


def _expired_runs(conn: Connection, before: float | None) -> dict[int, tuple[int, float]]:
    """{job id: (owner, started_at)} of the running jobs whose lease ran out (before `before`), locked for
    the transaction as a claim locks them: whose runs a take-over that follows in it ends as lost (the
    claim statement does it itself on PostgreSQL)."""
    rows = conn.execute(
        select(jobs.c.id, jobs.c.owner, jobs.c.started_at)
        .where(*_ran_out(before))
        .with_for_update(skip_locked=True)
        .with_hint(jobs, "WITH (UPDLOCK, ROWLOCK, READPAST)", "mssql")
    )
    return {row[0]: (row[1], row[2]) for row in rows}


def _end_lost(conn: Connection, ended: Sequence[tuple[int, int, int, float, int]]) -> None:
    """The rows of runs that ended lost, each (job id, attempt, machine, started_at, fence), written once
    (a run in progress is its job's row: see history.run_history)."""
    if ended:
        conn.execute(
            insert(runs).values(finished_at=db_now(), outcome=Outcome.LOST, error=LOST),
            [
                dict(job_id=job_id, attempt=attempt, machine_id=machine, started_at=started, fence=fence)
                for job_id, attempt, machine, started, fence in ended
            ],
        )


def _stop_asked(conn: Connection, machine_id: int, claimed: list[Claimed]) -> list[Claimed]:
    """A claim never starts a job whose cancel was asked (taken over from a machine whose lease ran out before it
    could stop it): such a job, now ours under its new fence, ends cancelled at once with its attempt given back
    (if this transaction is lost, its lease runs out again and the next claim does it). The others."""
    asked = [c for c in claimed if c.cancel_requested]
    for c in asked:
        ours = and_(jobs.c.id == c.id, jobs.c.fence == c.fence, jobs.c.owner == machine_id)
        free_places(conn, [queue for *_, queue in cancelled_instead(conn, ours, refund=True)])
    return [c for c in claimed if not c.cancel_requested]


def _most_urgent_first(claimed: Iterable[Claimed]) -> list[Claimed]:
    """RETURNING has no order; start the most urgent first."""
    return sorted(claimed, key=lambda c: (-c.priority, c.run_at, c.id))
