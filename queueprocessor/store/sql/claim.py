"""The claim, built once per shape (ClaimShape): the rules it keeps are JobStore.claim's. Everything that varies
is a bound parameter, so SQLAlchemy compiles each shape once and a busy node spends its time running work, not
building SQL."""

import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Float,
    Integer,
    String,
    Text,
    and_,
    any_,
    bindparam,
    cast,
    exists,
    false,
    func,
    insert,
    literal,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.sql import ColumnElement, Select
from sqlalchemy.sql.elements import BindParameter

from ...rules.states import JobState, Outcome
from ..dbtime import db_now
from ..schema import Id, jobs, queues, runs, turns
from .due import due, unpaused
from .fair import key_columns, key_room, within_key_budgets
from .gates import branch_room, counted, held_queues, holds_back
from .portable import among
from .turns import TURN_COLUMNS, guarded_due, looks, turn_row

LOST = "lease expired: the machine stopped renewing it"


@dataclass(frozen=True)
class ClaimShape:
    """One shape of the claim (see JobStore.claim): what varies between its statements, each built and compiled once
    (everything else is a bound parameter)."""

    dialect: str
    take_expired: bool = True  # take over running jobs whose lease ran out too (the take-over branch)
    bounded: bool = False  # ... only those whose lease ran out before `b_before`
    top: int | None = None  # SQL Server: the limit as a plain number, for its TOP (see `limit`)
    served: bool = False  # only jobs of the queues in `b_served`
    branches: tuple[bool, ...] = ()  # a branch of its own per queue `b_q{i}`; True where that queue is guarded
    keyed: tuple[bool, ...] = ()  # per branch: True where that queue has a limit or rate per key (sql/fair.py)
    turn: bool = False  # PostgreSQL: record the turn of slot `b_slot` first, and claim only if it was ours
    guarded: bool = False  # with `turn`: claim nothing while guarded work is due (see guarded_due)
    elsewhere: bool = False  # with `turn`: ask elsewhere_due too (see `looks`)
    ends: bool = False  # with `turn`: only while the slot lasts (see turn_row)

    @property
    def whole(self) -> bool:
        """PostgreSQL's data-modifying CTEs: the statement itself locks the guarded queues' rows, ends the runs it
        takes over as lost, counts what it started, and records the turn; elsewhere the store's transaction does."""
        return self.dialect == "postgresql"

    @property
    def limit(self) -> Any:
        """How many jobs the claim takes: `b_limit`; SQL Server says TOP only for a plain number (for a parameter
        it would number every due row with ROW_NUMBER()), so there each limit is a shape of its own."""
        return self.top or bindparam("b_limit", type_=Integer)


