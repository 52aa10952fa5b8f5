"""Dependencies: jobs that run after other jobs (docs/design.md §10).

A job enqueued `after` other jobs (its parents) is stored WAITING with `pending`, the number of parents it still
waits for, and one qp_deps row per parent; each parent is flagged `has_children`. Everything that ends a parent
for good calls `ended` in the transaction that ends it, and only for parents (the finish's fast statements match
jobs without children only, see RunStore.finish_many), so a job with no dependencies costs what it did:

- a parent that succeeded counts down its waiting children; one that reaches 0 is released (queued, due now);
- a parent that failed for good or was cancelled cancels its waiting descendants, with the reason and the parent
  in `held_by`, except those enqueued `after_ended`, which count it as ended instead;
- a retry of that parent (`restore`) puts the jobs it cancelled back to waiting and counts again;
- a retry of a child (`rejoined`) puts it back to waiting for its parents not met yet, never in the queue ahead
  of them.

The count moves by `pending - n` under the child's row lock, so two parents ending at once on two machines each
take their share and exactly one of them releases the child. The finish that calls `ended` is guarded by the
parent's owner and fence: a late writer's finish matches no row, so it releases nothing.
"""

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, case, false, func, insert, literal, or_, select, true, update
from sqlalchemy.engine import Connection

from ..rules.errors import BadJobInput
from ..rules.job import JobSpec
from ..rules.states import FINISHED, JobState
from .dbtime import db_now
from .groups import fill_callbacks
from .history import last_output
from .schema import deps, flow_jobs, jobs
from .sql.gates import gated_now

BAD = (JobState.FAILED, JobState.CANCELLED)
CHUNK = 1000  # parents flagged per statement: SQL Server takes at most 2,100 parameters (a group's callback: thousands)


def reason(parent: int, state: str) -> str:
    """What a job cancelled because of `parent` says (its last_error)."""
    return f"parent {parent} {'failed' if state == JobState.FAILED else 'was cancelled'}"


def _met(state: str, after_ended: bool) -> bool:
    """A parent in `state` no longer holds its child back."""
    return state == JobState.SUCCEEDED or (after_ended and state in FINISHED)


def start(conn: Connection, spec: JobSpec) -> tuple[dict[str, Any], tuple[int, str] | None]:
    """Before a job with `after` is inserted, in its transaction: flag and lock its parents (refusing one that
    does not exist) and say what its row starts as: waiting for the parents not met yet, or queued if none is;
    and the parent that failed already, if one did (then the new job is cancelled at once, see `linked`)."""
    parents = sorted(set(spec.after))
    found: dict[int, str] = {}
    for first in range(0, len(parents), CHUNK):
        flag = update(jobs).where(jobs.c.id.in_(parents[first : first + CHUNK])).values(has_children=True)
        found |= dict(conn.execute(flag.returning(jobs.c.id, jobs.c.state)).all())
    missing = [p for p in parents if p not in found]
    if missing:
        raise BadJobInput(
            "{0} names job {value}, which does not exist: a job runs after jobs enqueued before it (see the jobs list)",
            "after",
            value=missing[0],
        )
    failed = next(((p, found[p]) for p in parents if found[p] in BAD and not spec.after_ended), None)
    pending = len([p for p in parents if not _met(found[p], spec.after_ended)])
    return dict(state=JobState.WAITING if pending or failed else JobState.QUEUED, pending=pending), failed


def linked(conn: Connection, ids: Sequence[int], spec: JobSpec, failed: tuple[int, str] | None) -> None:
    """After the jobs `ids` with `after` are inserted: their qp_deps rows; cancelled at once if a parent failed."""
    conn.execute(
        insert(deps),
        [dict(parent_id=p, child_id=c, after_ended=spec.after_ended) for c in ids for p in sorted(set(spec.after))],
    )
    if failed is not None:
        _cascade(conn, _cancel(conn, ids, failed[0], reason(*failed)))


def fan_in(conn: Connection, flow_id: int, callback: int, members: int) -> None:
    """A group's callback `callback`, just inserted, waits for the flow's `members` members, inserted queued and
    flagged as parents in this transaction (so none has ended): as `start` and `linked` would make it, with its
    qp_deps rows copied by the database from qp_flow_jobs instead of sent one by one."""
    if not members:
        return
    conn.execute(update(jobs).where(jobs.c.id == callback).values(state=JobState.WAITING.value, pending=members))
    edges = select(flow_jobs.c.job_id, literal(callback, deps.c.child_id.type), true()).where(
        flow_jobs.c.flow_id == flow_id
    )
    conn.execute(insert(deps).from_select(["parent_id", "child_id", "after_ended"], edges))


def ended(conn: Connection, parents: Sequence[tuple[int, str]]) -> list[int]:
    """Jobs with children ended (id, new state), in the transaction that ended them: release, or cancel, their
    waiting children (see the module's docstring). A state that is not an end (queued again) does nothing. The
    children released (due now), so that the finishing node can claim them once this commits (node/turn_timer.py)."""
    succeeded = [job_id for job_id, state in parents if state == JobState.SUCCEEDED]
    bad = {job_id: (job_id, reason(job_id, state)) for job_id, state in parents if state in BAD}
    released = _count_down(conn, succeeded, every=True) if succeeded else []
    if bad:
        released += _count_down(conn, list(bad), every=False)
        released += _cascade(conn, bad)
    return released


