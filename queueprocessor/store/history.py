"""What happened, as read: every run (those that ended, and those in progress), and rows named by their machine."""

import functools
from typing import Any

from sqlalchemy import String, literal, null, select, union_all

from ..rules.states import JobState, Outcome
from .schema import jobs, machines, runs


@functools.cache
def run_history() -> Any:
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
        runs.c.progress,
        runs.c.progress_message,
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
        jobs.c.progress,
        jobs.c.progress_message,
    ).where(jobs.c.state == JobState.RUNNING)
    return union_all(ended, running).subquery("runs")


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
