"""The hot statements, built once per shape: claiming work, recording how it ended, and a machine's check-in
with the roster version it bumps (store/roster.py reads that version).

Everything that varies is a bound parameter, so SQLAlchemy compiles each shape
once and a busy node spends its time running work, not building SQL. The
rules they keep are JobStore.claim's, RunStore.finish's and MachineStore.heartbeat's.
"""

import functools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    Integer,
    String,
    Text,
    and_,
    any_,
    bindparam,
    case,
    cast,
    column,
    exists,
    false,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.elements import BindParameter

from ..rules.queues import OnFailure
from ..rules.states import JobState, Outcome
from .dbtime import db_now
from .schema import STATE_SQL, Id, jobs, machines, queues, roster_version, runs, turns

LOST = "lease expired: the machine stopped renewing it"


def _least(dialect: str, *values: Any) -> Any:
    """The smallest of `values`, none of them NULL: SQLite's many-argument min(), PostgreSQL's least(); SQL
    Server has least() only from 2022 on, so there nested CASEs, which 2017 and 2019 run too."""
    if dialect == "mssql":
        return functools.reduce(lambda a, b: case((a <= b, a), else_=b), values)
    return (func.min if dialect == "sqlite" else func.least)(*values)


def _greatest(dialect: str, *values: Any) -> Any:
    """The largest of `values`, none of them NULL (see _least)."""
    if dialect == "mssql":
        return functools.reduce(lambda a, b: case((a >= b, a), else_=b), values)
    return (func.max if dialect == "sqlite" else func.greatest)(*values)


def bucket(dialect: str, q: Any) -> Any:
    """The tokens a queue's rate bucket holds now, in database time: what it held, refilled since, at most
    its burst (a bucket never spent is full; a queue without a rate has none, NULL)."""
    refill = (db_now() - q.c.refilled_at) * q.c.rate_count / q.c.rate_per
    return case((q.c.tokens.is_(None), q.c.burst), else_=_least(dialect, q.c.burst, q.c.tokens + refill))


def _guarded(q: Any) -> Any:
    """Queue row `q` has a farm-wide limit or rate: its jobs start only within them."""
    return or_(q.c.max_running.isnot(None), q.c.rate_count.isnot(None))


def _holds_back(q: Any) -> Any:
    """Queue row `q` keeps its jobs from the claim's main branch: it is paused, or guarded (see _guarded)."""
    return or_(q.c.paused, _guarded(q))


def gated_now(queue: ColumnElement[str]) -> ColumnElement[bool]:
    """Whether a job of `queue` (a column or a value) is gated now: its queue's row holds its jobs back (see
    _holds_back). Every statement that makes a job queued from outside running sets it so (an enqueue, a retry);
    a change of the row sets it again for the queue's unfinished jobs (QueueStore.put, regate_statements)."""
    g = queues.alias("gq")
    return case((exists(select(g.c.name).where(g.c.name == queue, _holds_back(g))), true()), else_=false())


@functools.cache
def regate_statements(one: bool = False) -> tuple[Any, ...]:
    """The updates that set the gated flag of every queued or running job (with `one`, of queue `b_queue` only)
    to what its queue's row says now: queued jobs to gate, each walking the index it is in (when no queue holds
    its jobs back, the first reads nothing), queued jobs to let go, and running jobs, which keep their flag for
    when they are queued again (a retry, a lost lease)."""
    which = [jobs.c.queue == bindparam("b_queue", type_=String)] if one else []
    q = queues.alias("rq")
    holding = select(q.c.name).where(_holds_back(q))
    queued, running = jobs.c.state == JobState.QUEUED, jobs.c.state == JobState.RUNNING
    return (
        update(jobs).where(queued, jobs.c.gated == false(), jobs.c.queue.in_(holding), *which).values(gated=true()),
        update(jobs).where(queued, jobs.c.gated == true(), jobs.c.queue.notin_(holding), *which).values(gated=false()),
        update(jobs)
        .where(running, jobs.c.gated != gated_now(jobs.c.queue), *which)
        .values(gated=gated_now(jobs.c.queue)),
    )