def _count_down(conn: Connection, parents: list[int], *, every: bool) -> list[int]:
    """The waiting children of `parents` count them as met (with `every`, through every edge; else through the
    after_ended ones only); those left waiting for none are queued, due now (or at their own later time): their ids."""
    edges = [deps.c.parent_id.in_(parents)] + ([] if every else [deps.c.after_ended == true()])
    met = select(func.count()).where(deps.c.child_id == jobs.c.id, *edges).scalar_subquery()
    left = jobs.c.pending - met
    now = db_now()
    free = left <= 0
    rows = conn.execute(
        update(jobs)
        .where(jobs.c.state == JobState.WAITING, jobs.c.id.in_(select(deps.c.child_id).where(*edges)))
        .values(
            pending=left,
            state=case((free, JobState.QUEUED.value), else_=jobs.c.state),
            run_at=case((and_(free, jobs.c.run_at < now), now), else_=jobs.c.run_at),
            gated=case((free, gated_now(jobs.c.queue)), else_=jobs.c.gated),
        )
        .returning(jobs.c.id, jobs.c.state)
    ).all()
    released = [job_id for job_id, state in rows if state == JobState.QUEUED]
    if released:
        fill_callbacks(conn, released)
        if conn.dialect.name == "postgresql":  # wake the farm as an insert does (coalesced push): the child is due now
            conn.execute(select(func.qp_push()))
    return released


def _cancel(conn: Connection, ids: Sequence[int], root: int, why: str) -> dict[int, tuple[int, str]]:
    """Cancel the waiting jobs `ids` because `root` failed: {each one cancelled: (root, why)}."""
    rows = conn.execute(
        update(jobs)
        .where(jobs.c.id.in_(ids), jobs.c.state == JobState.WAITING)
        .values(state=JobState.CANCELLED.value, finished_at=db_now(), last_error=why, held_by=root)
        .returning(jobs.c.id)
    ).all()
    return {row[0]: (root, why) for row in rows}


def _cascade(conn: Connection, bad: dict[int, tuple[int, str]]) -> list[int]:
    """Cancel the waiting descendants of the `bad` jobs (each with the root that failed and why), level by level;
    each job so cancelled has ended, so its after_ended children count it: those it released."""
    released: list[int] = []
    while bad:
        rows = conn.execute(
            select(deps.c.child_id, deps.c.parent_id)
            .join(jobs, jobs.c.id == deps.c.child_id)
            .where(deps.c.parent_id.in_(list(bad)), deps.c.after_ended == false(), jobs.c.state == JobState.WAITING)
            .order_by(deps.c.child_id, deps.c.parent_id)
        ).all()
        doomed: dict[int, tuple[int, str]] = {}
        for child, parent in rows:
            doomed.setdefault(child, bad[parent])
        newly: dict[int, tuple[int, str]] = {}
        for root_why in sorted(set(doomed.values())):
            newly |= _cancel(conn, [c for c, r in doomed.items() if r == root_why], *root_why)
        if newly:
            released += _count_down(conn, list(newly), every=False)
        bad = newly
    return released


def restore(conn: Connection, job_id: int) -> None:
    """`job_id` was just retried, in this transaction: the jobs its failure cancelled wait again, and they and its
    other waiting children count their parents afresh (under their rows' locks, so a parent ending meanwhile is
    counted once). One of them with another parent that failed is cancelled again, for that one."""
    restored = [
        row[0]
        for row in conn.execute(
            update(jobs)
            .where(jobs.c.held_by == job_id, jobs.c.state == JobState.CANCELLED)
            .values(state=JobState.WAITING.value, finished_at=None, last_error=None, held_by=None)
            .returning(jobs.c.id)
        )
    ]
    children = select(deps.c.child_id).where(deps.c.parent_id == job_id)
    waiting = jobs.c.state == JobState.WAITING
    ids = [
        row[0]
        for row in conn.execute(
            select(jobs.c.id)
            .where(waiting, or_(jobs.c.id.in_(restored), jobs.c.id.in_(children)))
            .with_for_update()
            .with_hint(jobs, "WITH (UPDLOCK, ROWLOCK)", "mssql")
        )
    ]
    if ids:
        _lock_parents(conn, ids)
        conn.execute(update(jobs).where(jobs.c.id.in_(ids), waiting).values(pending=func.coalesce(_unmet(), 0)))
        _hold_again(conn, restored)


