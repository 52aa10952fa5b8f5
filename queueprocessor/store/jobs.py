"""Every statement the farm runs, in one place, each state change guarded in SQL (docs/design.md §3).

The rules the rest of the code relies on:
- Times are written by the database (`db_now()`), never by a machine.
- A job is claimed by one atomic UPDATE that only matches claimable rows:
  queued and due, or running with a lease that ran out. The claim bumps the
  job's fence token.
- Renewals and completions match `owner = :me AND fence = :token`; when they
  match nothing the caller lost the job to another machine (LostLease).
"""

import functools
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy import (
    String,
    Text,
    and_,
    bindparam,
    delete,
    exc,
    false,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.sql import Select

from ..rules.clock import Sample
from ..rules.errors import DuplicateKey, LostLease, NotFound, QPError, echoed
from ..rules.queues import DEFAULT, Served
from ..rules.states import FINISHED, JobState, Kind, MachineState, Outcome, Wish
from .dbtime import db_now
from .schema import Id, jobs, machines, meta, queues, runs, turns
from .statements import (
    LOST,
    bump_roster,
    checkin_statement,
    claim_statement,
    finish_statement,
    freed_statement,
    gated_now,
    looks_statement,
    newest_backlog,
    renew_statement,
    taken_statement,
    turn_statement,
    unpaused,
)

CLOCK = select(db_now())  # built once: Raw compiles each statement it is given once
KEEP = 5.0  # seconds a node without jobs keeps the connection for their results after its last use (see Held)
PRUNE_BATCH = 500  # finished jobs deleted per transaction (retention): short enough never to hold up the queue


class Claimed(NamedTuple):
    """A job this machine now owns, with the fence token every later write must quote (a tuple: a busy node makes
    thousands a second, straight from the claim's rows)."""

    id: int
    executor: str
    target: str
    method: str
    payload: str | None
    attempts: int
    max_attempts: int
    timeout: float | None
    fence: int
    run_at: float
    priority: int = 0
    kind: str = Kind.JOB
    queue: str = DEFAULT

    @property
    def exhausted(self) -> bool:
        """Claimed back from a lost lease on its last attempt: fail it, do not run it."""
        return self.kind != Kind.SINGLETON and self.attempts > self.max_attempts


class Ending(NamedTuple):
    """How one run ended, as the runner reports it (see Store.finish); a tuple, as a busy node makes thousands a
    second."""

    job: Claimed
    outcome: Outcome  # SUCCEEDED, FAILED, TIMEOUT or CANCELLED
    error: str | None = None
    retry_in: float | None = None  # requeue after this long, if attempts are left
    output: str | None = None

    @property
    def state(self) -> JobState:
        """The job's state after this ending."""
        if self.job.kind == Kind.SINGLETON and self.outcome != Outcome.CANCELLED and self.retry_in is not None:
            return JobState.QUEUED
        if self.outcome == Outcome.SUCCEEDED:
            return JobState.SUCCEEDED
        if self.outcome == Outcome.CANCELLED:
            return JobState.CANCELLED
        again = self.retry_in is not None and self.job.attempts < self.job.max_attempts
        return JobState.QUEUED if again else JobState.FAILED


@dataclass(frozen=True)
class JobSpec:
    """What to run; validated by the executors before it reaches the database."""

    executor: str
    target: str
    method: str = "GET"
    payload: str | None = None
    priority: int = 0
    max_attempts: int = 3
    timeout: float | None = None
    key: str | None = None
    kind: str = Kind.JOB  # or SINGLETON (see singletons)
    origin: str | None = None  # who enqueued it
    queue: str = DEFAULT
    order_key: str | None = None  # jobs of one key in one queue run one at a time, in enqueue order


@dataclass(frozen=True)
class Plan:
    """Which queues a claim takes from (docs/design.md §9), as the node works it out for each claim.

    `served`: the node's queues (() for every queue). `alone`: queues claimed in branches of their own, each
    (queue, room, locked): at most `room` of its jobs (the node's own limit for it, or all its free room), and,
    when `locked`, within the queue's farm-wide limit and rate, whose row the claim locks (on PostgreSQL in the
    claim statement itself). A queue with a farm-wide limit or rate gives work only to a claim that locked it."""

    served: tuple[str, ...] = ()
    alone: tuple[tuple[str, int, bool], ...] = ()

    @property
    def branches(self) -> tuple[bool, ...]:
        """Per branch of its own, whether its queue is guarded (see statements.claim_statement)."""
        return tuple(locked for _name, _room, locked in self.alone)

    @property
    def locks(self) -> tuple[str, ...]:
        return tuple(sorted(name for name, _room, locked in self.alone if locked))  # in one order: no deadlock

    def params(self) -> dict:
        params = {"b_served": list(self.served)} if self.served else {}
        for i, (name, room, locked) in enumerate(self.alone):
            params |= {f"b_q{i}": name, f"b_room{i}": room, f"b_locked{i}": locked}
        return params


EVERY_QUEUE = Plan()


@dataclass(frozen=True)
class Looks:
    """What a turn asks besides its claim, in the same statement (docs/design.md §9). `guarded`: our queues with a
    farm-wide limit or rate; while one of their jobs is due the turn claims nothing and says so, and we make
    one locked claim of every queue instead, so priority holds across them. `elsewhere`: the queues we do not
    serve that a live peer does (() for every queue we do not serve; None: do not ask), with `served`, ours."""

    guarded: tuple[str, ...] = ()
    elsewhere: tuple[str, ...] | None = None
    served: tuple[str, ...] = ()

    def params(self) -> dict:
        params = {"b_guarded": list(self.guarded)} if self.guarded else {}
        if self.elsewhere is not None:
            params |= dict(b_elsewhere=list(self.elsewhere), b_any_other=not self.elsewhere, b_served=list(self.served))
        return params


NO_LOOKS = Looks()


@dataclass(frozen=True)
class Turn:
    """A turn: was the slot ours, what it claimed, and what its looks saw (None: not asked, or, for
    `elsewhere_due`, not asked because the claim took all the room it had)."""

    won: bool
    claimed: list[Claimed]
    guarded_due: bool | None = None
    elsewhere_due: bool | None = None


class Raw:
    """Hot statements straight to the driver, each compiled once: SQLAlchemy's execution and row layers cost a
    busy node a fifth of its interpreter time, for statements whose columns need no conversion. Rows come back
    as plain tuples; driver errors are raised as SQLAlchemy's, as any other statement's are, and a connection
    the server dropped is invalidated, so the pool connects again."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._compiled: dict = {}  # statement -> its SQL for the driver (the hot statements are built once)

    def run(self, conn, statement, params) -> list[tuple]:
        compiled = self._compiled.get(statement)
        if compiled is None:
            compiled = self._compiled[statement] = statement.compile(dialect=self.engine.dialect)
        dbapi_connection = conn.connection.dbapi_connection
        try:
            with dbapi_connection.cursor() as cursor:  # autocommit: one round trip
                cursor.execute(compiled.string, compiled.construct_params(params))
                return cursor.fetchall()
        except self.engine.dialect.loaded_dbapi.Error as error:
            if self.engine.dialect.is_disconnect(error, dbapi_connection, None):
                conn.invalidate()
            raise exc.DBAPIError.instance(
                compiled.string,
                params,
                error,
                self.engine.dialect.loaded_dbapi.Error,
                hide_parameters=True,
                dialect=self.engine.dialect,
            ) from None


class Held:
    """A pooled connection that the runner's result writer keeps between its statements (no checkout per batch,
    and psycopg's prepared statements stay on it), also over the short idle spells of a node whose jobs come in
    bursts: given back to the pool beside the one it keeps, it would be closed, and the next busy moment would
    open one again (connection set-up, and statements planned afresh, on the hot path at every flip). Unused for
    KEEP seconds it is given back (`rest`, see Store.idle), so that an idle node holds one connection for
    statements. A call made while another is under way takes its own from the pool instead of waiting."""

    def __init__(self, engine: Engine, raw: Raw):
        self.engine = engine
        self.raw = raw
        self.conn = None
        self.used = 0.0  # time.monotonic() of its last statement
        self.lock = threading.Lock()

    def run(self, statement, params) -> list[tuple]:
        if not self.lock.acquire(blocking=False):
            with self.engine.connect() as conn:
                return self.raw.run(conn, statement, params)
        try:
            if self.conn is None:
                self.conn = self.engine.connect()
            self.used = time.monotonic()
            try:
                return self.raw.run(self.conn, statement, params)
            except BaseException:
                self._give_back()
                raise
        finally:
            self.lock.release()

    def rest(self) -> None:
        """Give the connection back if no statement used it for KEEP seconds (and none is using it now)."""
        if not self.lock.acquire(blocking=False):
            return
        try:
            if time.monotonic() - self.used >= KEEP:
                self._give_back()
        finally:
            self.lock.release()

    def release(self) -> None:
        with self.lock:
            self._give_back()

    def _give_back(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            _close_quietly(conn)


def _close_quietly(conn) -> None:
    try:
        conn.close()
    except Exception:  # the connection is already gone: nothing left to give back
        pass


def _with_owner_name(statement):
    """Operators know machines by name: a job read for them carries its owner's (`owner_name`) beside the id."""
    return statement.add_columns(machines.c.name.label("owner_name")).select_from(
        jobs.outerjoin(machines, machines.c.id == jobs.c.owner)
    )


@functools.cache
def run_history():
    """Every run, as rows of qp_runs: those that ended, and those in progress. A run's row is written once, when it
    ends (a claim and a finish are each one write per job on the hot path); until then the run is its job's row,
    running, with its owner, fence, attempt and start, and is read from there (its `id` is NULL)."""
    ended = select(
        runs.c.id,
        runs.c.job_id,
        runs.c.attempt,
        runs.c.machine_id,
        runs.c.fence,
        runs.c.started_at,
        runs.c.finished_at,
        runs.c.outcome,
        runs.c.error,
        runs.c.output,
    )
    running = select(
        null().label("id"),
        jobs.c.id.label("job_id"),
        jobs.c.attempts.label("attempt"),
        jobs.c.owner.label("machine_id"),
        jobs.c.fence,
        jobs.c.started_at,
        null().label("finished_at"),
        literal(Outcome.RUNNING, String).label("outcome"),
        null().label("error"),
        null().label("output"),
    ).where(jobs.c.state == JobState.RUNNING)
    return union_all(ended, running).subquery("runs")


def _with_machine_name(statement, table):
    """The same for a table whose rows name a machine by `machine_id` (runs, turns): `machine_name`."""
    return statement.add_columns(machines.c.name.label("machine_name")).select_from(
        table.outerjoin(machines, machines.c.id == table.c.machine_id)
    )


def _run_ended(machine_id: int, *guard):
    """The row of job `b_id`'s run, which ends now with `b_outcome`, `b_error` and `b_output`, written once (`guard`:
    only if the job is still as the caller holds it). Its attempt, fence and start are the job's: a run in progress
    is its job's row (see run_history); finish_statement writes it so on PostgreSQL."""
    return insert(runs).from_select(
        ["job_id", "attempt", "machine_id", "fence", "started_at", "finished_at", "outcome", "error", "output"],
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
        ).where(jobs.c.id == bindparam("b_id"), *guard),
    )