def _cut(dialect: str, q: Any, mine: Any) -> Any:
    """`mine` cut to the room guarded queue row `q` gives: its free places under the limit, its bucket's whole
    tokens. (SQLAlchemy gives SQLite a floor() of its own, in Python, that fails on NULL: hence the CASE.)"""
    tokens = case((q.c.rate_count.is_(None), mine), else_=cast(func.floor(bucket(dialect, q)), Integer))
    return _least(dialect, mine, func.coalesce(q.c.max_running - q.c.running, mine), tokens)


def taken(dialect: str, n: Any) -> dict[str, Any]:
    """What starting `n` jobs of a queue does to its row: `n` more running, if it is limited, and `n` tokens
    spent, if it is rated (from the bucket as it is now, in database time)."""
    q = queues
    rated = q.c.rate_count.isnot(None)
    return dict(
        running=case((q.c.max_running.isnot(None), q.c.running + n), else_=q.c.running),
        tokens=case((rated, bucket(dialect, q) - n), else_=q.c.tokens),
        refilled_at=case((rated, db_now()), else_=q.c.refilled_at),
    )


@functools.cache
def taken_statement(dialect: str) -> Any:
    """Where the claim cannot count for itself (all but PostgreSQL): `b_spent` jobs of queue `b_queue` started,
    written in the claim's transaction, under the row's lock."""
    return (
        update(queues)
        .where(queues.c.name == bindparam("b_queue"))
        .values(**taken(dialect, bindparam("b_spent", type_=Integer)))
    )


def freed(counts: Any) -> Any:
    """The running counts of limited queues lowered by `counts`' rows (queue, n: how many of its jobs left
    running), their rows locked in name order first, as every claim locks them, so the two never deadlock."""
    limited = (
        select(queues.c.name)
        .where(queues.c.name.in_(select(counts.c.queue)), queues.c.max_running.isnot(None))
        .order_by(queues.c.name)
        .with_for_update()
        .cte("limited")
    )
    return (
        update(queues)
        .where(queues.c.name == counts.c.queue, queues.c.name.in_(select(limited.c.name)))
        .values(running=queues.c.running - counts.c.n)
    )


@functools.cache
def freed_statement() -> Any:
    """Where jobs leave running in a transaction of several statements (a release, a requeue, a finish on all
    but PostgreSQL): `b_freed` jobs of queue `b_queue` did, which lowers its running count if it is limited.
    Run per queue in name order (see `freed`)."""
    return (
        update(queues)
        .where(queues.c.name == bindparam("b_queue"), queues.c.max_running.isnot(None))
        .values(running=queues.c.running - bindparam("b_freed", type_=Integer))
    )


def free_places(conn: Connection, queues_left: Iterable[str]) -> None:
    """Jobs of these queues (one name per job) left running in this transaction: their limited queues' running
    counts go down with them, in name order (see `freed`)."""
    left = Counter(queues_left)
    if left:
        conn.execute(freed_statement(), [dict(b_queue=q, b_freed=n) for q, n in sorted(left.items())])


@functools.cache
def recount_statement(one: bool = False) -> Any:
    """The running count of every limited queue (with `one`, of queue `b_queue` only), counted afresh from its
    jobs (see QueueStore.recount)."""
    r = jobs.alias("r")
    running = select(func.count()).select_from(r).where(r.c.queue == queues.c.name, r.c.state == JobState.RUNNING)
    which = [queues.c.name == bindparam("b_queue", type_=String)] if one else []
    return update(queues).where(queues.c.max_running.isnot(None), *which).values(running=running.scalar_subquery())


