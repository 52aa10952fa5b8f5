"""Groups: many jobs enqueued as one, with a callback job that runs once all of them have ended (store/flows.py
makes them). The callback waits for every member `after_ended` (store/dependencies.py); when the last member ends,
the transaction that releases it also writes into its payload how the group went."""

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection

from ..rules.states import FINISHED, JobState
from .schema import flow_jobs, flows, jobs

OUTCOME = {"group", "total", "succeeded", "failed", "cancelled", "failed_ids", "payload"}  # a filled callback's keys


def tally(conn: Connection, flow_id: int) -> dict[str, Any]:
    """A group's or workflow's members by state: `total`, `done` (ended), a count per state, and the ids of
    those that failed or were cancelled (`failed_ids`)."""
    member = jobs.c.id == flow_jobs.c.job_id
    counts: dict[str, int] = dict(
        conn.execute(
            select(jobs.c.state, func.count()).where(member, flow_jobs.c.flow_id == flow_id).group_by(jobs.c.state)
        ).all()
    )
    failed = conn.execute(
        select(jobs.c.id)
        .where(member, flow_jobs.c.flow_id == flow_id, jobs.c.state.in_((JobState.FAILED, JobState.CANCELLED)))
        .order_by(jobs.c.id)
    ).all()
    by_state = {state.value: int(counts.get(state, 0)) for state in JobState}
    return dict(
        total=sum(by_state.values()),
        done=sum(by_state[s] for s in FINISHED),
        **by_state,
        failed_ids=[row[0] for row in failed],
    )


def fill_callbacks(conn: Connection, released: Sequence[int]) -> None:
    """Jobs just released (queued) in this transaction: those that are a group's callback get the group's outcome
    as their payload, with the OUTCOME keys (`payload`: the one given at enqueue). A callback retried after it was
    released gets the outcome afresh, not nested in the old one."""
    for flow_id, callback_id, given in conn.execute(
        select(flows.c.id, flows.c.callback_id, jobs.c.payload)
        .join(jobs, jobs.c.id == flows.c.callback_id)
        .where(flows.c.callback_id.in_(released))
    ).all():
        count = tally(conn, flow_id)
        outcome = dict(
            group=flow_id,
            total=count["total"],
            succeeded=count[JobState.SUCCEEDED],
            failed=count[JobState.FAILED],
            cancelled=count[JobState.CANCELLED],
            failed_ids=count["failed_ids"],
            payload=_given(flow_id, given),
        )
        conn.execute(update(jobs).where(jobs.c.id == callback_id).values(payload=json.dumps(outcome)))


def _given(flow_id: int, payload: str | None) -> Any:
    """The payload the callback of group `flow_id` was given at enqueue: its payload as it is, or, once an outcome
    was filled in (a retried callback), the one that outcome keeps."""
    given = json.loads(payload) if payload else None
    if isinstance(given, dict) and given.keys() == OUTCOME and given["group"] == flow_id:
        return given["payload"]
    return given
