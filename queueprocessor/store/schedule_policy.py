"""What a schedule's policies do at the turn-holder's schedule pass (docs/design.md §6): its overlap policy,
its resume at a set time, and its pause after failed runs in a row.

Overlap. Every job of a schedule whose overlap is not `allow` carries an order key (rules.schedules.order_key_of),
so the claim's own rules and the unique index of running order keys (ux_qp_jobs_order_running) make two of its
runs at once impossible, through kills and freezes: a dead machine's run holds the key until a claim takes that
very job over under a new fence. The policy only decides what happens to an occurrence that falls due (its
time plus its jitter passes) after a run of the schedule started and while it goes on (running, or waiting for
its next attempt): `skip` cancels it, `buffer-one` keeps the first of them and cancels the rest, and
`cancel-previous` asks the run to stop and keeps the newest. An occurrence due before that run started (one
made late under the misfire rules, a backfill's), and an operator's run now, waits its turn and is never
skipped. Each decision is a guarded write: a cancel only of a job still queued with no attempt made (one a
claim took meanwhile is left alone), a stop only of a job still running and not yet asked.

A failed run never stops a schedule for good: in a queue whose order keys block on a failure
(on_failure=block), the farm's own key is taken off the schedule's runs that failed for good. A key the user
gave blocks as the user's queue says.

Pause on failure: the schedule's ended jobs are read in id order past the last one counted (`counted`), up to
the first still unfinished, at each pass: a failure for good counts one more, a success resets the count, a
cancelled one (a skipped occurrence) neither. The count and the mark move by compare-and-set, so two machines
never count a run twice; at N the schedule pauses with its reason in `paused_why` and an event.

A schedule that uses none of it is not read here: the pass reads the rows of those that do alone
(`has_policy`), and the heartbeat wakes the turn-holder's pass at every turn only while one exists.
"""

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, false, literal, or_, select, update
from sqlalchemy.sql import ColumnElement, FromClause

from ..rules.events import EventKind
from ..rules.queues import OnFailure
from ..rules.schedules import DEFAULT_OVERLAP, Recurrence, due_of, first_occurrence, is_run_now, jitter_of, order_key_of
from ..rules.states import JobState
from .base import StoreBase
from .events import record_event
from .jobs import cancel_queued, stop_running
from .schema import jobs, queues, schedules

log = logging.getLogger("queueprocessor.schedules")

MAX_COUNTED = 200  # ended jobs one pass counts per schedule (the rest at the next)
MAX_LOOKED = 1000  # unfinished jobs one pass reads per schedule
ENDED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def origin(name: str) -> str:
    """How a schedule signs the jobs it makes."""
    return f"schedule {name}"


def made(table: FromClause, name: str) -> ColumnElement[bool]:
    """The schedule's occurrences, regular and run-now. A grab may use the same name@instance form (`grab NAME
    INSTANCE`), so the key alone does not tell them apart, the origin does."""
    return and_(table.c.key.startswith(f"{name}@", autoescape=True), table.c.origin == origin(name))


def waiting(table: FromClause, name: str) -> ColumnElement[bool]:
    """The schedule's occurrences still in the queue."""
    return and_(made(table, name), table.c.state == JobState.QUEUED)


def has_policy() -> ColumnElement[bool]:
    """A schedule row the pass must look at whatever its next occurrence: an overlap policy or a pause on
    failure while active, a time to resume at while paused."""
    return or_(
        and_(
            schedules.c.paused == false(),
            or_(schedules.c.overlap != DEFAULT_OVERLAP, schedules.c.pause_on_failure.isnot(None)),
        ),
        and_(schedules.c.paused, schedules.c.paused_until.isnot(None)),
    )


def wake_at() -> ColumnElement[Any]:
    """When the turn-holder's pass must next look at a schedule (the heartbeat's minimum over them): its next
    occurrence, or at once while a policy needs a look at every turn, or its time to resume at; NULL if never."""
    return case(
        (schedules.c.paused, schedules.c.paused_until),
        (or_(schedules.c.overlap != DEFAULT_OVERLAP, schedules.c.pause_on_failure.isnot(None)), literal(0.0)),
        else_=schedules.c.next_run,
    )


