"""The statements behind recurring schedules (the rules are in schedules).

A turn-holder makes upcoming occurrences into jobs. Two guards keep an
occurrence to one job even when two machines do this at once: the schedule's
`next_run` only moves by compare-and-set in the same transaction that inserts
the jobs, and each job carries the unique key `name@occurrence`.

Every occurrence a schedule cancels (paused, removed, edited, missed) is cancelled as an operator's cancel is
(store/jobs.py cancel_queued): the jobs that run after it are cancelled with it, with the reason.

Each schedule is planned on its own: one that cannot be (a row written by SQL
with every = 0, a time zone this machine does not know) is paused, and its
reason is left as a failed job of the schedule, where the operator looks; the
rest of the farm's work goes on.
"""

import importlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import String, Text, and_, case, delete, exc, false, func, insert, literal, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement

from ..rules.errors import BadJobInput, InvalidJob, NotFound, echoed
from ..rules.events import EventKind
from ..rules.job import JobSpec
from ..rules.output import format_time
from ..rules.schedules import (
    DEFAULT_GRACE,
    DEFAULT_MISFIRE,
    DEFAULT_OVERLAP,
    Recurrence,
    backfilled,
    check_overlap,
    check_policy,
    check_schedule_name,
    due_of,
    first_occurrence,
    is_run_now,
    jitter_of,
    plan,
    run_now_key,
)
from ..rules.states import JobState
from .base import StoreBase
from .dbtime import db_now
from .events import record_event
from .history import run_history, with_machine_name
from .inserts import job_row
from .jobs import cancel_queued
from .schedule_policy import PolicyPass, has_policy, job_order_key, uses_policy
from .schedule_policy import made as _made
from .schedule_policy import origin as _origin
from .schedule_policy import waiting as _waiting
from .schema import jobs, schedules
from .sql.fair import key_of, tag
from .sql.gates import gated_now
from .views import KEYS_PER_STATEMENT

log = logging.getLogger("queueprocessor.schedules")

RECURRENCE = ("cron", "tz", "every")
# The job a schedule keeps for its occurrences: these fields of the JobSpec it was given (the key and origin are each
# occurrence's own, see _spec).
SPEC = ("executor", "target", "method", "payload", "priority", "max_attempts", "timeout", "queue", "order_key")
WORK = ("executor", "target", "method", "payload", "queue")  # what an edit may change of the jobs it makes
MADE_WITH = ("overlap", "jitter")  # what else an occurrence's job is made with (its order key, its time)
EDITABLE = (*RECURRENCE, *WORK, *MADE_WITH)  # what an occurrence's job is made of, besides what an edit leaves alone
POLICY = ("misfire", "grace", "pause_on_failure")  # what else an edit may change
LAST_RUNS = 10  # occurrences `last_runs` reads unless asked for more
MS = 0.001  # an occurrence's key names its time to the millisecond (Recurrence.label)
RUN_COLUMNS = ("attempt", "machine_id", "machine_name", "started_at", "finished_at", "outcome", "error")


@dataclass(frozen=True)
class Materialised:
    jobs: int  # jobs made this pass
    next_schedule: float | None  # the earliest occurrence still to be made, as far as this pass saw


