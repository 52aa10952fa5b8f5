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
(on_failure=block), the farm's own key is taken off the schedule's runs that failed for good, at a pass that finds
an occurrence due and none of its runs going on. A key the user gave blocks as the user's queue says.

Pause on failure: the schedule's ended jobs are read in id order from its mark (`counted`: every job of the
schedule up to it has ended) up to its oldest unfinished one, at the pass that makes its occurrences (and at every
turn under an overlap policy): a failure for good counts one more, a success resets the count, a cancelled one (a
skipped occurrence) neither. The count and the mark move by compare-and-set, so two machines never count a run
twice; at N the schedule pauses with its reason in `paused_why` and an event. An overlap policy's reads start at
the mark too, and by the order keys' index (queue, key, id), so a pass reads the schedule's jobs since its oldest
unfinished one, not the farm's.

A schedule that uses none of it is not read here (uses_policy), and the heartbeat wakes the turn-holder's pass at
every turn only while a schedule with an overlap policy exists (wake_at).
"""

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, false, literal, or_, select, true, update
from sqlalchemy.sql import ColumnElement, FromClause

from ..rules.events import EventKind
from ..rules.queues import OnFailure
from ..rules.schedules import (
    DEFAULT_OVERLAP,
    SKIPPED,
    Recurrence,
    due_of,
    first_occurrence,
    is_run_now,
    jitter_of,
    order_key_of,
)
from ..rules.states import JobState
from .base import StoreBase
from .events import record_event
from .jobs import cancel_queued, stop_running
from .schema import jobs, queues, schedules

log = logging.getLogger("queueprocessor.schedules")

MAX_COUNTED = 200  # ended jobs one pass counts per schedule (the rest at the next)
MAX_LOOKED = 1000  # unfinished jobs one pass reads per schedule (the oldest: the runs going on come first)
UNFINISHED = (JobState.QUEUED, JobState.RUNNING, JobState.WAITING)


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
    """A schedule row the pass must look at whatever its next occurrence: an overlap policy while active, a time
    to resume at while paused. (A pause on failure alone is counted when its occurrences are made.)"""
    return or_(
        and_(schedules.c.paused == false(), schedules.c.overlap != DEFAULT_OVERLAP),
        and_(schedules.c.paused, schedules.c.paused_until.isnot(None)),
    )


def wake_at() -> ColumnElement[Any]:
    """When the turn-holder's pass must next look at a schedule (the heartbeat's minimum over them): its next
    occurrence, or at once while an overlap policy needs a look at every turn, or its time to resume at; NULL if
    never."""
    return case(
        (schedules.c.paused == true(), schedules.c.paused_until),
        (schedules.c.overlap != DEFAULT_OVERLAP, literal(0.0)),
        else_=schedules.c.next_run,
    )


def uses_policy(schedule: dict[str, Any]) -> bool:
    """Does the pass apply anything to this schedule row?"""
    return bool(schedule["paused"] or schedule["overlap"] != DEFAULT_OVERLAP or schedule["pause_on_failure"])


def job_order_key(schedule: dict[str, Any]) -> str | None:
    return order_key_of(schedule["name"], schedule["overlap"], schedule["order_key"])


@dataclass(frozen=True)
class Going:
    """The schedule's jobs at a pass: the runs going on (running, or waiting for a next attempt) and the
    occurrences due and never started."""

    running: list[Any]
    retrying: list[Any]
    due: list[Any]
    first: int | None  # the oldest unfinished job's id: every job of the schedule before it has ended

    def since(self) -> float | None:
        """When the earliest run going on started (None: none goes on)."""
        on = [job.started_at if job.started_at is not None else job.created_at for job in self.running + self.retrying]
        return min(on) if on else None


class PolicyPass:
    """A schedule's policies, applied by the turn-holder's pass (ScheduleStore.materialise) to its row as read.

    Its reads start at the schedule's mark (`counted`): every job of the schedule up to it has ended (and, with a
    pause on failure, been counted). A schedule with an order key (all but `allow`, or the user's) reads its jobs
    by the order keys' index (queue, order key, id) from the mark on, so a pass reads the schedule's jobs since its
    oldest unfinished one, never the farm's."""

    def __init__(self, store: StoreBase, period: float):
        self.store = store
        self.period = period

    def apply(self, schedule: dict[str, Any], now: float) -> bool:
        """Apply `schedule`'s policies at database time `now`; whether its row changed (paused or resumed)."""
        if schedule["paused"]:
            until = schedule["paused_until"]
            return until is not None and until <= now and self._resume(schedule, now)
        going = self._read(schedule, now)
        if schedule["overlap"] != DEFAULT_OVERLAP:
            self._overlap(schedule, going)
        paused = self._mark(schedule, going.first)
        stuck = going.due and not (going.running or going.retrying)  # due, and nothing runs: a failure may block
        if stuck and schedule["overlap"] != DEFAULT_OVERLAP and schedule["order_key"] is None:
            self._unblock(schedule)  # after the count, which reads the failed runs by their key
        return paused

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

    def _since_mark(self, schedule: dict[str, Any]) -> ColumnElement[bool]:
        """The schedule's jobs after its mark, by the order keys' index where its jobs have a key."""
        after = and_(made(jobs, schedule["name"]), jobs.c.id > (schedule["counted"] or 0))
        key = job_order_key(schedule)
        return after if key is None else and_(jobs.c.queue == schedule["queue"], jobs.c.order_key == key, after)

    def _read(self, schedule: dict[str, Any], now: float) -> Going:
        """The schedule's unfinished jobs after its mark, oldest first."""
        columns = (jobs.c.id, jobs.c.key, jobs.c.state, jobs.c.attempts, jobs.c.run_at, jobs.c.created_at)
        rows = self.store.rows(
            select(*columns, jobs.c.started_at)
            .where(self._since_mark(schedule), jobs.c.state.in_(UNFINISHED))
            .order_by(jobs.c.id)
            .limit(MAX_LOOKED)
        )
        running = [job for job in rows if job.state == JobState.RUNNING]
        retrying = [job for job in rows if job.state == JobState.QUEUED and job.attempts > 0]
        due = [job for job in rows if job.state == JobState.QUEUED and job.attempts == 0 and job.run_at <= now]
        return Going(running, retrying, due, rows[0].id if rows else None)

    def _overlap(self, schedule: dict[str, Any], going: Going) -> None:
        """The overlap policy on the occurrences that fell due while a run goes on (see the module's rules)."""
        name, overlap, since = schedule["name"], schedule["overlap"], going.since()
        if since is None:
            return
        fell = [job for job in going.due if not is_run_now(name, job.key) and _falls_due(schedule, job) > since]
        if not fell:
            return
        previous = (going.running + going.retrying)[0].id
        if overlap == "buffer-one":
            why = f"{SKIPPED}buffer-one, job {fell[0].id} already waits for job {previous} to end"
            self._skip(name, fell[1:], why)
        elif overlap == "cancel-previous":
            self._cancel_previous(name, going, fell)
        else:
            self._skip(name, fell, f"{SKIPPED}skip, job {previous} (the previous run) was still running")

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
        why = f"{SKIPPED}cancel-previous, job {newest.id} (a newer occurrence) fell due"
        self._skip(name, fell[:-1] + going.retrying, why)
        if not going.running:
            return
        with self.store.engine.begin() as conn:
            ids = [job.id for job in going.running]
            stop = stop_running(and_(jobs.c.id.in_(ids), jobs.c.cancel_requested == false()))
            if conn.execute(stop).rowcount:
                asked = ", ".join(map(str, ids))
                detail = f"job {asked} asked to stop: overlap=cancel-previous, job {newest.id} fell due"
                record_event(conn, EventKind.SCHEDULE_STOPPED, name, detail)

    def _unblock(self, schedule: dict[str, Any]) -> None:
        """Take the farm's own order key off the schedule's runs that failed for good in a queue whose keys block on
        a failure, so that the next occurrence can run (the key was the farm's, not a user's ask to block)."""
        blocking = select(queues.c.name).where(queues.c.on_failure == OnFailure.BLOCK)
        key = (jobs.c.queue == schedule["queue"], jobs.c.order_key == job_order_key(schedule))
        with self.store.engine.begin() as conn:
            conn.execute(
                update(jobs)
                .where(*key, made(jobs, schedule["name"]), jobs.c.state == JobState.FAILED)
                .where(jobs.c.queue.in_(blocking))
                .values(order_key=None)
            )

    def _mark(self, schedule: dict[str, Any], first: int | None) -> bool:
        """Move the schedule's mark up to its oldest unfinished job, counting the failures of the runs it passes
        if it pauses on failure (see the module's rules); pause it at its pause_on_failure. Whether it paused."""
        counted, limit = schedule["counted"], schedule["pause_on_failure"]
        failures, mark, last = schedule["failures"] or 0, counted, None
        if limit is None:
            mark = counted if first is None else max(counted or 0, first - 1)
        else:
            rows = self.store.rows(
                select(jobs.c.id, jobs.c.state, jobs.c.last_error)
                .where(self._since_mark(schedule), *([] if first is None else [jobs.c.id < first]))
                .where(jobs.c.state.notin_(UNFINISHED))
                .order_by(jobs.c.id)
                .limit(MAX_COUNTED)
            )
            for job in rows:
                if job.state == JobState.SUCCEEDED:
                    failures = 0
                elif job.state == JobState.FAILED:
                    failures, last = failures + 1, job
                mark = job.id
        if mark == counted:
            return False
        return self._marked(schedule, mark, failures, last)

    def _marked(self, schedule: dict[str, Any], mark: int, failures: int, last: Any) -> bool:
        """Write the mark and count (compare-and-set on the mark read), pausing at pause_on_failure. Whether it
        paused."""
        name, limit, counted = schedule["name"], schedule["pause_on_failure"], schedule["counted"]
        pause = limit is not None and failures >= limit
        values: dict[str, Any] = dict(counted=mark, failures=None if limit is None else failures)
        why = f"paused on failure: {failures} runs in a row failed for good"
        if last is not None:
            error = (last.last_error or "").strip().splitlines()[:1]
            why += f" (the last, job {last.id}: {error[0][:200] if error else 'no error given'})"
        if pause:
            values |= dict(paused=True, paused_why=why[:400])
        with self.store.engine.begin() as conn:
            guard = schedules.c.counted.is_(None) if counted is None else schedules.c.counted == counted
            marked = update(schedules).where(schedules.c.id == schedule["id"], guard, schedules.c.paused == false())
            if not conn.execute(marked.values(values)).rowcount:
                return False
            if pause:
                cancelled = cancel_queued(conn, waiting(jobs, name), f"schedule {name} was removed or paused")
                record_event(conn, EventKind.SCHEDULE_PAUSED, name, f"{why}; {cancelled} waiting occurrences cancelled")
        if pause:
            log.warning("schedule %s %s", name, why)
        return pause


def _falls_due(schedule: dict[str, Any], job: Any) -> float:
    """When an occurrence falls due: its time, as its key names it, plus its jitter."""
    return due_of(schedule["name"], job.key, job.created_at) + jitter_of(job.key, schedule["jitter"])