def job_order_key(schedule: dict[str, Any]) -> str | None:
    return order_key_of(schedule["name"], schedule["overlap"], schedule["order_key"])


@dataclass(frozen=True)
class Going:
    """The schedule's jobs at a pass: the runs going on (running, or waiting for a next attempt) and the
    occurrences due and never started."""

    running: list[Any]
    retrying: list[Any]
    due: list[Any]

    def since(self) -> float | None:
        """When the earliest run going on started (None: none goes on)."""
        on = [job.started_at if job.started_at is not None else job.created_at for job in self.running + self.retrying]
        return min(on) if on else None


class PolicyPass:
    """A schedule's policies, applied by the turn-holder's pass (ScheduleStore.materialise) to its row as read."""

    def __init__(self, store: StoreBase, period: float):
        self.store = store
        self.period = period

    def apply(self, schedule: dict[str, Any], now: float) -> bool:
        """Apply `schedule`'s policies at database time `now`; whether its row changed (paused or resumed)."""
        if schedule["paused"]:
            until = schedule["paused_until"]
            return until is not None and until <= now and self._resume(schedule, now)
        if schedule["overlap"] != DEFAULT_OVERLAP:
            self._overlap(schedule, now)
        if schedule["pause_on_failure"] is not None:
            return self._count_failures(schedule)
        return False

    def _resume(self, schedule: dict[str, Any], now: float) -> bool:
        """Resume a schedule paused until now, once (compare-and-set on its pause), from its next occurrence more
        than two periods away, as an operator's resume does."""
        restart = first_occurrence(Recurrence.of(schedule), now, self.period)
        with self.store.engine.begin() as conn:
            resumed = update(schedules).where(
                schedules.c.id == schedule["id"],
                schedules.c.paused,
                schedules.c.paused_until == schedule["paused_until"],
            )
            values = dict(paused=False, paused_until=None, paused_why=None, failures=None, next_run=restart)
            if not conn.execute(resumed.values(values)).rowcount:
                return False
            record_event(conn, EventKind.SCHEDULE_RESUMED, schedule["name"], "at the time it was paused until")
        return True

    def _read(self, name: str, now: float) -> Going:
        rows = self.store.rows(
            select(jobs.c.id, jobs.c.key, jobs.c.state, jobs.c.attempts, jobs.c.created_at, jobs.c.started_at)
            .where(
                made(jobs, name),
                or_(
                    jobs.c.state == JobState.RUNNING,
                    and_(jobs.c.state == JobState.QUEUED, or_(jobs.c.attempts > 0, jobs.c.run_at <= now)),
                ),
            )
            .order_by(jobs.c.id)
            .limit(MAX_LOOKED)
        )
        running = [job for job in rows if job.state == JobState.RUNNING]
        retrying = [job for job in rows if job.state == JobState.QUEUED and job.attempts > 0]
        due = [job for job in rows if job.state == JobState.QUEUED and job.attempts == 0]
        return Going(running, retrying, due)

    def _overlap(self, schedule: dict[str, Any], now: float) -> None:
        """The overlap policy on the occurrences that fell due while a run goes on (see the module's rules)."""
        name, overlap = schedule["name"], schedule["overlap"]
        going = self._read(name, now)
        since = going.since()
        if since is not None:
            fell = [
                job for job in going.due if not is_run_now(name, job.key) and self._falls_due(schedule, job) > since
            ]
            if fell:
                previous = (going.running + going.retrying)[0].id
                if overlap == "buffer-one":
                    kept = fell[0]
                    why = f"skipped: overlap=buffer-one, job {kept.id} already waits for job {previous} to end"
                    self._skip(name, fell[1:], why)
                elif overlap == "cancel-previous":
                    self._cancel_previous(name, going, fell)
                else:
                    self._skip(
                        name, fell, f"skipped: overlap=skip, job {previous} (the previous run) was still running"
                    )
        if schedule["order_key"] is None:
            self._unblock(name, job_order_key(schedule))

    def _falls_due(self, schedule: dict[str, Any], job: Any) -> float:
        """When an occurrence falls due: its time, as its key names it, plus its jitter."""
        return due_of(schedule["name"], job.key, job.created_at) + jitter_of(job.key, schedule["jitter"])

    def _skip(self, name: str, skipped: list[Any], why: str) -> None:
        if not skipped:
            return
        with self.store.engine.begin() as conn:
            ids = [job.id for job in skipped]
            count = cancel_queued(conn, and_(jobs.c.id.in_(ids), jobs.c.attempts == 0), why)
            if count:
                record_event(conn, EventKind.SCHEDULE_SKIPPED, name, f"{count} occurrences {why}")
        if count:
            log.info("schedule %s: %s occurrences %s", name, count, why)

    def _cancel_previous(self, name: str, going: Going, fell: list[Any]) -> None:
        """Keep the newest occurrence that fell due: ask the runs going on to stop (a retry waiting is cancelled)
        and cancel the older ones."""
        newest = fell[-1]
        why = f"skipped: overlap=cancel-previous, job {newest.id} (a newer occurrence) fell due"
        self._skip(name, fell[:-1] + going.retrying, why)
        if not going.running:
            return
        with self.store.engine.begin() as conn:
            ids = [job.id for job in going.running]
            asked = conn.execute(stop_running(and_(jobs.c.id.in_(ids), jobs.c.cancel_requested == false()))).rowcount
            if asked:
                detail = (
                    f"job {', '.join(map(str, ids))} asked to stop: overlap=cancel-previous, job {newest.id} fell due"
                )
                record_event(conn, EventKind.SCHEDULE_STOPPED, name, detail)

    def _unblock(self, name: str, key: str | None) -> None:
        """Take the farm's own order key off the schedule's runs that failed for good in a queue whose keys block on
        a failure, so that the next occurrence can run (the key was the farm's, not a user's ask to block)."""
        blocking = select(queues.c.name).where(queues.c.on_failure == OnFailure.BLOCK)
        with self.store.engine.begin() as conn:
            conn.execute(
                update(jobs)
                .where(made(jobs, name), jobs.c.state == JobState.FAILED, jobs.c.order_key == key)
                .where(jobs.c.queue.in_(blocking))
                .values(order_key=None)
            )

    def _count_failures(self, schedule: dict[str, Any]) -> bool:
        """Count the schedule's runs that ended since the last counted (see the module's rules); pause it at its
        pause_on_failure. Whether it paused."""
        name, counted = schedule["name"], schedule["counted"]
        rows = self.store.rows(
            select(jobs.c.id, jobs.c.state, jobs.c.last_error)
            .where(made(jobs, name), jobs.c.id > (counted or 0))
            .order_by(jobs.c.id)
            .limit(MAX_COUNTED)
        )
        failures, mark, last = schedule["failures"] or 0, counted, None
        for job in rows:
            if job.state not in ENDED:
                break
            if job.state == JobState.SUCCEEDED:
                failures = 0
            elif job.state == JobState.FAILED:
                failures, last = failures + 1, job
            mark = job.id
        if mark == counted:
            return False
        pause = failures >= schedule["pause_on_failure"]
        values: dict[str, Any] = dict(failures=failures, counted=mark)
        if pause:
            why = f"paused on failure: {failures} runs in a row failed for good"
            if last is not None:
                error = (last.last_error or "").strip().splitlines()[:1]
                why += f" (the last, job {last.id}: {error[0][:200] if error else 'no error given'})"
            values |= dict(paused=True, paused_why=why[:400])
        with self.store.engine.begin() as conn:
            guard = schedules.c.counted.is_(None) if counted is None else schedules.c.counted == counted
            if not conn.execute(
                update(schedules)
                .where(schedules.c.id == schedule["id"], guard, schedules.c.paused == false())
                .values(values)
            ).rowcount:
                return False
            if pause:
                cancelled = cancel_queued(conn, waiting(jobs, name), f"schedule {name} was removed or paused")
                record_event(conn, EventKind.SCHEDULE_PAUSED, name, f"{why}; {cancelled} waiting occurrences cancelled")
        if pause:
            log.warning("schedule %s %s", name, why)
        return bool(pause)