@functools.cache
def claim_statement(shape: ClaimShape) -> Any:
    """The claim of `shape` (see ClaimShape).

    Queued and expired jobs are picked apart and merged: each branch follows an index in order
    (ix_qp_jobs_queued, ix_qp_jobs_gated, ix_qp_jobs_lease) instead of sorting the whole backlog per claim: the
    main branch (_main_pick), a branch per queue claimed on its own (_queue_pick), the take-over (_takeover_pick).
    On PostgreSQL the same statement ends as lost the runs of the jobs it takes over and, with `turn`, first
    records the turn (_turn_claim), claiming only if that record went in: an idle turn is one statement.

    Queues (docs/design.md §9): never a queued job of a paused queue, nor of a queue with a farm-wide limit or
    rate except through its branch of its own. On PostgreSQL the statement locks the rows of those guarded
    queues itself and counts what it started on them (held_queues, counted). A queued job of an order key must be
    next in line (in_order).
    """
    j = jobs.alias("j")
    now = db_now()
    recorded = _turn_record(shape.ends) if shape.turn else None
    gate = _turn_gate(shape, recorded) if recorded is not None else true()
    alone = [bindparam(f"b_q{i}", type_=String) for i in range(len(shape.branches))]
    locking = [name for name, locked in zip(alone, shape.branches) if locked]
    held = held_queues(shape.dialect, locking) if shape.whole and shape.branches else None
    waiting, mine = due(j), _served(shape, j)  # each built once: the branches share their bound parameters
    picks = [_main_pick(shape, j, gate, waiting, mine, alone)]
    picks += [_queue_pick(shape, j, gate, waiting, i, name, held) for i, name in enumerate(alone)]
    if shape.take_expired:
        picks.append(_takeover_pick(shape, j, gate, mine, now))
    pick = _merged(shape, picks, held)
    if not shape.whole:
        return _claim_update(shape, jobs.c.id.in_(pick), now)
    # A LIMIT ... FOR UPDATE subquery inside IN () may be rescanned by the
    # planner and take more than `limit` rows; a materialised CTE runs once.
    picked = pick.cte("picked").prefix_with("MATERIALIZED")
    update_picked = _claim_update(shape, _one_of(picked), now)
    ending = [_lost(picked, now).cte("lost")] if shape.take_expired else []
    if held is not None:
        ending.append(counted(shape.dialect, picked, held, shape.take_expired).cte("counted"))
    if recorded is None:  # the update itself is the statement: no scan of its rows by a SELECT around it
        return update_picked.add_cte(picked, *ending)
    return _turn_claim(shape, recorded, update_picked.cte("claimed")).add_cte(*ending)


def _one_of(picked: Any) -> ColumnElement[bool]:
    """PostgreSQL: a job is one of the `picked` ids, gathered into one array first. Written `id IN (SELECT id FROM
    picked)`, the planner hashed the picked ids into a set before it looked each up (bench/claim_cost.py: 8% of the
    claim's server time per job, and 0.9 buffers a job more); with the array, one index scan looks them all up in
    the order of their keys. Either way each job is read in the version the claim's snapshot sees, which an update
    of it follows to the version the pick locked (a row found by its ctid instead would be skipped when it was
    changed since the snapshot, though picked and locked: see _lost)."""
    from sqlalchemy.dialects.postgresql import ARRAY  # PostgreSQL's own: loaded only by a farm on it

    ids = select(func.array_agg(picked.c.id)).scalar_subquery()
    # qp_jobs is partitioned by range of id (store/job_partitions.py), and PostgreSQL 15 prunes no partition at run
    # time for `id = ANY(array)`: it does for the picked ids' bounds, so the update probes only the ranges they span
    # (bench/claim_cost.py, a week of ranges kept: 26.6 buffers a job without them, 12.6 with).
    lowest, highest = select(func.min(picked.c.id)).scalar_subquery(), select(func.max(picked.c.id)).scalar_subquery()
    return and_(jobs.c.id == any_(cast(ids, ARRAY(BigInteger))), jobs.c.id >= lowest, jobs.c.id <= highest)


def _turn_record(ends: bool) -> Any:
    """PostgreSQL: the record of slot `b_slot`'s turn (turn_row) as a CTE, none if another machine has the slot."""
    from sqlalchemy.dialects.postgresql import insert as pg_insert

    return (
        pg_insert(turns)
        .from_select(TURN_COLUMNS, turn_row(ends))
        .on_conflict_do_nothing(index_elements=[turns.c.slot])
        .returning(turns.c.slot)
        .cte("turn")
    )


def _turn_gate(shape: ClaimShape, recorded: Any) -> ColumnElement[bool]:
    """A turn's claim picks only if the turn was recorded (it was ours) and, with `guarded`, no guarded work is
    due (then the node claims every queue in one locked claim instead)."""
    gate: ColumnElement[bool] = exists(select(recorded.c.slot))
    return and_(gate, ~guarded_due(shape.dialect)) if shape.guarded else gate


def _picked_columns(j: Any) -> list[Any]:
    """What each branch's pick gives the merge (see _merged)."""
    return [j.c.id, j.c.priority, j.c.run_at, j.c.state, j.c.owner, j.c.started_at, j.c.attempts, j.c.fence, j.c.queue]