def _held(dialect: str, names: list[BindParameter[str]]) -> Any:
    """PostgreSQL: the rows of the claim's guarded queues (`names`: the queue parameters of the branches that
    lock) that can give it work now (not paused, a free place, a whole token, a job due), locked in name order.
    A locking read returns each row as the last claim or finish that held it left it, where the statement's
    snapshot may be older: so the claim cuts its branches to the room the row gives now, and counts what it took
    on the row, in the same statement (docs/design.md §9).
    The rows are named one parameter each, not by one array: planned for any array, the server guessed ten rows
    and costed the plan it keeps above one for the names at hand, so it planned the claim afresh at every run
    (1 ms, as much as the run)."""
    h = queues.alias("h")
    g = jobs.alias("hj")
    return (
        select(
            h.c.name, h.c.max_running, h.c.running, h.c.rate_count, h.c.rate_per, h.c.burst, h.c.tokens, h.c.refilled_at
        )
        .where(
            h.c.name.in_(names) if names else false(),
            h.c.paused == false(),
            or_(h.c.max_running.is_(None), h.c.running < h.c.max_running),
            or_(h.c.rate_count.is_(None), bucket(dialect, h) >= 1),
            exists(select(g.c.id).where(g.c.gated == true(), g.c.queue == h.c.name, due(g))),
        )
        .order_by(h.c.name)
        .with_for_update()
        .cte("held")
    )


def _room(dialect: str, i: int, limit: Any, held: Any = None) -> Any:
    """How many queued jobs branch `i` of a claim may take from queue `b_q{i}`: the room the node gives it
    (`b_room{i}`: its own limit for the queue, or its free room), cut, for a queue with a farm-wide limit or
    rate, to the room its row gives (see _cut): as the claim statement locked it (`held`, PostgreSQL), or as
    the claim's transaction locked it before (JobStore.claim). None at all from a paused queue, or from a guarded
    one that the node did not know as guarded (`b_locked{i}` false: it has not read the settings yet)."""
    q = queues.alias(f"q{i}")
    mine = bindparam(f"b_room{i}", type_=Integer)
    if held is None:
        cut = _cut(dialect, q, mine)
    else:  # no held row: the queue gives no room now
        cut = func.coalesce(select(_cut(dialect, held, mine)).where(held.c.name == q.c.name).scalar_subquery(), 0)
    room = case(
        (q.c.paused, 0),
        (and_(_guarded(q), bindparam(f"b_locked{i}", type_=Boolean) == false()), 0),
        (_guarded(q), cut),
        else_=mine,
    )
    found = select(room).where(q.c.name == bindparam(f"b_q{i}", type_=String)).scalar_subquery()
    return _greatest(dialect, _least(dialect, func.coalesce(found, mine), limit), 0)


def in_order(j: Any) -> Any:
    """A job of an order key may start only when no job of its key runs and none enqueued before it is still
    waiting (or, when its queue says OnFailure.BLOCK, failed for good): so the key's jobs run one at a time, in
    the order they were enqueued, whoever claims them."""
    o = jobs.alias("o")
    p = queues.alias("p")
    # o's queue is j's: named through o, the sub-select is correlated with the query it sits in (through j, two
    # levels up, it was not: any BLOCK queue's row then blocked every key).
    blocks = exists(select(p.c.name).where(p.c.name == o.c.queue, p.c.on_failure == OnFailure.BLOCK))
    ahead = exists(
        select(o.c.id).where(
            o.c.queue == j.c.queue,
            o.c.order_key == j.c.order_key,
            o.c.id != j.c.id,
            or_(
                o.c.state == JobState.RUNNING,
                and_(o.c.id < j.c.id, or_(o.c.state == JobState.QUEUED, and_(o.c.state == JobState.FAILED, blocks))),
            ),
        )
    )
    return or_(j.c.order_key.is_(None), ~ahead)


def among(dialect: str, column: Any, name: str) -> Any:
    """`column` is one of the names in list parameter `name` (PostgreSQL: one array, so one statement text
    whatever the list's length)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import ARRAY  # PostgreSQL's own: loaded only by a farm on it

        return column == any_(cast(bindparam(name), ARRAY(String)))
    return column.in_(bindparam(name, expanding=True))


def due(j: Any, horizon: bool = True) -> Any:
    """Job `j` is queued, due (within `b_horizon` seconds from now, or now) and next in line for its key."""
    when = db_now() + bindparam("b_horizon", type_=Float) if horizon else db_now()
    return and_(j.c.state == JobState.QUEUED, j.c.run_at <= when, in_order(j))


def unpaused(j: Any) -> Any:
    """Job `j`'s queue is not paused."""
    q = queues.alias("qp")
    return j.c.queue.notin_(select(q.c.name).where(q.c.paused))