class ScheduleStore:
    def __init__(self, store: StoreBase):
        self.store = store

    def add(
        self,
        name: str,
        recurrence: Recurrence,
        spec: JobSpec,
        *,
        misfire: str = DEFAULT_MISFIRE,
        grace: float = DEFAULT_GRACE,
        overlap: str = DEFAULT_OVERLAP,
        jitter: float = 0.0,
        pause_on_failure: int | None = None,
        ahead: float,
        period: float,
    ) -> dict[str, Any]:
        """Store a schedule and make its first occurrences within `ahead` seconds into jobs at once. The first is
        more than two periods away (see first_occurrence). Its failures are counted from the jobs made after it
        (a removed schedule's of the same name are not its own)."""
        check_schedule_name(name)
        check_policy(misfire, grace)
        check_overlap(overlap, jitter, pause_on_failure)
        now = self.store.ask_time()
        row = dict(
            name=name,
            cron=recurrence.cron,
            tz=recurrence.tz,
            every=recurrence.every,
            misfire=misfire,
            grace=grace,
            paused=False,
            next_run=first_occurrence(recurrence, now, period),
            overlap=overlap,
            jitter=float(jitter),
            pause_on_failure=pause_on_failure,
            **{field: getattr(spec, field) for field in SPEC},
        )
        try:
            with self.store.engine.begin() as conn:
                conn.execute(insert(schedules).values(created_at=db_now(), counted=_newest_job(), **row))
                record_event(conn, EventKind.SCHEDULE_ADDED, name, _described(row), self.store.actor)
        except exc.IntegrityError:
            raise InvalidJob(
                f"a schedule named {echoed(name)} already exists: remove it first, or pick another name"
            ) from None
        self.materialise(ahead=ahead, period=period, names=[name])
        return self.get(name)

    def get(self, name: str) -> dict[str, Any]:
        rows = self.store.rows(select(schedules).where(schedules.c.name == name))
        if not rows:
            raise NotFound(f"no schedule named {echoed(name)}", what="schedule", ref=name)
        return dict(rows[0]._mapping)

    def work(self) -> list[tuple[str, str]]:
        """(executor, target) of every active schedule: what a node loads ahead (see node/warmup.py)."""
        rows = self.store.rows(select(schedules.c.executor, schedules.c.target).where(schedules.c.paused == false()))
        return sorted({(executor, target) for executor, target in rows})

    def all(self) -> list[dict[str, Any]]:
        return [dict(r._mapping) for r in self.store.rows(select(schedules).order_by(schedules.c.name))]

    def remove(self, name: str) -> int:
        """Delete a schedule and cancel its occurrences still waiting in the queue. Returns how many."""
        with self.store.engine.begin() as conn:
            if not conn.execute(delete(schedules).where(schedules.c.name == name)).rowcount:
                raise NotFound(f"no schedule named {echoed(name)}", what="schedule", ref=name)
            return self._cancelled(conn, EventKind.SCHEDULE_REMOVED, name)

    def pause(self, name: str, until: float | None = None) -> int:
        """Stop making occurrences; cancel those already waiting. Returns how many were cancelled. With `until`
        (epoch seconds, later than now in database time), the turn-holder's pass resumes it at that time, once
        (store/schedule_policy.py); a pause without it, or a resume, forgets it."""
        if until is not None and not until > self.store.ask_time():
            raise BadJobInput("{0} must be later than now", "until")
        with self.store.engine.begin() as conn:
            paused = update(schedules).where(schedules.c.name == name)
            if not conn.execute(paused.values(paused=True, paused_until=until, paused_why=None)).rowcount:
                raise NotFound(f"no schedule named {echoed(name)}", what="schedule", ref=name)
            if until is None:
                return self._cancelled(conn, EventKind.SCHEDULE_PAUSED, name)
            cancelled = self._cancel_queued(conn, name)
            detail = f"until {format_time(until)}: {cancelled} waiting occurrences cancelled"
            record_event(conn, EventKind.SCHEDULE_PAUSED, name, detail, self.store.actor)
            return cancelled

    def resume(self, name: str, *, ahead: float, period: float) -> dict[str, Any]:
        """Start again from the next occurrence more than two periods away (see first_occurrence); those that fell
        in the pause are not run."""
        schedule = self.get(name)
        if schedule["paused"]:
            restart = first_occurrence(Recurrence.checked(schedule), self.store.ask_time(), period)
            with self.store.engine.begin() as conn:
                resumed = update(schedules).where(schedules.c.name == name, schedules.c.paused)
                values = dict(paused=False, next_run=restart, paused_until=None, paused_why=None, failures=None)
                if conn.execute(resumed.values(values)).rowcount:
                    record_event(conn, EventKind.SCHEDULE_RESUMED, name, None, self.store.actor)
            self.materialise(ahead=ahead, period=period, names=[name])
        return self.get(name)

    def _cancelled(self, conn: Connection, kind: EventKind, name: str) -> int:
        """Cancel the schedule's waiting occurrences and log `kind`, saying how many."""
        cancelled = self._cancel_queued(conn, name)
        record_event(conn, kind, name, f"{cancelled} waiting occurrences cancelled", self.store.actor)
        return cancelled

    @staticmethod
    def _cancel_queued(conn: Connection, name: str) -> int:
        """Cancel the schedule's waiting occurrences, and only those (see schedule_policy.waiting), with the jobs
        that wait for them (store/jobs.py cancel_queued)."""
        return cancel_queued(conn, _waiting(jobs, name), f"schedule {name} was removed or paused")

    def drop_missed(self) -> int:
        """Cancel waiting occurrences later than their schedule's grace: made into jobs in time, they were not
        started before the farm went down (or stopped taking turns). As for occurrences made late (see plan):
        `skip` drops them all, `once` keeps the newest of them, `all` runs each. Returns how many were dropped."""
        policies = self.store.rows(
            select(schedules.c.name, schedules.c.misfire, schedules.c.grace).where(
                schedules.c.misfire.in_(("skip", "once"))
            )
        )
        dropped = 0
        for name, misfire, grace in policies:
            stale = and_(_waiting(jobs, name), jobs.c.run_at < db_now() - grace)
            if misfire == "once":
                other = jobs.alias("newest")
                newest = select(func.max(other.c.run_at)).where(
                    _waiting(other, name), other.c.run_at < db_now() - grace
                )
                stale = and_(stale, jobs.c.run_at < newest.scalar_subquery())
            reason = f"missed: more than {grace:g} s late, beyond the schedule's grace (misfire policy {misfire})"
            with self.store.engine.begin() as conn:
                count = cancel_queued(conn, stale, reason)
            if count:
                log.warning("schedule %s: %s occurrences %s", name, count, reason)
            dropped += count
        return dropped

    def materialise(self, *, ahead: float, period: float, names: list[str] | None = None) -> Materialised:
        """Make every active schedule's occurrences up to `ahead` seconds from now into jobs, and apply the
        policies of those that have one (store/schedule_policy.py), which read the same rows."""
        horizon = db_now() + ahead
        later = (
            select(func.min(schedules.c.next_run))
            .where(schedules.c.paused == false(), schedules.c.next_run > horizon)
            .scalar_subquery()
        )
        due = and_(schedules.c.paused == false(), schedules.c.next_run <= horizon)
        query = select(db_now(), later, case((due, 1), else_=0).label("due"), schedules).where(or_(due, has_policy()))
        if names is not None:
            query = query.where(schedules.c.name.in_(names))
        rows = self.store.rows(query)
        if not rows:
            return Materialised(0, None)
        now, upcoming = rows[0][0], rows[0][1]
        made, policies = 0, PolicyPass(self.store, period)
        for row in rows:
            schedule = dict(row._mapping)
            if (uses_policy(schedule) and policies.apply(schedule, now)) or not row.due:
                wake = now if schedule["paused_until"] is None else schedule["paused_until"]
                upcoming = wake if upcoming is None else min(upcoming, wake)  # the policy looks again next turn
                continue
            try:
                recurrence = Recurrence.checked(schedule)
                todo = plan(
                    recurrence,
                    schedule["next_run"],
                    now,
                    ahead=ahead,
                    period=period,
                    misfire=schedule["misfire"],
                    grace=schedule["grace"],
                )
            except Exception as error:  # this schedule alone: the database's own errors never reach here
                self._halt(schedule, error)
                continue
            if self._advance(schedule, recurrence, todo.occurrences, todo.next_run):
                made += len(todo.occurrences)
            upcoming = todo.next_run if upcoming is None else min(upcoming, todo.next_run)
            if schedule["overlap"] != DEFAULT_OVERLAP:
                upcoming = min(upcoming, now)
        return Materialised(made, upcoming)

    def _advance(
        self, schedule: dict[str, Any], recurrence: Recurrence, occurrences: list[float], next_run: float
    ) -> bool:
        """Move next_run on (compare-and-set) and insert the jobs, in one transaction. False if another
        machine moved it first."""
        name = schedule["name"]
        with self.store.engine.begin() as conn:
            moved = conn.execute(
                update(schedules)
                .where(
                    and_(schedules.c.id == schedule["id"], schedules.c.next_run == schedule["next_run"]),
                    *_as_read(schedule, (*EDITABLE, "paused")),  # an edit or pause since it was read: made anew
                )
                .values(next_run=next_run)
            ).rowcount
            if not moved:
                return False
            keys = [f"{name}@{recurrence.label(t)}" for t in occurrences]
            rows = [
                _job_row(schedule, key, t + jitter_of(key, schedule["jitter"]))
                for key, t in zip(keys, occurrences, strict=True)
            ]
            if rows:
                self._insert_new(conn, rows, schedule["queue"])
        return True

    def _halt(self, schedule: dict[str, Any], error: Exception) -> None:
        """Pause a schedule that cannot be planned and leave the reason as a failed job signed by it (the
        schedule table has no place for it); only the machine whose pause went in says so, once."""
        name = schedule["name"]
        reason = (
            f"schedule {name} paused: it cannot be planned ({error or type(error).__name__}); "
            "correct or remove it, then resume it"
        )
        with self.store.engine.begin() as conn:
            paused = update(schedules).where(schedules.c.id == schedule["id"], schedules.c.paused == false())
            if not conn.execute(paused.values(paused=True)).rowcount:
                return
            signed = _job_row(schedule, None, db_now()) | dict(order_key=None, state=JobState.FAILED, last_error=reason)
            conn.execute(insert(jobs).values(signed | dict(created_at=db_now(), finished_at=db_now())))
        log.warning("%s", reason)

    def _insert_new(self, conn: Connection, rows: list[dict[str, Any]], queue: str) -> int:
        """Insert jobs of `queue`, leaving out any whose key already exists (an occurrence made before); how many
        it inserted (counted by RETURNING: a driver's rowcount of ON CONFLICT DO NOTHING is not to be trusted)."""
        dialect = self.store.dialect
        queued, first = literal(queue, String), rows[0]  # one schedule's: the same order key and payload
        fair_key = key_of(dialect, queued, literal(first["order_key"], String), literal(first["payload"], Text))
        made = dict(
            created_at=db_now(), gated=gated_now(queued), fair_key=fair_key, vtag=tag(queued, fair_key, maybe_null=True)
        )
        rows = [{name: value for name, value in row.items() if name != "fair_key"} for row in rows]
        # SQLite's own INSERT ... ON CONFLICT, loaded only here. Not PostgreSQL's: a key is unique there through a
        # trigger's side table (store/job_partitions.py), whose conflict it cannot skip; a savepoint a row instead.
        if dialect == "sqlite":
            module = importlib.import_module("sqlalchemy.dialects.sqlite")
            statement = module.insert(jobs).values(**made).on_conflict_do_nothing()
            return len(conn.execute(statement.returning(jobs.c.id), rows).all())
        inserted = 0
        for row in rows:
            try:
                with conn.begin_nested():
                    inserted += len(conn.execute(insert(jobs).values(**made, **row).returning(jobs.c.id)).all())
            except exc.IntegrityError:
                pass
        return inserted

    # -- an operator's steering: run now, edit, the last runs (docs/design.md §6) --

    def run_now(self, name: str, request: str) -> int:
        """One extra occurrence, due now, keyed by `request` (run_now_key): sent again, from this machine or
        another, the same request finds the job it made rather than make a second. Returns its job's id. The
        regular occurrences are not touched; a paused schedule runs it too, since an operator asked."""
        key = run_now_key(name, request)
        schedule, now = self.get(name), self.store.ask_time()
        with self.store.engine.begin() as conn:
            if self._insert_new(conn, [_job_row(schedule, key, now)], schedule["queue"]):  # not a request resent
                record_event(conn, EventKind.SCHEDULE_RUN, name, f"once, now: {_work(schedule)}", self.store.actor)
        made = self.store.rows(select(jobs.c.id).where(jobs.c.key == key, _made(jobs, name)))
        if not made:
            raise InvalidJob(f"the key {echoed(key)} is held by a job no run-now made: use another request")
        job_id: int = made[0][0]
        return job_id

    def backfill(self, name: str, start: float, end: float) -> int:
        """Make each occurrence of the schedule in [start, end] (a past range: rules.schedules.backfilled) that has no
        job yet into one, due now: its key `NAME@TIME` lets it in once, however often and from however many machines
        the range is asked for. Paused or not, as an operator asked; jitter is not applied (they are due now); the
        misfire rules do not drop them at their making (they apply to a pass's late occurrences), only, as for any
        occurrence, one still waiting more than the grace after its making. How many it made."""
        schedule, now = self.get(name), self.store.ask_time()
        recurrence = Recurrence.of(schedule)
        times = backfilled(recurrence, start, end, now)
        if not times:
            return 0
        rows = [_job_row(schedule, f"{name}@{recurrence.label(t)}", now) for t in times]
        with self.store.engine.begin() as conn:
            count = self._insert_new(conn, rows, schedule["queue"])
            detail = f"{count} of the {len(times)} occurrences from {format_time(start)} to {format_time(end)}"
            record_event(conn, EventKind.SCHEDULE_BACKFILLED, name, detail, self.store.actor)
        return count

    def edit(self, name: str, changes: dict[str, Any], *, ahead: float, period: float) -> dict[str, Any]:
        """Write the columns in `changes` (checked by the caller) that differ. A new recurrence starts from its
        first occurrence after the settling time (first_occurrence), so no missed burst fires; its waiting
        occurrences of the old one are cancelled. New work is written into the occurrences still waiting (one
        already claimed runs as it was). A paused schedule stays paused. Guarded by the values it read, so an
        edit, pause or resume meanwhile makes it read again."""
        for _ in range(3):
            schedule = self.get(name)
            values = {column: value for column, value in changes.items() if schedule[column] != value}
            if not values:
                return schedule
            recurs = not values.keys().isdisjoint(RECURRENCE)
            guard = _as_read(schedule, ("paused", *values))
            if "pause_on_failure" in values:  # counted from the jobs made after it is set
                values |= dict(failures=None, counted=_newest_job())
            if recurs and not schedule["paused"]:
                restart = first_occurrence(Recurrence.of(schedule | values), self.store.ask_time(), period)
                values["next_run"] = restart
            with self.store.engine.begin() as conn:
                if conn.execute(
                    update(schedules).where(schedules.c.id == schedule["id"], *guard).values(values)
                ).rowcount:
                    self._rework_waiting(conn, schedule | values, recurs, set(values))
                    changed = ", ".join(column for column in EDITABLE + POLICY if column in values)
                    detail = f"{_described(schedule | values)} ({changed} changed)"
                    record_event(conn, EventKind.SCHEDULE_EDITED, name, detail, self.store.actor)
                    break
        else:
            raise InvalidJob(f"schedule {echoed(name)} kept changing while it was edited: try again")
        if recurs and not schedule["paused"]:
            self.materialise(ahead=ahead, period=period, names=[name])
        return self.get(name)

    @staticmethod
    def _rework_waiting(conn: Connection, schedule: dict[str, Any], recurs: bool, changed: set[str]) -> None:
        """Bring an edited schedule's waiting occurrences in line: under a new recurrence those it does not have
        are cancelled (one it has too keeps its job, whose key the new one would use), and what waits is given
        the schedule's work as it is now (if it `changed`), and its order key under a new overlap policy (a run
        already going on keeps its own: see docs/design.md §6). A run-now is never the recurrence's to cancel."""
        name = schedule["name"]
        if recurs:
            recurrence = Recurrence.of(schedule)
            queued = conn.execute(select(jobs.c.id, jobs.c.key, jobs.c.created_at).where(_waiting(jobs, name)))
            stale = [job.id for job in queued if not _recurs_at(recurrence, name, job.key, job.created_at)]
            reason = f"schedule {name} was edited: its occurrences follow the new recurrence"
            for start in range(0, len(stale), KEYS_PER_STATEMENT):
                cancel_queued(
                    conn,
                    and_(
                        jobs.c.id.in_(stale[start : start + KEYS_PER_STATEMENT]),
                        jobs.c.state == JobState.QUEUED,
                        jobs.c.attempts == 0,  # a retry of an occurrence that came is still owed its run
                    ),
                    reason,
                )
        if not changed.isdisjoint(WORK):
            work = {column: schedule[column] for column in WORK}
            gated = gated_now(literal(schedule["queue"], String))
            conn.execute(update(jobs).where(_waiting(jobs, name)).values(**work, gated=gated))
        if "overlap" in changed:
            conn.execute(update(jobs).where(_waiting(jobs, name)).values(order_key=job_order_key(schedule)))

    def last_runs(self, name: str, limit: int = LAST_RUNS) -> list[dict[str, Any]]:
        """The schedule's newest `limit` occurrences that started or ended, newest first, as their runs (every
        attempt, newest first; one that never ran, e.g. dropped as missed, as its job's end). Each row: `job`,
        `key`, `manual` (a run-now), `due` (see due_of), `attempt`, `machine_id`, `machine_name`, `started_at`,
        `finished_at`, `outcome`, `error` and `late`, its start minus its due time."""
        self.get(name)
        begun = or_(jobs.c.state != JobState.QUEUED, jobs.c.attempts > 0)  # a retry waiting has runs too
        made = self.store.rows(
            select(jobs.c.id, jobs.c.key, jobs.c.created_at, jobs.c.state, jobs.c.finished_at, jobs.c.last_error)
            .where(_made(jobs, name), begun)
            .order_by(jobs.c.id.desc())
            .limit(limit)
        )
        history = run_history()
        runs: dict[int, list[dict[str, Any]]] = {}
        if made:
            read = with_machine_name(select(history), history).where(history.c.job_id.in_([job.id for job in made]))
            for run in self.store.rows(read.order_by(history.c.started_at.desc())):
                runs.setdefault(run.job_id, []).append(dict(run._mapping))
        rows = []
        for job in made:
            due = due_of(name, job.key, job.created_at)
            occurrence = dict(job=job.id, key=job.key, manual=is_run_now(name, job.key), due=due)
            ended = dict(attempt=None, machine_id=None, machine_name=None, started_at=None, finished_at=job.finished_at)
            for run in runs.get(job.id) or [ended | dict(outcome=job.state, error=job.last_error)]:
                started = run["started_at"]
                rows.append(
                    occurrence
                    | {column: run[column] for column in RUN_COLUMNS}
                    | dict(late=None if started is None else started - due)
                )
        return rows