def _best(
    shape: ClaimShape,
    j: Any,
    gate: ColumnElement[bool],
    where: ColumnElement[bool],
    most: Any = None,
    *,
    fair: bool = False,
    keyed: bool = False,
) -> Any:
    """The best `most` (the claim's limit) jobs `j` that `where` and `gate` allow, best priority first, then (`fair`:
    in a held-back queue, whose fair jobs have a virtual start tag) by that tag, then oldest, locked and skipped
    while another claim holds them; `keyed`, with what limits and rates per key count (sql/fair.py)."""
    tagged = [j.c.vtag] if fair else []
    counts = key_columns(shape.dialect, j) if keyed else []
    return (
        select(*_picked_columns(j), *counts)
        .where(where, gate)
        .order_by(j.c.priority.desc(), *tagged, j.c.run_at, j.c.id)
        .limit(shape.limit if most is None else most)
        .with_for_update(skip_locked=True)
        .with_hint(j, "WITH (UPDLOCK, ROWLOCK, READPAST)", "mssql")
        .subquery()
    )


def _served(shape: ClaimShape, j: Any) -> ColumnElement[bool]:
    """With `served`, only jobs of the node's queues (`b_served`)."""
    return among(shape.dialect, j.c.queue, "b_served") if shape.served else true()


def _main_pick(
    shape: ClaimShape,
    j: Any,
    gate: ColumnElement[bool],
    waiting: ColumnElement[bool],
    mine: ColumnElement[bool],
    alone: list[BindParameter[str]],
) -> Any:
    """The plain claim: due jobs off the index of ungated jobs (a gated one's queue holds it back), not of a queue
    claimed in a branch of its own. It still checks the queue's row, for the moment between a row's change and
    the flags it sets (QueueStore.put)."""
    q = queues.alias("q")
    held_back = select(q.c.name).where(holds_back(q))
    return _best(
        shape,
        j,
        gate,
        and_(
            waiting,
            j.c.gated == false(),
            mine,
            j.c.queue.notin_(held_back),
            *([j.c.queue.notin_(alone)] if alone else []),
        ),
    )


def _queue_pick(
    shape: ClaimShape, j: Any, gate: ColumnElement[bool], waiting: ColumnElement[bool], i: int, name: Any, held: Any
) -> Any:
    """Branch `i`: queue `b_q{i}`'s due jobs on their own, at most as many as branch_room allows: from the gated jobs'
    index when the queue is guarded (so its jobs are gated; a fair queue's in their virtual time), else from the
    main one; with a limit or rate per key, only jobs their keys have room for (sql/fair.py)."""
    guarded, keyed = shape.branches[i], i < len(shape.keyed) and shape.keyed[i]
    room = branch_room(shape.dialect, i, shape.limit, held, keyed)
    where = and_(waiting, j.c.gated == (true() if guarded else false()), j.c.queue == name)
    if not keyed:
        return _best(shape, j, gate, where, room, fair=guarded)
    each = _best(shape, j, gate, and_(where, key_room(shape.dialect, j)), room, fair=True, keyed=True)
    return within_key_budgets(each, [c.name for c in _picked_columns(j)])


def _expired(shape: ClaimShape, table: Any, now: Any) -> ColumnElement[bool]:
    """A lease of `table`'s row ran out (with `bounded`, before `b_before` too: a claim that a stalled database
    held up does not take the leases that ran out during the stall)."""
    ran_out = table.c.lease_until < now
    return and_(ran_out, table.c.lease_until < bindparam("b_before", type_=Float)) if shape.bounded else ran_out


def _takeover_pick(shape: ClaimShape, j: Any, gate: ColumnElement[bool], mine: ColumnElement[bool], now: Any) -> Any:
    """The take-over: running jobs whose lease ran out, of a queue that is not paused."""
    return _best(shape, j, gate, and_(j.c.state == JobState.RUNNING, _expired(shape, j, now), mine, unpaused(j)))