def guarded_due(dialect: str) -> Any:
    """The turn's look at the queues it does not claim from (docs/design.md §9): is a job of one of `b_guarded` (the
    node's queues with a farm-wide limit or rate, claimed only under their row's lock) due within the horizon,
    next in line for its key and not paused? If so, the turn claims nothing and the node makes one locked claim
    of every queue, so the queues' jobs are taken in one order of priority."""
    g = jobs.alias("g")
    return exists(
        select(g.c.id).where(g.c.gated == true(), due(g), among(dialect, g.c.queue, "b_guarded"), unpaused(g))
    )


def elsewhere_due(dialect: str) -> Any:
    """The turn's other look: is a job due now in a queue the node does not serve (`b_served`) but a live
    peer does (one of `b_elsewhere`, or any with `b_any_other`: a peer serves every queue), not paused? If so
    the turn is flagged as a backlog, so a machine that serves it claims at once."""
    e = jobs.alias("e")
    theirs = or_(bindparam("b_any_other", type_=Boolean), among(dialect, e.c.queue, "b_elsewhere"))
    return exists(
        select(e.c.id).where(
            e.c.gated == false(), due(e, horizon=False), theirs, ~among(dialect, e.c.queue, "b_served"), unpaused(e)
        )
    )


def looks(dialect: str, guarded: bool, elsewhere: bool, room_left: Any = None) -> list[Any]:
    """The two looks as columns `guarded_due` and `elsewhere_due`, NULL where not asked (elsewhere_due also
    where the condition `room_left` does not hold: a full turn-holder first asks about its own backlog)."""
    guarded_look = case((guarded_due(dialect), true()), else_=false()) if guarded else null()
    elsewhere_look: ColumnElement[Any] = null()
    if elsewhere:
        skip = [] if room_left is None else [(~room_left, null())]
        elsewhere_look = case(*skip, (elsewhere_due(dialect), true()), else_=false())
    # Each in a sub-select of its own: in SQLite's RETURNING, SQLAlchemy would drop the aliases from its columns.
    return [
        select(guarded_look).scalar_subquery().label("guarded_due"),
        select(elsewhere_look).scalar_subquery().label("elsewhere_due"),
    ]


TURN_COLUMNS = ["slot", "machine_id", "taken_at", "claimed", "backlog"]


def turn_row(ends: bool) -> Any:
    """The row of slot `b_slot`'s turn, taken by `b_machine` now. With `ends`, only while that slot lasts in
    database time (until `b_ends`): an insert held up on its way past the slot's end would otherwise poll
    beside the next slot's own turn, two polls in one slot (docs/design.md §2)."""
    now = db_now()
    row = select(
        bindparam("b_slot", type_=BigInteger),
        bindparam("b_machine", type_=Id),
        now,
        literal_column("0", Integer),
        false(),
    )
    return row.where(now < bindparam("b_ends", type_=Float)) if ends else row


@functools.cache
def turn_statement(dialect: str, guarded: bool, elsewhere: bool, ends: bool = False) -> Any:
    """Where the claim cannot record the turn itself (all but PostgreSQL): the record of slot `b_slot` (see
    turn_row; none if it came too late), returning the turn's looks (see `looks`) on SQLite; SQL Server allows
    no sub-select in OUTPUT, so it asks them apart (looks_statement)."""
    record = insert(turns).from_select(TURN_COLUMNS, turn_row(ends))
    if dialect == "mssql":
        return record
    return record.returning(turns.c.slot, *looks(dialect, guarded, elsewhere))