def rejoined(conn: Connection, ids: Sequence[int]) -> dict[int, tuple[int, str]]:
    """The jobs `ids` were just put back in the queue by a retry, in this transaction (their rows locked by it):
    a retry never lets a job run before its parents, so those with parents not all met wait for them again, and
    are released by their success as a new child is; one whose parent failed for good or was cancelled (not
    `after_ended`) is cancelled again, held by that parent, and comes back when that parent is retried (as the
    jobs its failure cancelled do), and its waiting descendants go with it. Those whose parents are all met stay
    queued, and a group's callback among them gets the group's outcome as its payload afresh. Returns the jobs
    held so: {id: (parent, why)}."""
    linked: list[int] = []
    for first in range(0, len(ids), CHUNK):
        chunk = list(ids[first : first + CHUNK])
        linked += [row[0] for row in conn.execute(select(deps.c.child_id).where(deps.c.child_id.in_(chunk)).distinct())]
    if not linked:
        return {}
    _lock_parents(conn, linked)
    unmet = func.coalesce(_unmet(), 0)
    rows = conn.execute(
        update(jobs)
        .where(jobs.c.id.in_(linked), jobs.c.state == JobState.QUEUED)
        .values(pending=unmet, state=case((unmet > 0, JobState.WAITING.value), else_=jobs.c.state))
        .returning(jobs.c.id, jobs.c.state)
    ).all()
    queued = [job_id for job_id, state in rows if state == JobState.QUEUED]
    if queued:
        fill_callbacks(conn, queued)
    return _hold_again(conn, [job_id for job_id, state in rows if state == JobState.WAITING])


def _lock_parents(conn: Connection, children: Sequence[int]) -> None:
    """Lock the parents of `children` before counting which of them are met. A parent's finish updates its row
    first and counts its waiting children down in a later statement: locked first, a finish under way is waited
    for and then counted as met (the count's statement reads what it committed); a finish that comes after waits for
    our commit and then finds the children waiting. Counted without the lock, a parent that ended meanwhile was
    counted as unmet while its finish saw no waiting child to count down, and the child waited for ever."""
    for first in range(0, len(children), CHUNK):
        parents = select(deps.c.parent_id).where(deps.c.child_id.in_(list(children[first : first + CHUNK])))
        conn.execute(
            select(jobs.c.id)
            .where(jobs.c.id.in_(parents))
            .order_by(jobs.c.id)
            .with_for_update()
            .with_hint(jobs, "WITH (UPDLOCK, ROWLOCK)", "mssql")
        ).all()


def _unmet() -> Any:
    """How many parents the job of the row being updated still waits for (SQL: a scalar subquery on qp_jobs)."""
    p = jobs.alias("p")
    ended_ok = and_(deps.c.after_ended == true(), p.c.state.in_(FINISHED))
    return (
        select(func.count())
        .select_from(deps.join(p, p.c.id == deps.c.parent_id))
        .where(deps.c.child_id == jobs.c.id, p.c.state != JobState.SUCCEEDED, ~ended_ok)
        .scalar_subquery()
    )


def _hold_again(conn: Connection, ids: Sequence[int]) -> dict[int, tuple[int, str]]:
    """The jobs `ids`, waiting again, that have a parent that failed for good or was cancelled are cancelled again,
    for that parent (the first by id), with their waiting descendants: {each one held: (parent, why)}."""
    if not ids:
        return {}
    p = jobs.alias("p")
    failed = conn.execute(
        select(deps.c.child_id, deps.c.parent_id, p.c.state)
        .join(p, p.c.id == deps.c.parent_id)
        .where(deps.c.child_id.in_(ids), deps.c.after_ended == false(), p.c.state.in_(BAD))
        .order_by(deps.c.child_id, deps.c.parent_id)
    ).all()
    again: dict[int, tuple[int, str]] = {}
    for child, parent, state in failed:
        if child not in again:
            again |= _cancel(conn, [child], parent, reason(parent, state))
    _cascade(conn, again)
    return again


def parents_of(conn: Connection, job_id: int) -> list[dict[str, Any]]:
    """The jobs `job_id` runs after: id, state, step name (in a workflow) and whether it waits for their end only."""
    rows = conn.execute(
        select(deps.c.parent_id, jobs.c.state, flow_jobs.c.step, deps.c.after_ended)
        .select_from(
            deps.join(jobs, jobs.c.id == deps.c.parent_id).outerjoin(flow_jobs, flow_jobs.c.job_id == deps.c.parent_id)
        )
        .where(deps.c.child_id == job_id)
        .order_by(deps.c.parent_id)
    ).all()
    return [dict(id=p, state=s, step=step, after_ended=bool(e)) for p, s, step, e in rows]


def results(conn: Connection, job_id: int) -> dict[str | int, Any]:
    """What the parents of `job_id` returned (their last succeeded run's output, as JSON where it is JSON), by
    step name in a workflow, else by job id; None for a parent that did not succeed (after_ended)."""
    found: dict[str | int, Any] = {}
    for parent in parents_of(conn, job_id):
        output = conn.execute(last_output(parent["id"], succeeded=True)).scalar()
        found[parent["step"] or parent["id"]] = _decoded(output)
    return found


def _decoded(output: str | None) -> Any:
    """A run's output as its job returned it: JSON text decoded (a Python job's return value), else as it is."""
    if output is None:
        return None
    try:
        return json.loads(output)
    except ValueError:
        return output
