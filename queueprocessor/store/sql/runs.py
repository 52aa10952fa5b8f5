"""How a run ends and keeps its lease (PostgreSQL: arrays in, one statement a batch): the rules they keep are
RunStore.renew's and RunStore.finish's."""

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Float,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    false,
    func,
    insert,
    select,
    true,
    update,
)
from sqlalchemy.sql import ColumnElement

from ...rules.job import Ending
from ...rules.states import JobState, Outcome
from ..dbtime import db_now
from ..schema import STATE_SQL, Id, jobs, runs
from .gates import freed


def array_text(values: list[Any]) -> str:
    """An array parameter of numbers or of our own words (states, outcomes: letters only, see schema._quoted), None
    as NULL, in PostgreSQL's text form, for a statement that casts it (`by_id`): one join, where psycopg's array
    dumper spends about a microsecond an element in Python, most of what a node spent on a finish's parameters.
    Sent as text, it also keeps one prepared statement, where psycopg typed an array of small numbers int2[], then
    int4[] as they grew (a statement prepared again for each)."""
    if None in values:
        return "{" + ",".join(["NULL" if value is None else str(value) for value in values]) + "}"
    return "{" + ",".join(map(str, values)) + "}"


def by_id(names_types: list[tuple[str, Any]]) -> tuple[Any, Any]:
    """PostgreSQL: the rows of arrays `b_<name>` (one element per job, `id` first) as table `v`, and the jobs they
    name, each found by primary key: a nested loop over `v`, one look-up of qp_jobs_pkey a row, whatever the
    table's statistics say.

    Each array reaches unnest through a scalar subquery, whose value the planner cannot see: it guesses `v` at
    ten rows (as it does for an array of unknown length), and ten look-ups by key cost less than anything that
    reads the table. Given the arrays themselves, it counted their elements and, on a table never analysed (the
    minute after a backlog was enqueued in one go), chose a hash join over a sequential scan: every finish and
    renewal read the whole table (tests/contract/test_plans.py). The guard is one condition over both sides,
    evaluated on the joined rows, and the state is checked in a form that the partial index of running jobs does
    not match (walking it, dead entries included, cost more). Returns `v` and the condition: the job is `v`'s,
    and still ours (owner `b_machine`, fence, running)."""
    from sqlalchemy.dialects.postgresql import ARRAY

    unseen = (select(cast(bindparam(f"b_{name}"), ARRAY(kind))).scalar_subquery() for name, kind in names_types)
    v = func.unnest(*unseen).table_valued(*(column(name, kind) for name, kind in names_types)).render_derived(name="v")
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
    return v, and_(jobs.c.id == v.c.id, guard)


def renew_params(machine_id: int, held: Sequence[tuple[int, int]], lease: float) -> dict[str, Any]:
    """renew_statement's parameters for the runs `held` (job id, fence) of machine `machine_id`."""
    return dict(
        b_machine=machine_id,
        b_id=array_text([job_id for job_id, _ in held]),
        b_fence=array_text([fence for _, fence in held]),
        b_lease=lease,
    )


@functools.cache
def renew_statement() -> Any:
    """PostgreSQL: the renewal of the leases of jobs `b_id` (fences `b_fence`), by `b_lease` seconds from now, of
    those still ours (see RunStore.renew): arrays in, so one statement text and one plan whatever their number (as
    one OR per job, the planner read the whole table: a second for 512 jobs)."""
    _v, ours = by_id([("id", BigInteger), ("fence", BigInteger)])
    return (
        update(jobs)
        .where(ours)
        .values(lease_until=db_now() + bindparam("b_lease", type_=Float))
        .returning(jobs.c.id, jobs.c.fence, jobs.c.cancel_requested)
    )


# The arrays of a finish: one element per job. A batch whose every run succeeded (a batch function's, most often:
# SUCCESSES) sends only the first three: its state and outcome are known, and it has no error and no retry.
FINISH_ARRAYS = [
    ("id", BigInteger),
    ("fence", BigInteger),
    ("output", Text),
    ("state", Text),
    ("error", Text),
    ("retry", Float),
    ("outcome", Text),
]
SUCCESSES = 3


def successes(endings: Sequence[Ending]) -> bool:
    """Whether every run of `endings` ended in a success that ends its job (the cheaper finish: finish_statement's
    `succeeded`)."""
    return all(e.outcome == Outcome.SUCCEEDED and e.state == JobState.SUCCEEDED for e in endings)


def snoozing(endings: Sequence[Ending]) -> bool:
    """Whether a run of `endings` ended snoozed: such a batch is finished by the plain path (RunStore._finish_plain),
    which reads the jobs' counts of snoozes first; this statement never sees a snooze."""
    return any(e.outcome == Outcome.SNOOZED for e in endings)