def _free(conn, queues_left: Iterable[str]) -> None:
    """Jobs of these queues (one name per job) left running in this transaction: their limited queues' running
    counts go down with them, in name order (see statements.freed)."""
    left = Counter(queues_left)
    if left:
        conn.execute(freed_statement(), [dict(b_queue=q, b_freed=n) for q, n in sorted(left.items())])


def _ran_out(before: float | None = None) -> list:
    """A running job whose lease ran out (before `before` too, database time, if given): what a take-over takes,
    as the statements outside the claim state it (the claim states it with its own bound time: see
    statements.claim_statement)."""
    return [
        jobs.c.state == JobState.RUNNING,
        jobs.c.lease_until < db_now(),
        *([jobs.c.lease_until < before] if before is not None else []),
    ]


def _most_urgent_first(claimed: Iterable[Claimed]) -> list[Claimed]:
    """RETURNING has no order; start the most urgent first."""
    return sorted(claimed, key=lambda c: (-c.priority, c.run_at, c.id))


class Store:
    """The farm's database. Thread-safe: each call checks out its own connection."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.dialect = engine.dialect.name
        # Single statements run in autocommit (one round trip each); SQLite
        # keeps its explicit BEGIN IMMEDIATE so writers queue instead of failing.
        self._auto = engine if self.dialect == "sqlite" else engine.execution_options(isolation_level="AUTOCOMMIT")
        self._read = self._auto.execution_options(read_only=True)
        if self.dialect == "postgresql":  # the statements a busy node runs thousands of times a minute
            self._raw = Raw(self._auto)
            self._results = Held(self._auto, self._raw)

    def idle(self) -> None:
        """This node holds no jobs (its heartbeat says so at every beat): give back the connection kept for their
        results once no result was written for KEEP seconds (see Held). A node working off a backlog, which holds
        no job for a moment between two claims, or fed bursts of jobs a moment apart, keeps it. (Given back at
        once, a drain of 100,000 jobs opened 150 connections, each a new server process that parsed and planned
        the node's statements afresh: a third of the database's CPU per job.)"""
        if self.dialect == "postgresql":
            self._results.rest()

    def give_back(self) -> None:
        """The farm is closing: give back the connection kept for results now."""
        if self.dialect == "postgresql":
            self._results.release()

    def _hot(self, statement, params) -> list[tuple]:
        """A statement built once (a claim, a check-in), straight to the driver on a pooled connection (see
        Raw)."""
        with self._auto.connect() as conn:
            return self._raw.run(conn, statement, params)

    def rows(self, statement, params=None) -> list:
        """Run one statement on its own (a read on the read-only engine) and return its rows: a SELECT's,
        or what a write RETURNs."""
        with (self._read if isinstance(statement, Select) else self._auto).connect() as conn:
            rows = conn.execute(statement, params).all()
            conn.commit()
            return rows

    def count(self, statement, params=None) -> int:
        """Run one write on its own and return how many rows it matched."""
        with self._auto.connect() as conn:
            count = conn.execute(statement, params).rowcount
            conn.commit()
            return count

    # -- time -------------------------------------------------------------

    def ask_time(self) -> float:
        """The database's clock, one short round trip."""
        return self.rows(CLOCK)[0][0]

    def timed(self, statement, stamp: Callable[[], float], params=None) -> tuple[Sample, list]:
        """Run a read built once whose first column is db_now(), reading `stamp()` just around the statement,
        after the connection is checked out: a clock sample times one round trip. On PostgreSQL
        it goes straight to the driver (see Raw), its rows plain tuples."""
        with self._read.connect() as conn:
            t0 = stamp()
            if self.dialect == "postgresql":
                rows = self._raw.run(conn, statement, params or {})
            else:
                rows = conn.execute(statement, params).all()
            t1 = stamp()
            conn.commit()
        return Sample(t0, t1, rows[0][0] if rows else None), rows

    def sample_clock(self, stamp: Callable[[], float]) -> Sample:
        """One sample of the database's clock against the local monotonic clock `stamp`."""
        return self.timed(CLOCK, stamp)[0]

    # -- farm settings ----------------------------------------------------

    def settings(self) -> dict[str, str]:
        return {k: v for k, v in self.rows(select(meta.c.key, meta.c.value))}

    def adopt_settings(self, wanted: dict[str, str]) -> dict[str, str]:
        """Store settings the farm does not have yet; return the farm's settings (old ones win)."""
        have = self.settings()
        for key, value in wanted.items():
            if key not in have:
                try:
                    self.count(insert(meta).values(key=key, value=value))
                except exc.IntegrityError:
                    pass  # another node stored it first; theirs stands
        return self.settings()

    # -- machines ---------------------------------------------------------

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
        with self.engine.begin() as conn:
            conn.execute(insert(machines).values(joined_at=db_now(), last_seen=db_now(), **values))
            bump_roster(conn)
            return conn.execute(select(machines.c.id).where(machines.c.instance == instance)).scalar_one()

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
        params = dict(
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
        if self.dialect == "postgresql":
            if self._hot(checkin_statement(applied, returning=True), params):
                return True
        elif self.count(checkin_statement(applied), params):
            return True
        with self.engine.begin() as conn:  # a new state, or a check-in after a burial: the roster changed
            if conn.execute(checkin_statement(applied, any_state=True), params).rowcount != 1:
                return False
            bump_roster(conn)
        return True

    def read_machines(self, backlog_since: int | None = None) -> tuple[float, int | None, list[dict]]:
        """The database's time, the newest backlog turn since a slot, all machines (an operator's view; a node's
        heartbeat reads O(1) rows instead, see store/roster.py)."""
        rows = self.rows(select(db_now(), newest_backlog(backlog_since), machines).order_by(machines.c.id))
        if not rows:
            return self.ask_time(), None, []
        # A machine's queues as names, () for every queue, and its own limits for some ({queue: most at once}).
        served = [Served.parse(r.queues or None) for r in rows]
        return (
            rows[0][0],
            rows[0][1],
            [dict(r._mapping) | {"queues": s.names, "caps": dict(s.caps)} for r, s in zip(rows, served)],
        )

    def find_machine(self, ref: str) -> dict:
        """A machine by id, or by name among the machines that are not stopped."""
        with self.engine.connect() as conn:
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
        if self.count(update(machines).where(machines.c.id == machine_id).values(wish=wish)) != 1:
            raise NotFound(f"no machine with id {machine_id}", what="machine", ref=machine_id)

    def mark_stopped(self, machine_id: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(machines)
                .where(machines.c.id == machine_id)
                .values(state=MachineState.STOPPED, running=0, last_seen=db_now())
            )
            bump_roster(conn)

    # -- turns ------------------------------------------------------------

    def take_turn(self, slot: int, machine_id: int, ends: float | None = None) -> bool:
        """Record a turn under its slot number. False if another machine already has that slot, or if the
        record reached the database after `ends`, the slot's end in database time (a node taking its turn
        always gives it; without it, history is written, as tests and tools do)."""
        return self._record_turn(slot, machine_id, NO_LOOKS, 0.0, ends)[0]

    def _record_turn(
        self, slot: int, machine_id: int, looks: Looks, horizon: float, ends: float | None
    ) -> tuple[bool, bool | None, bool | None]:
        """take_turn, and what the looks saw (None: not asked) if it was ours: on SQLite in the same statement,
        on SQL Server in a second one."""
        guarded, elsewhere = bool(looks.guarded), looks.elsewhere is not None
        params = dict(b_slot=slot, b_machine=machine_id, b_horizon=horizon, b_ends=ends) | looks.params()
        statement = turn_statement(self.dialect, guarded, elsewhere, ends is not None)
        try:
            if self.dialect != "mssql":
                rows = self.rows(statement, params)
                if not rows:  # too late for its slot
                    return False, None, None
                [(_slot, *seen)] = rows
                return True, *seen
            if not self.count(statement, params):
                return False, None, None
        except exc.IntegrityError:
            return False, None, None
        if not (guarded or elsewhere):
            return True, None, None
        [seen] = self.rows(looks_statement(self.dialect, guarded, elsewhere), params)
        return True, *seen

    def record_turn(self, slot: int, claimed: int, backlog: bool) -> None:
        """Add what the turn's holder claimed in its slot (its turn, then any claims on push notices)."""
        values = dict(claimed=turns.c.claimed + claimed)
        if backlog:
            values["backlog"] = True
        self.count(update(turns).where(turns.c.slot == slot).values(**values))

    def backlog_open(self, since_slot: int) -> bool:
        """Did a recent turn find more due work than its holder could take? (work-conserving claims)"""
        return bool(self.rows(select(turns.c.slot).where(turns.c.slot >= since_slot, turns.c.backlog).limit(1)))

    def read_turns(self, since: float, limit: int = 100_000) -> list[dict]:
        rows = self.rows(
            _with_machine_name(select(turns), turns)
            .where(turns.c.taken_at >= since)
            .order_by(turns.c.slot)
            .limit(limit)
        )
        return [dict(r._mapping) for r in rows]

    def prune_turns(self, keep_seconds: float) -> int:
        return self.count(delete(turns).where(turns.c.taken_at < db_now() - keep_seconds))

    def prune_jobs(self, keep_seconds: float, batch: int = PRUNE_BATCH) -> int:
        """Delete up to `batch` jobs that finished more than `keep_seconds` ago, and their runs, in one
        transaction (retention, as Oban's pruner and Hangfire's expiration do). Returns how many: fewer than
        `batch` means none are left. A job retried meanwhile is no longer finished, and stays."""
        old = and_(jobs.c.state.in_(FINISHED), jobs.c.finished_at < db_now() - keep_seconds)
        with self.engine.begin() as conn:
            ids = [row[0] for row in conn.execute(select(jobs.c.id).where(old).limit(batch))]
            if not ids:
                return 0
            gone = [row[0] for row in conn.execute(delete(jobs).where(jobs.c.id.in_(ids), old).returning(jobs.c.id))]
            if gone:
                conn.execute(delete(runs).where(runs.c.job_id.in_(gone)))
        return len(ids)

    # -- jobs -------------------------------------------------------------

    def enqueue(self, spec: JobSpec, *, delay: float = 0.0, at: float | None = None, count: int = 1) -> list[int]:
        """Insert `count` copies of a job, due after `delay` seconds or at epoch `at` (database time)."""
        run_at = literal(at) if at is not None else db_now() + delay
        gated = gated_now(literal(spec.queue, String))
        statement = insert(jobs).values(created_at=db_now(), run_at=run_at, gated=gated).returning(jobs.c.id)
        row = dict(
            executor=spec.executor,
            target=spec.target,
            method=spec.method,
            payload=spec.payload,
            priority=spec.priority,
            max_attempts=spec.max_attempts,
            timeout=spec.timeout,
            key=spec.key,
            kind=spec.kind,
            origin=spec.origin,
            queue=spec.queue,
            order_key=spec.order_key,
            state=JobState.QUEUED,
            attempts=0,
            fence=0,
            cancel_requested=False,
        )
        try:
            with self.engine.begin() as conn:
                if count == 1:
                    return [conn.execute(statement, row).scalar_one()]
                if self.dialect != "postgresql":
                    return [r[0] for r in conn.execute(statement, [row] * count).all()]
                # The copies made by the database, in one statement: no rows sent, none converted one by one.
                copies = select(
                    *(literal(value, jobs.c[name].type).label(name) for name, value in row.items()),
                    db_now().label("created_at"),
                    run_at.label("run_at"),
                    gated.label("gated"),
                ).select_from(func.generate_series(1, count))
                made = insert(jobs).from_select([*row, "created_at", "run_at", "gated"], copies).returning(jobs.c.id)
                return [r[0] for r in conn.execute(made).all()]
        except exc.IntegrityError:
            raise DuplicateKey(spec.key) from None

    def claim(
        self,
        machine_id: int,
        limit: int,
        lease: float,
        *,
        horizon: float = 0.0,
        take_expired: bool = True,
        expired_before: float | None = None,
        plan: Plan = EVERY_QUEUE,
    ) -> list[Claimed]:
        """Atomically take up to `limit` claimable jobs of the queues `plan` names, best priority first.

        Claimable: queued with run_at within `horizon` seconds from now, or (with
        take_expired) running with a lease that ran out, and ran out before
        `expired_before` (database time) if given: a claim that a stalled database
        holds up must not take the leases that ran out during the stall. One
        UPDATE; the subquery skips rows another machine is claiming at the same moment.
        A plan with limited or rated queues claims them within their rows' running count and rate bucket, and
        adds what it started to both before the rows' lock is let go: on PostgreSQL the claim statement does
        all of it; elsewhere a transaction locks the rows first and writes the counts after the claim.
        """
        if limit <= 0:
            return []
        params = dict(b_machine=machine_id, b_limit=limit, b_lease=lease, b_horizon=horizon) | plan.params()
        if expired_before is not None:
            params["b_before"] = expired_before
        statement = claim_statement(
            self.dialect,
            take_expired,
            expired_before is not None,
            limit if self.dialect == "mssql" else None,
            served=bool(plan.served),
            branches=plan.branches,
        )
        if self.dialect == "postgresql":  # the claim statement ends the lost runs and counts what it took itself
            return _most_urgent_first(Claimed(*row) for row in self._hot(statement, params))
        with self.engine.begin() as conn:  # a take-over and the lost run's row are written together, or neither is
            if plan.locks:
                conn.execute(
                    select(queues.c.name).where(queues.c.name.in_(plan.locks)).order_by(queues.c.name).with_for_update()
                )
            leaving = self._expired_runs(conn, expired_before) if take_expired and self.dialect != "postgresql" else {}
            claimed = _most_urgent_first(Claimed(*row) for row in conn.execute(statement, params))
            self._end_lost(
                conn, [(c.id, c.attempts - 1, *leaving[c.id], c.fence - 1) for c in claimed if c.id in leaving]
            )
            started = Counter(c.queue for c in claimed if c.queue in plan.locks and c.id not in leaving)
            if started:
                conn.execute(
                    taken_statement(self.dialect), [dict(b_queue=q, b_spent=n) for q, n in sorted(started.items())]
                )
        return claimed

    def take_turn_and_claim(
        self,
        slot: int,
        machine_id: int,
        limit: int,
        lease: float,
        *,
        horizon: float = 0.0,
        take_expired: bool = True,
        expired_before: float | None = None,
        plan: Plan = EVERY_QUEUE,
        looks: Looks = NO_LOOKS,
        ends: float | None = None,
    ) -> Turn:
        """Record the turn of `slot` (as take_turn, before `ends`) and, only if it was ours to take, claim as
        Store.claim does and look as `looks` asks (while guarded work is due, claim nothing).

        On PostgreSQL all of it is one statement, so an idle farm costs the
        database one statement per period, roles and limited queues or not;
        elsewhere, and for a plan that locks queues, two.
        """
        if self.dialect != "postgresql" or limit <= 0 or plan.locks:
            won, guarded_due, elsewhere_due = self._record_turn(slot, machine_id, looks, horizon, ends)
            if not won:
                return Turn(False, [])
            claimed = (
                []
                if guarded_due
                else self.claim(
                    machine_id,
                    limit,
                    lease,
                    horizon=horizon,
                    take_expired=take_expired,
                    expired_before=expired_before,
                    plan=plan,
                )
            )
            return Turn(True, claimed, guarded_due, elsewhere_due)
        params = dict(b_machine=machine_id, b_limit=limit, b_lease=lease, b_horizon=horizon, b_slot=slot, b_ends=ends)
        params |= plan.params() | looks.params()
        if expired_before is not None:
            params["b_before"] = expired_before
        statement = claim_statement(
            self.dialect,
            take_expired,
            expired_before is not None,
            None,
            turn=True,
            served=bool(plan.served),
            branches=plan.branches,
            guarded=bool(looks.guarded),
            elsewhere=looks.elsewhere is not None,
            ends=ends is not None,
        )
        rows = self._hot(statement, params)
        won, guarded_due, elsewhere_due = rows[0][:3]
        if not won:
            return Turn(False, [])
        return Turn(
            True,
            _most_urgent_first(Claimed(*row[3:]) for row in rows if row[3] is not None),
            guarded_due,
            elsewhere_due,
        )

    def requeue_expired(self, before: float) -> int:
        """Put running jobs whose lease ran out (before `before`, database time) back in the queue.

        Their attempt stays spent, and their runs end as lost; the next claim fails
        the job if that was its last attempt (Claimed.exhausted).
        """
        with self.engine.begin() as conn:
            leaving = self._expired_runs(conn, before)
            if not leaving:
                return 0
            taken = conn.execute(
                update(jobs)
                .where(jobs.c.id.in_(list(leaving)), *_ran_out(before))
                .values(
                    state=JobState.QUEUED,
                    owner=None,
                    lease_until=None,
                    last_error="lease expired: its machine stopped renewing it",
                )
                .returning(jobs.c.id, jobs.c.attempts, jobs.c.fence, jobs.c.queue)
            ).all()
            self._end_lost(conn, [(job_id, attempts, *leaving[job_id], fence) for job_id, attempts, fence, _ in taken])
            _free(conn, [queue for *_, queue in taken])
        return len(taken)

    @staticmethod
    def _expired_runs(conn, before: float | None) -> dict[int, tuple[int, float]]:
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

    @staticmethod
    def _end_lost(conn, ended: Sequence[tuple[int, int, int, float, int]]) -> None:
        """The rows of runs that ended lost, each (job id, attempt, machine, started_at, fence), written once
        (a run in progress is its job's row: see run_history)."""
        if ended:
            conn.execute(
                insert(runs).values(finished_at=db_now(), outcome=Outcome.LOST, error=LOST),
                [
                    dict(job_id=job_id, attempt=attempt, machine_id=machine, started_at=started, fence=fence)
                    for job_id, attempt, machine, started, fence in ended
                ],
            )

    def mark_started(self, job: Claimed) -> None:
        """A job claimed ahead of its time starts now: its run's start becomes the real one (database time)."""
        self.count(
            update(jobs)
            .where(jobs.c.id == job.id, jobs.c.fence == job.fence, jobs.c.state == JobState.RUNNING)
            .values(started_at=db_now())
        )

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
        return self.rows(select(due.exists()))[0][0]

    def any_expired(self) -> bool:
        """Is any running job's lease out, in a queue that is not paused (one a settled machine's claim takes
        over)? (Cheap: it stops at the first.)"""
        out = select(jobs.c.id).where(*_ran_out(), unpaused(jobs))
        return self.rows(select(out.exists()))[0][0]

    def due_count(self, horizon: float = 0.0) -> int:
        return self.rows(
            select(func.count())
            .select_from(jobs)
            .where(jobs.c.state == JobState.QUEUED, jobs.c.run_at <= db_now() + horizon)
        )[0][0]

    def renew(self, machine_id: int, held: Iterable[tuple[int, int]], lease: float) -> dict[tuple[int, int], bool]:
        """Extend the leases of the runs (job id, fence) this machine still holds. Returns {(job id, fence): cancel
        requested} for those renewed; a run missing from the answer was lost (its job taken over, or claimed
        again under a newer fence)."""
        held = list(held)
        if not held:
            return {}
        if self.dialect == "postgresql":
            rows = self._hot(
                renew_statement(),
                dict(
                    b_machine=machine_id,
                    b_id=[job_id for job_id, _ in held],
                    b_fence=[fence for _, fence in held],
                    b_lease=lease,
                ),
            )
            return {(job_id, fence): bool(cancel) for job_id, fence, cancel in rows}
        mine = or_(*(and_(jobs.c.id == job_id, jobs.c.fence == fence) for job_id, fence in held))
        rows = self.rows(
            update(jobs)
            .where(jobs.c.owner == machine_id, jobs.c.state == JobState.RUNNING, mine)
            .values(lease_until=db_now() + lease)
            .returning(jobs.c.id, jobs.c.fence, jobs.c.cancel_requested)
        )
        return {(job_id, fence): bool(cancel) for job_id, fence, cancel in rows}

    def finish(
        self,
        job: Claimed,
        machine_id: int,
        outcome: str,
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

    def finish_many(self, machine_id: int, endings: Sequence["Ending"]) -> list[str | None]:
        """finish() for many runs in one transaction (a busy node's results, a few round trips for all).
        Returns each job's new state, None where the fence moved on."""
        if self.dialect == "postgresql" and endings:
            ours = {
                (job_id, fence)
                for job_id, fence in self._results.run(
                    finish_statement(),
                    dict(
                        b_machine=machine_id,
                        b_id=[e.job.id for e in endings],
                        b_fence=[e.job.fence for e in endings],
                        b_state=[e.state for e in endings],
                        b_error=[e.error for e in endings],
                        b_retry=[e.retry_in for e in endings],
                        b_outcome=[e.outcome for e in endings],
                        b_output=[e.output for e in endings],
                    ),
                )
            }
            return [e.state if (e.job.id, e.job.fence) in ours else None for e in endings]
        if len(endings) > 1 and self.engine.dialect.supports_sane_multi_rowcount:
            with self.engine.connect() as conn:
                with conn.begin() as transaction:
                    if self._write_endings(conn, machine_id, endings) == len(endings):
                        return [e.state for e in endings]
                    transaction.rollback()  # someone's fence moved on: find whose, one by one
        states = []
        for ending in endings:
            with self.engine.begin() as conn:
                states.append(ending.state if self._write_endings(conn, machine_id, [ending]) else None)
        return states

    @staticmethod
    def _write_endings(conn, machine_id: int, endings: Sequence["Ending"]) -> int:
        """The guarded updates for `endings`, one executemany per kind, and their runs' rows; the number of jobs
        that were ours."""
        mine = and_(
            jobs.c.id == bindparam("b_id"),
            jobs.c.owner == machine_id,
            jobs.c.fence == bindparam("b_fence"),
            jobs.c.state == JobState.RUNNING,
        )
        again = [e for e in endings if e.state == JobState.QUEUED]
        done = [e for e in endings if e.state != JobState.QUEUED]
        count = 0
        if again:
            count += conn.execute(
                update(jobs)
                .where(mine)
                .values(
                    state=JobState.QUEUED,
                    last_error=bindparam("b_error"),
                    lease_until=None,
                    run_at=db_now() + bindparam("b_retry"),
                    owner=None,
                ),
                [dict(b_id=e.job.id, b_fence=e.job.fence, b_error=e.error, b_retry=e.retry_in) for e in again],
            ).rowcount
        if done:
            count += conn.execute(
                update(jobs)
                .where(mine)
                .values(
                    state=bindparam("b_state"), last_error=bindparam("b_error"), lease_until=None, finished_at=db_now()
                ),
                [dict(b_id=e.job.id, b_fence=e.job.fence, b_error=e.error, b_state=e.state) for e in done],
            ).rowcount
        if count == len(endings):
            conn.execute(
                _run_ended(machine_id),
                [dict(b_id=e.job.id, b_outcome=e.outcome, b_error=e.error, b_output=e.output) for e in endings],
            )
            _free(conn, [e.job.queue for e in endings])
        return count

    def release(self, job: Claimed, machine_id: int, reason: str) -> bool:
        """Give a job back to the queue without spending an attempt (the node stopped it, e.g. when
        it fenced itself off); its run ends as lost. False if it was no longer ours."""
        with self.engine.begin() as conn:
            conn.execute(
                _run_ended(
                    machine_id, jobs.c.owner == machine_id, jobs.c.fence == job.fence, jobs.c.state == JobState.RUNNING
                ),
                dict(b_id=job.id, b_outcome=Outcome.LOST, b_error=reason, b_output=None),
            )
            count = conn.execute(
                update(jobs)
                .where(
                    jobs.c.id == job.id,
                    jobs.c.owner == machine_id,
                    jobs.c.fence == job.fence,
                    jobs.c.state == JobState.RUNNING,
                )
                .values(
                    state=JobState.QUEUED,
                    owner=None,
                    lease_until=None,
                    run_at=db_now(),
                    attempts=jobs.c.attempts - 1,
                    last_error=reason,
                )
            ).rowcount
            if count:
                _free(conn, [job.queue])
        return count == 1

    def cancel(self, job_id: int) -> str:
        """Cancel a queued job at once; ask the owner of a running one to stop it (within a heartbeat)."""
        with self.engine.begin() as conn:
            if conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.state == JobState.QUEUED)
                .values(state=JobState.CANCELLED, finished_at=db_now(), last_error="cancelled by an operator")
            ).rowcount:
                return JobState.CANCELLED
            if conn.execute(
                update(jobs).where(jobs.c.id == job_id, jobs.c.state == JobState.RUNNING).values(cancel_requested=True)
            ).rowcount:
                return "cancelling"
            state = conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar()
        if state is None:
            raise NotFound(f"no job with id {job_id}", what="job", ref=job_id)
        raise QPError(f"job {job_id} is already {state}; only queued or running jobs can be cancelled")

    def retry(self, job_id: int) -> None:
        """Put a failed or cancelled job back in the queue for one more attempt."""
        count = self.count(
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.state.in_((JobState.FAILED, JobState.CANCELLED)))
            .values(
                state=JobState.QUEUED,
                run_at=db_now(),
                owner=None,
                finished_at=None,
                cancel_requested=False,
                max_attempts=jobs.c.attempts + 1,
                gated=gated_now(jobs.c.queue),
            )
        )
        if count != 1:
            state = self.rows(select(jobs.c.state).where(jobs.c.id == job_id))
            if not state:
                raise NotFound(f"no job with id {job_id}", what="job", ref=job_id)
            raise QPError(f"job {job_id} is {state[0][0]}; only failed or cancelled jobs can be retried")

    def get_job(self, job_id: int) -> dict:
        """The job's row, with `owner_name`: the name of the machine that holds (or last held) it."""
        rows = self.rows(_with_owner_name(select(jobs)).where(jobs.c.id == job_id))
        if not rows:
            raise NotFound(f"no job with id {job_id}", what="job", ref=job_id)
        return dict(rows[0]._mapping)

    def keyed_job(self, *, key: str | None = None, job_id: int | None = None) -> dict | None:
        """The job holding `key` (or with that id), with `machine_name` (of its owner) and `last_output` (of its
        last run): what a refused grab tells about its winner."""
        rows = self.rows(
            select(jobs, machines.c.name.label("machine_name"))
            .select_from(jobs.outerjoin(machines, machines.c.id == jobs.c.owner))
            .where(jobs.c.key == key if job_id is None else jobs.c.id == job_id)
        )
        if not rows:
            return None
        job = dict(rows[0]._mapping)
        last = self.rows(select(runs.c.output).where(runs.c.job_id == job["id"]).order_by(runs.c.id.desc()).limit(1))
        return job | {"last_output": last[0][0] if last else None}

    def free_key(self, key: str) -> int:
        """A finished job holding `key` gives it up (keeping its history), so the key can be used again."""
        return self.count(update(jobs).where(jobs.c.key == key, jobs.c.state.in_(FINISHED)).values(key=None))

    def singleton_jobs(self) -> list[dict]:
        """The jobs of the singletons that exist (those removed gave their key up), by key."""
        statement = (
            _with_owner_name(select(jobs))
            .where(jobs.c.kind == Kind.SINGLETON, jobs.c.key.isnot(None))
            .order_by(jobs.c.key)
        )
        return [dict(r._mapping) for r in self.rows(statement)]

    def list_jobs(self, state: str | None = None, limit: int = 100, *, queue: str | None = None) -> list[dict]:
        """The newest jobs (in `state`, of `queue`, if given), each with `owner_name` (see get_job)."""
        statement = _with_owner_name(select(jobs)).order_by(jobs.c.id.desc()).limit(limit)
        if state:
            if state not in tuple(JobState):
                raise QPError(f"unknown job state {echoed(state)}: use one of {', '.join(JobState)}")
            statement = statement.where(jobs.c.state == state)
        if queue is not None:
            statement = statement.where(jobs.c.queue == queue)
        return [dict(r._mapping) for r in self.rows(statement)]

    def job_counts(self) -> dict[str, int]:
        rows = self.rows(select(jobs.c.state, func.count()).group_by(jobs.c.state))
        return {state: 0 for state in JobState} | {state: n for state, n in rows}

    def list_runs(self, *, since: float = -math.inf, job_id: int | None = None, limit: int = 10_000) -> list[dict]:
        history = run_history()
        statement = _with_machine_name(select(history), history).order_by(history.c.started_at.desc()).limit(limit)
        if job_id is not None:
            statement = statement.where(history.c.job_id == job_id)
        if since != -math.inf:
            statement = statement.where(or_(history.c.finished_at.is_(None), history.c.finished_at >= since))
        return [dict(r._mapping) for r in self.rows(statement)]
