"""What happened, as read: every run (those that ended, and those in progress), and rows named by their machine."""

import functools
from typing import Any

from sqlalchemy import String, exists, literal, null, select, union_all

from ..rules.states import JobState, Outcome
from .schema import jobs, machines, runs


def _on_job_row(outcome: Outcome, finished_at: Any, error: Any, output: Any) -> Any:
    """A run that is its job's row (its owner, fence, attempt, start and progress), as a row of qp_runs; its `id` is
    NULL."""
    return select(
        null().label("id"),
        jobs.c.id.label("job_id"),
        jobs.c.attempts.label("attempt"),
        jobs.c.owner.label("machine_id"),
        jobs.c.fence,
        jobs.c.started_at,
        finished_at.label("finished_at"),
        literal(outcome, String).label("outcome"),
        error.label("error"),
        output.label("output"),
        jobs.c.progress,
        jobs.c.progress_message,
    )


def kept_successes() -> Any:
    """The runs that ended their job in success, as rows of qp_runs: each is its job's row (succeeded: also its end
    and output), written by the same update that ended it, with no row of its own (schema 13, docs/design.md §3).
    A node older than 13 still wrote one (the same job and fence): that row is read instead, so a run is read
    once."""
    recorded = exists().where(runs.c.job_id == jobs.c.id, runs.c.fence == jobs.c.fence)
    kept = _on_job_row(Outcome.SUCCEEDED, jobs.c.finished_at, jobs.c.last_error, jobs.c.output)
    return kept.where(jobs.c.state == JobState.SUCCEEDED, ~recorded)


def _recorded() -> Any:
    """The runs with a row of their own in qp_runs: every one that did not end its job in success."""
    return select(
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
        runs.c.progress,
        runs.c.progress_message,
    )


@functools.cache
def ended_runs() -> Any:
    """Every run that ended, as rows of qp_runs: those with a row of their own, and the successes kept on their
    job's row (kept_successes). Read by job (each part by its index on the job) or by end (qp_runs' index of
    ends, and the succeeded jobs' own: schema ix_qp_jobs_succeeded)."""
    return union_all(_recorded(), kept_successes()).subquery("ended_runs")


@functools.cache
def run_history() -> Any:
    """Every run, as rows of qp_runs: those that ended (ended_runs), and those in progress. A run that ended its job
    in success is its job's row for good; any other gets a row of its own, written once, when it ends (a claim and
    a finish are each one write per job on the hot path); until then the run is its job's row, running, with its
    owner, fence, attempt and start, and is read from there (its `id` is NULL)."""
    running = _on_job_row(Outcome.RUNNING, null(), null(), null()).where(jobs.c.state == JobState.RUNNING)
    return union_all(_recorded(), kept_successes(), running).subquery("runs")


def last_output(job_id: int, *, succeeded: bool = False) -> Any:
    """The output of job `job_id`'s last ended run (of its last success, with `succeeded`): a scalar select."""
    ended = ended_runs()
    statement = select(ended.c.output).where(ended.c.job_id == job_id)
    if succeeded:
        statement = statement.where(ended.c.outcome == Outcome.SUCCEEDED.value)
    return statement.order_by(ended.c.finished_at.desc()).limit(1)


def with_machine_name(statement: Any, table: Any) -> Any:
    """Operators know machines by name: rows of a table that name a machine by `machine_id` (runs, turns) carry
    its name as `machine_name`."""
    return statement.add_columns(machines.c.name.label("machine_name")).select_from(
        table.outerjoin(machines, machines.c.id == table.c.machine_id)
    )


def with_owner_name(statement: Any) -> Any:
    """The same for jobs: a job read for an operator carries its owner's name (`owner_name`) beside the id."""
    return statement.add_columns(machines.c.name.label("owner_name")).select_from(
        jobs.outerjoin(machines, machines.c.id == jobs.c.owner)
    )