@functools.cache
def finish_statement(succeeded: bool = False) -> Any:
    """PostgreSQL: how a batch of runs ended, in one statement: arrays in, the (id, fence, state) of the runs that were
    still ours out.

    Each job is matched on owner and fence as in RunStore.finish (see by_id); only the jobs that
    were still ours leave their limited queue's running count and get their run's record, written here, once
    (its start is the job's): a success that ends its job stays on the job's row, its output with it (no row
    in qp_runs, see history.kept_successes); any other end gets its row in qp_runs. A job with children matches
    nothing here: RunStore.finish_many ends it in a transaction with their release (store/dependencies.py).

    With `succeeded`, the form for a batch whose every run succeeded (see `successes`): three arrays (ids, fences,
    outputs) where the general form sends seven, and no run rows to write. A success's state is `succeeded` whatever
    was asked meanwhile (a cancel stops a run; it does not undo its end), so the statement's work per job is the
    guarded look-up and the update; the server parsed and unnested the four arrays more, 1.4 us a job of a batch
    of 2,000 (EXPLAIN ANALYZE), a tenth of the finish.
    """
    v, ours = by_id(FINISH_ARRAYS[:SUCCESSES] if succeeded else FINISH_ARRAYS)
    # The batch's end, read once for all its jobs (an InitPlan): the BRIN index of successes' ends widens a range's
    # summary once per statement, not once per job (schema.SUCCEEDED_INDEX).
    end = select(db_now()).scalar_subquery()
    if succeeded:
        state: Any = STATE_SQL[JobState.SUCCEEDED]
        values: dict[str, Any] = dict(
            state=JobState.SUCCEEDED.value, last_error=None, finished_at=end, output=v.c.output
        )
    else:
        state = ending_state(v.c.state)
        again = state == JobState.QUEUED
        values = dict(
            state=state,
            last_error=case((stopped(v.c.state), CANCELLED_BY), else_=v.c.error),
            run_at=case((again, db_now() + v.c.retry), else_=jobs.c.run_at),
            owner=case((again, None), else_=jobs.c.owner),
            finished_at=case((again, jobs.c.finished_at), else_=end),
            output=case((state == STATE_SQL[JobState.SUCCEEDED], v.c.output)),
        )
    ended = (
        update(jobs)
        .where(ours, jobs.c.has_children == false())
        .values(**values, lease_until=None)
        .returning(jobs.c.id, jobs.c.fence, state.label("state"), jobs.c.queue, *([] if succeeded else _logged(v)))
        .cte("ended")
    )
    # Every job that ended left running: its queue's running count, if it is limited, goes down with it.
    gone = select(ended.c.queue, func.count().label("n")).group_by(ended.c.queue).subquery("gone")
    done = select(ended.c.id, ended.c.fence, ended.c.state).add_cte(freed(gone).cte("freed"))
    return done if succeeded else done.add_cte(_log(ended))


def _logged(v: Any) -> list[Any]:
    """What the general finish returns of each job for its run's row besides (id, fence, state, queue)."""
    return [
        jobs.c.attempts,
        jobs.c.started_at,
        v.c.outcome,
        v.c.error,
        v.c.output,
        jobs.c.progress,
        jobs.c.progress_message,
    ]


def _log(ended: Any) -> Any:
    """The run rows of the jobs the general finish ended otherwise than in success (a CTE)."""
    return (
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
            ).where(ended.c.state != STATE_SQL[JobState.SUCCEEDED]),
        )
        .cte("logged")
    )


def finish_params(machine_id: int, endings: Sequence[Ending], succeeded: bool = False) -> dict[str, Any]:
    """finish_statement's parameters for `endings`, runs of machine `machine_id` (`succeeded`: its form for a batch
    of successes, see `successes`)."""
    params = dict(
        b_machine=machine_id,
        b_id=array_text([e.job.id for e in endings]),
        b_fence=array_text([e.job.fence for e in endings]),
        b_output=[e.output for e in endings],  # any text: psycopg quotes it
    )
    if succeeded:
        return params
    return params | dict(
        b_state=array_text([e.state for e in endings]),
        b_error=[e.error for e in endings],
        b_retry=array_text([e.retry_in for e in endings]),
        b_outcome=array_text([e.outcome for e in endings]),
    )


CANCELLED_BY = "cancelled by an operator"  # a cancelled job's last_error, as a cancel leaves it


def stopped(state: Any) -> ColumnElement[bool]:
    """A run that would put its job back in the queue (`state`: queued, SQL) while a cancel of it was asked: the
    job ends cancelled instead, as the cancel asked (docs/design.md §7)."""
    return and_(state == JobState.QUEUED, jobs.c.cancel_requested == true())


def ending_state(state: Any) -> Any:
    """The state a job's row takes when its run ends with `state` (SQL), a cancel asked meanwhile kept (`stopped`)."""
    return case((stopped(state), JobState.CANCELLED.value), else_=state)