def _merged(shape: ClaimShape, picks: list[Any], held: Any) -> Any:
    """The ids the claim takes: its one branch's, or the best of its branches' merged. On PostgreSQL the picked rows
    also say which run a taken-over job leaves (see _lost) and, with guarded queues, which queue each is of."""
    either = (
        union_all(*(p if isinstance(p, Select) else select(p) for p in picks)).subquery()
        if len(picks) > 1
        else picks[0]
    )
    taken_from = (
        [either.c.state, either.c.owner, either.c.started_at, either.c.attempts, either.c.fence]
        if shape.whole and shape.take_expired
        else []
    )
    pick = select(either.c.id, *taken_from, *([either.c.queue] if held is not None else []))
    if len(picks) > 1:
        pick = pick.order_by(either.c.priority.desc(), either.c.run_at, either.c.id).limit(shape.limit)
    return pick


def _claim_update(shape: ClaimShape, picked: ColumnElement[bool], now: Any) -> Any:
    """The claim's one write: the jobs `picked` names, still claimable (queued, or running with a lease that ran
    out), running now under `b_machine`'s lease with the next fence; it returns what Claimed holds."""
    guard = or_(jobs.c.state == JobState.QUEUED, and_(jobs.c.state == JobState.RUNNING, _expired(shape, jobs, now)))
    return (
        update(jobs)
        .where(picked, guard)
        .values(
            state=JobState.RUNNING,
            owner=bindparam("b_machine", type_=Id),
            fence=jobs.c.fence + 1,
            attempts=jobs.c.attempts + 1,
            lease_until=now + bindparam("b_lease", type_=Float),
            started_at=now,
            finished_at=None,
            progress=None,  # a new run has said nothing yet
            progress_message=None,
        )
        .returning(
            jobs.c.id,
            jobs.c.executor,
            jobs.c.target,
            jobs.c.method,
            jobs.c.payload,
            jobs.c.attempts,
            jobs.c.max_attempts,
            jobs.c.timeout,
            jobs.c.fence,
            jobs.c.run_at,
            jobs.c.priority,
            jobs.c.kind,
            jobs.c.queue,
            jobs.c.cancel_requested,
        )
    )


def _turn_claim(shape: ClaimShape, recorded: Any, claimed: Any) -> Any:
    """PostgreSQL's turn and claim in one: one row per job claimed, or one without a job, each starting with `won`
    (1 or 0) and the turn's looks (`elsewhere_due` asked only when the claim left room: see `looks`)."""
    won = select(func.count()).select_from(recorded).scalar_subquery().label("won")
    room_left = select(func.count()).select_from(claimed).scalar_subquery() < shape.limit
    one = select(literal(1).label("one")).subquery("one")
    return select(won, *looks(shape.dialect, shape.guarded, shape.elsewhere, room_left), *claimed.c).select_from(
        one.outerjoin(claimed, true())
    )


def _lost(picked: Any, now: Any) -> Any:
    """A run's row is written once, when it ends (see RunStore.finish); while it runs, it is its job's row. A job a
    claim takes over from a machine whose lease ran out ends that machine's run as lost, in the same statement:
    the picked rows that were running, as they were (every picked row is claimed: the pick locked it, and the
    claim's guard is the condition it was picked on). Joined to the claimed rows instead, the planner, thinking
    each side one row, matched every claimed row against every picked one: 256 x 256 a claim at --capacity 256."""
    return insert(runs).from_select(
        ["job_id", "attempt", "machine_id", "fence", "started_at", "finished_at", "outcome", "error"],
        select(
            picked.c.id,
            picked.c.attempts,
            picked.c.owner,
            picked.c.fence,
            picked.c.started_at,
            now,
            literal(Outcome.LOST, String),
            literal(LOST, Text),
        ).where(picked.c.state == JobState.RUNNING),
    )