@functools.cache
def looks_statement(dialect: str, guarded: bool, elsewhere: bool) -> Any:
    """SQL Server's turn looks, asked after its turn record (see turn_statement)."""
    return select(*looks(dialect, guarded, elsewhere))


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
    queues itself and counts what it started on them (_held, _counted). A queued job of an order key must be
    next in line (in_order).
    """
    j = jobs.alias("j")
    now = db_now()
    recorded = _turn_record(shape.ends) if shape.turn else None
    gate = _turn_gate(shape, recorded) if recorded is not None else true()
    alone = [bindparam(f"b_q{i}", type_=String) for i in range(len(shape.branches))]
    locking = [name for name, locked in zip(alone, shape.branches) if locked]
    held = _held(shape.dialect, locking) if shape.whole and shape.branches else None
    waiting, mine = due(j), _served(shape, j)  # each built once: the branches share their bound parameters
    picks = [_main_pick(shape, j, gate, waiting, mine, alone)]
    picks += [_queue_pick(shape, j, gate, waiting, i, name, held) for i, name in enumerate(alone)]
    if shape.take_expired:
        picks.append(_takeover_pick(shape, j, gate, mine, now))
    pick = _merged(shape, picks, held)
    if not shape.whole:
        return _claim_update(shape, pick, now)
    # A LIMIT ... FOR UPDATE subquery inside IN () may be rescanned by the
    # planner and take more than `limit` rows; a materialised CTE runs once.
    picked = pick.cte("picked").prefix_with("MATERIALIZED")
    claimed = _claim_update(shape, select(picked.c.id), now).cte("claimed")
    ending = [_lost(picked, now).cte("lost")] if shape.take_expired else []
    if held is not None:
        ending.append(_counted(shape.dialect, picked, held, shape.take_expired).cte("counted"))
    if recorded is None:
        return select(claimed).add_cte(*ending)
    return _turn_claim(shape, recorded, claimed).add_cte(*ending)


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


def _best(shape: ClaimShape, j: Any, gate: ColumnElement[bool], where: ColumnElement[bool], most: Any = None) -> Any:
    """The best `most` (the claim's limit) jobs `j` that `where` and `gate` allow, best priority first, locked and
    skipped while another claim holds them."""
    return (
        select(
            j.c.id,
            j.c.priority,
            j.c.run_at,
            j.c.state,
            j.c.owner,
            j.c.started_at,
            j.c.attempts,
            j.c.fence,
            j.c.queue,
        )
        .where(where, gate)
        .order_by(j.c.priority.desc(), j.c.run_at, j.c.id)
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
    held_back = select(q.c.name).where(_holds_back(q))
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
    """Branch `i`: queue `b_q{i}`'s due jobs on their own, at most as many as _room allows: from the gated jobs'
    index when the queue is guarded (so its jobs are gated), else from the main one."""
    gated = true() if shape.branches[i] else false()
    room = _room(shape.dialect, i, shape.limit, held)
    return _best(shape, j, gate, and_(waiting, j.c.gated == gated, j.c.queue == name), room)


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
    either = union_all(*(select(p) for p in picks)).subquery() if len(picks) > 1 else picks[0]
    taken_from = (
        [either.c.state, either.c.owner, either.c.started_at, either.c.attempts, either.c.fence]
        if shape.whole and shape.take_expired
        else []
    )
    pick = select(either.c.id, *taken_from, *([either.c.queue] if held is not None else []))
    if len(picks) > 1:
        pick = pick.order_by(either.c.priority.desc(), either.c.run_at, either.c.id).limit(shape.limit)
    return pick


def _claim_update(shape: ClaimShape, pick: Any, now: Any) -> Any:
    """The claim's one write: the picked jobs, still claimable (queued, or running with a lease that ran out),
    running now under `b_machine`'s lease with the next fence; it returns what Claimed holds."""
    guard = or_(jobs.c.state == JobState.QUEUED, and_(jobs.c.state == JobState.RUNNING, _expired(shape, jobs, now)))
    return (
        update(jobs)
        .where(jobs.c.id.in_(pick), guard)
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


def _counted(dialect: str, picked: Any, held: Any, take_expired: bool) -> Any:
    """What a claim started of each guarded queue whose row it holds (see _held), counted on that row in the
    same statement: the picked rows that were queued (every picked row is claimed, see _lost), not those taken
    over, which were running and counted already."""
    queued = [picked.c.state == JobState.QUEUED] if take_expired else []
    started = (
        select(picked.c.queue, func.count().label("n")).where(*queued).group_by(picked.c.queue).subquery("started")
    )
    return (
        update(queues)
        .where(queues.c.name == started.c.queue, queues.c.name.in_(select(held.c.name)))
        .values(**taken(dialect, started.c.n))
    )


def array_text(values: list[Any]) -> str:
    """An array parameter of numbers or of our own words (states, outcomes: letters only, see schema._quoted), None
    as NULL, in PostgreSQL's text form, for a statement that casts it (`_by_id`): one join, where psycopg's array
    dumper spends about a microsecond an element in Python, most of what a node spent on a finish's parameters.
    Sent as text, it also keeps one prepared statement, where psycopg typed an array of small numbers int2[], then
    int4[] as they grew (a statement prepared again for each)."""
    if None in values:
        return "{" + ",".join(["NULL" if value is None else str(value) for value in values]) + "}"
    return "{" + ",".join(map(str, values)) + "}"


def _by_id(names_types: list[tuple[str, Any]]) -> tuple[Any, Any]:
    """PostgreSQL: the rows of arrays `b_<name>` (one element per job, `id` first) as table `v`, and the jobs they
    name, found by primary key (`id = ANY(array)`) and joined to them by hash.

    The planner guessed badly from the table's statistics, stale for the minute after a backlog was enqueued in
    one go: with the owner/fence guard as plain conditions on the jobs it thought them one row, then read the
    whole table or matched every job against every row of `v` (the square of the batch: 75 us a job at 256). So
    the guard is one condition over both sides, evaluated on the joined rows, and the state is checked in a form
    that the partial index of running jobs does not match (walking it, dead entries included, cost more still).
    Returns `v` and the condition: the job is `v`'s, and still ours (owner `b_machine`, fence, running)."""
    from sqlalchemy.dialects.postgresql import ARRAY

    v = (
        func.unnest(*(cast(bindparam(f"b_{name}"), ARRAY(kind)) for name, kind in names_types))
        .table_valued(*(column(name, kind) for name, kind in names_types))
        .render_derived(name="v")
    )
    ours = jobs.c.id == any_(cast(bindparam("b_id"), ARRAY(BigInteger)))
    guard = case(
        (
            jobs.c.fence == v.c.fence,
            and_(
                jobs.c.owner == bindparam("b_machine", type_=Id),
                func.concat(jobs.c.state, "") == STATE_SQL[JobState.RUNNING],
            ),
        ),
        else_=false(),
    )
    return v, and_(ours, jobs.c.id == v.c.id, guard)


@functools.cache
def renew_statement() -> Any:
    """PostgreSQL: the renewal of the leases of jobs `b_id` (fences `b_fence`), by `b_lease` seconds from now, of
    those still ours (see RunStore.renew): arrays in, so one statement text and one plan whatever their number (as
    one OR per job, the planner read the whole table: a second for 512 jobs)."""
    _v, ours = _by_id([("id", BigInteger), ("fence", BigInteger)])
    return (
        update(jobs)
        .where(ours)
        .values(lease_until=db_now() + bindparam("b_lease", type_=Float))
        .returning(jobs.c.id, jobs.c.fence, jobs.c.cancel_requested)
    )


@functools.cache
def finish_statement() -> Any:
    """PostgreSQL: how a batch of runs ended, in one statement: arrays in, the (id, fence) of the runs that were still
    ours out.

    Each job is matched on owner and fence as in RunStore.finish (see _by_id); only the jobs that
    were still ours get their run's row, which is written here, once (its start is the job's), and leave their
    limited queue's running count. A job with children matches nothing here: RunStore.finish_many ends it in a
    transaction with their release (store/dependencies.py).
    """
    columns = [
        ("id", BigInteger),
        ("fence", BigInteger),
        ("state", Text),
        ("error", Text),
        ("retry", Float),
        ("outcome", Text),
        ("output", Text),
    ]
    v, ours = _by_id(columns)
    state = ending_state(v.c.state)
    again = state == JobState.QUEUED
    ended = (
        update(jobs)
        .where(ours, jobs.c.has_children == false())
        .values(
            state=state,
            last_error=case((stopped(v.c.state), CANCELLED_BY), else_=v.c.error),
            lease_until=None,
            run_at=case((again, db_now() + v.c.retry), else_=jobs.c.run_at),
            owner=case((again, None), else_=jobs.c.owner),
            finished_at=case((again, jobs.c.finished_at), else_=db_now()),
        )
        .returning(
            jobs.c.id,
            state.label("state"),
            jobs.c.attempts,
            jobs.c.fence,
            jobs.c.started_at,
            v.c.outcome,
            v.c.error,
            v.c.output,
            jobs.c.queue,
            jobs.c.progress,
            jobs.c.progress_message,
        )
        .cte("ended")
    )
    logged = (
        insert(runs)
        .from_select(
            [
                *("job_id", "attempt", "machine_id", "fence", "started_at", "finished_at", "outcome", "error"),
                *("output", "progress", "progress_message"),
            ],
            select(
                ended.c.id,
                ended.c.attempts,
                bindparam("b_machine", type_=Id),
                ended.c.fence,
                ended.c.started_at,
                db_now(),
                ended.c.outcome,
                ended.c.error,
                ended.c.output,
                ended.c.progress,
                ended.c.progress_message,
            ),
        )
        .cte("logged")
    )
    # Every job that ended left running: its queue's running count, if it is limited, goes down with it.
    gone = select(ended.c.queue, func.count().label("n")).group_by(ended.c.queue).subquery("gone")
    return select(ended.c.id, ended.c.fence, ended.c.state).add_cte(logged, freed(gone).cte("freed"))


CANCELLED_BY = "cancelled by an operator"  # a cancelled job's last_error, as a cancel leaves it


def stopped(state: Any) -> ColumnElement[bool]:
    """A run that would put its job back in the queue (`state`: queued, SQL) while a cancel of it was asked: the
    job ends cancelled instead, as the cancel asked (docs/design.md §7)."""
    return and_(state == JobState.QUEUED, jobs.c.cancel_requested == true())


def ending_state(state: Any) -> Any:
    """The state a job's row takes when its run ends with `state` (SQL), a cancel asked meanwhile kept (`stopped`)."""
    return case((stopped(state), JobState.CANCELLED.value), else_=state)


# -- the roster version (see store/roster.py) ---------------------------------


def bump_roster(conn: Connection) -> None:
    """Say, inside the transaction that changed a roster row, that the roster changed."""
    conn.execute(update(roster_version).where(roster_version.c.id == 1).values(version=roster_version.c.version + 1))


def newest_backlog(since: int | ColumnElement[int] | None) -> ColumnElement[int | None]:
    """The newest slot from `since` on whose turn found more due work than its holder could take, as a column."""
    if since is None:
        return literal(None)
    return select(func.max(turns.c.slot)).where(turns.c.slot >= since, turns.c.backlog).scalar_subquery()


@functools.cache
def checkin_statement(applied: bool, any_state: bool = False, returning: bool = False) -> Any:
    """A machine's check-in (MachineStore.heartbeat): machine `b_me` writes its figures and is seen now; with
    `applied`, the wish `b_applied` it just applied is cleared, unless an operator wished again since. It
    matches only while the row's state is `b_state` (a new state changes the roster: see MachineStore.heartbeat),
    or whatever the state with `any_state`; with `returning`, it answers with the id it matched."""
    wish: ColumnElement[Any] = machines.c.wish
    if applied:
        wish = case((machines.c.wish == bindparam("b_applied", type_=String), None), else_=machines.c.wish)
    state = bindparam("b_state", type_=String)
    mine = machines.c.id == bindparam("b_me", type_=Id)
    statement = (
        update(machines)
        .where(mine if any_state else mine & (machines.c.state == state))
        .values(
            last_seen=db_now(),
            state=state,
            wish=wish,
            running=bindparam("b_running", type_=Integer),
            done_count=bindparam("b_done", type_=Integer),
            failed_count=bindparam("b_failed", type_=Integer),
            clock_offset=bindparam("b_offset", type_=Float),
            rtt=bindparam("b_rtt", type_=Float),
            error_bound=bindparam("b_bound", type_=Float),
        )
    )
    return statement.returning(machines.c.id) if returning else statement
