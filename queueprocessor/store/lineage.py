"""Reads of a job's place among other jobs, for the app (views.Dashboard): its parents and children, the
workflows and groups it belongs to, and what a waiting job still waits for. Reads only; the writes are
store/dependencies.py's and store/flows.py's."""

from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, not_, or_, select

from ..rules.errors import NotFound
from ..rules.states import FINISHED, JobState
from .base import StoreBase
from .dependencies import parents_of
from .flows import FlowStore
from .schema import deps, flow_jobs, flows, jobs

# Waiting jobs in a read of `waits_for`: the jobs table shows a few hundred at most.
CHUNK = 500


class LineageStore:
    """A job's place among other jobs (Store.lineage): its flows are read through the FlowStore."""

    def __init__(self, store: StoreBase, flows: FlowStore):
        self.store = store
        self.flows = flows

    def links(self, job_id: int) -> dict[str, Any]:
        """`after` (the job's parents: id, state, step, after_ended), `waits_for` (those that still hold it back, see
        waits_for), `children` (id, state, step) and `flows` (id, kind, name, the job's step, or "callback" for a
        group's callback job) of `job_id`."""
        with self.store.engine.execution_options(read_only=True).connect() as conn:
            after = parents_of(conn, job_id)
            children = conn.execute(
                select(deps.c.child_id, jobs.c.state, flow_jobs.c.step)
                .select_from(
                    deps.join(jobs, jobs.c.id == deps.c.child_id).outerjoin(
                        flow_jobs, flow_jobs.c.job_id == deps.c.child_id
                    )
                )
                .where(deps.c.parent_id == job_id)
                .order_by(deps.c.child_id)
            ).all()
            member = conn.execute(
                select(flows.c.id, flows.c.kind, flows.c.name, flow_jobs.c.step)
                .join(flow_jobs, flow_jobs.c.flow_id == flows.c.id)
                .where(flow_jobs.c.job_id == job_id)
            ).all()
            calls = conn.execute(
                select(flows.c.id, flows.c.kind, flows.c.name).where(flows.c.callback_id == job_id)
            ).all()
        return dict(
            after=after,
            waits_for=self.waits_for([job_id]).get(job_id, []) if after else [],
            children=[dict(id=c, state=s, step=step) for c, s, step in children],
            flows=[dict(id=f, kind=k, name=n, step=step) for f, k, n, step in member]
            + [dict(id=f, kind=k, name=n, step="callback") for f, k, n in calls],
        )

    def waits_for(self, waiting: Sequence[int]) -> dict[int, list[int]]:
        """For each of the `waiting` jobs, the parents that still hold it back (not succeeded; with after_ended, not
        ended), in id order. One read per CHUNK jobs, none when no job waits."""
        met = or_(jobs.c.state == JobState.SUCCEEDED, and_(deps.c.after_ended, jobs.c.state.in_(FINISHED)))
        found: dict[int, list[int]] = {}
        for start in range(0, len(waiting), CHUNK):
            for child, parent in self.store.rows(
                select(deps.c.child_id, deps.c.parent_id)
                .join(jobs, jobs.c.id == deps.c.parent_id)
                .where(deps.c.child_id.in_(waiting[start : start + CHUNK]), not_(met))
                .order_by(deps.c.child_id, deps.c.parent_id)
            ):
                found.setdefault(child, []).append(parent)
        return found

    def with_waits(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The jobs list's rows, each waiting one with `waits_for` (see waits_for): what its tooltip says."""
        waiting = [row["id"] for row in rows if row["state"] == JobState.WAITING]
        if not waiting:
            return rows
        found = self.waits_for(waiting)
        return [row | {"waits_for": found.get(row["id"], [])} if row["id"] in found else row for row in rows]

    def flow(self, flow_id: int | None) -> dict[str, Any] | None:
        """A workflow or group with its steps (FlowStore.read), each step also with `waits_for`; only `id` and
        `missing` if there is no such flow (pruned, or asked of another farm), so the app can say so."""
        if flow_id is None:
            return None
        try:
            found: dict[str, Any] = self.flows.read(flow_id, steps=True)
        except NotFound:
            return dict(id=flow_id, missing=True)
        found["steps"] = self.with_waits([step | {"id": step["job_id"]} for step in found["steps"]])
        return found