def _newest_job() -> Any:
    """The newest job's id (0 if none): a schedule counts its failures from the jobs made after it."""
    return select(func.coalesce(func.max(jobs.c.id), 0)).scalar_subquery()


def _recurs_at(recurrence: Recurrence, name: str, key: str, created_at: float) -> bool:
    """Is the waiting occurrence keyed `key` one that `recurrence` has too (or a run-now, which any has)?"""
    if is_run_now(name, key):
        return True
    due = due_of(name, key, created_at)
    return key == f"{name}@{recurrence.label(recurrence.after(due - MS))}"


def _as_read(schedule: dict[str, Any], columns: Iterable[str]) -> list[ColumnElement[bool]]:
    """Conditions that the schedule's `columns` still hold the values `schedule` read."""
    return [
        schedules.c[column].is_(None) if schedule[column] is None else schedules.c[column] == schedule[column]
        for column in columns
    ]


def _spec(schedule: dict[str, Any], key: str | None) -> JobSpec:
    """The job of one occurrence of `schedule`, keyed `key`: its row's SPEC columns, signed as its own."""
    work = {field: schedule[field] for field in SPEC} | dict(order_key=job_order_key(schedule))
    return JobSpec(**work, key=key, origin=_origin(schedule["name"]))


def _job_row(schedule: dict[str, Any], key: str | None, run_at: Any) -> dict[str, Any]:
    """The row of one occurrence of `schedule`'s job (see _spec), due at `run_at`."""
    return job_row(_spec(schedule, key)) | dict(run_at=run_at)


def _described(row: dict[str, Any]) -> str:
    """A schedule as the event log tells of it: when it runs and what."""
    when = f"every {row['every']:g} s" if row["every"] is not None else f"cron {row['cron']} ({row['tz']})"
    return f"{when}: {_work(row)}"


def _work(row: dict[str, Any]) -> str:
    """What a schedule runs, as the event log tells of it (never its payload, which may hold a secret)."""
    return f"{row['executor']} {row['target']} in queue {row['queue']}"
