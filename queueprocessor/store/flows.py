"""Workflows and groups: many jobs enqueued in one transaction, all or none, and read back as one (workflows.py
builds them). A workflow's steps have names, and run after the steps they name (store/dependencies.py); a group's
members run as they are, and its callback job after all of them have ended (store/groups.py)."""

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from sqlalchemy import exc, insert, select, update
from sqlalchemy.engine import Connection

from ..rules.errors import DuplicateKey, NotFound
from ..rules.job import JobSpec
from ..rules.keys import check_together
from .base import StoreBase
from .dbtime import db_now
from .dependencies import fan_in, parents_of, results
from .groups import tally
from .inserts import insert_jobs, insert_plain, insert_rows
from .schema import deps, flow_jobs, flows, jobs

WORKFLOW = "workflow"
GROUP = "group"


class Step(NamedTuple):
    """One job of a flow: its step name (None in a group), its work, the earlier steps it runs after, and whether
    it runs once they have ended, whatever the outcome."""

    name: str | None
    spec: JobSpec
    after: tuple[str, ...] = ()
    after_ended: bool = False


class Made(NamedTuple):
    """What a flow's enqueue made: its id, its jobs' ids in the order of its steps, and its callback's id."""

    id: int
    ids: list[int]
    callback: int | None


class FlowStore:
    def __init__(self, store: StoreBase):
        self.store = store

    def create(self, kind: str, name: str | None, steps: Sequence[Step], callback: JobSpec | None = None) -> Made:
        """Enqueue every step, each after the steps it names (each named before it: a cycle cannot be written), and
        the callback after all of them have ended, in one transaction: all of them, or none."""
        check_together([step.spec.terms for step in steps] + ([callback.terms] if callback is not None else []))
        try:
            with self.store.engine.begin() as conn:
                return self._create(conn, kind, name, steps, callback)
        except exc.IntegrityError:
            keys = [s.spec.key for s in steps if s.spec.key] + ([callback.key] if callback and callback.key else [])
            raise DuplicateKey(keys[0] if keys else None) from None

    def _create(
        self, conn: Connection, kind: str, name: str | None, steps: Sequence[Step], callback: JobSpec | None
    ) -> Made:
        flow_id = conn.execute(
            insert(flows).values(kind=kind, name=name, created_at=db_now(), total=len(steps)).returning(flows.c.id)
        ).scalar_one()
        plain = all(not step.after and not step.spec.after for step in steps)  # a group's members, or a flat flow
        if plain:
            ids = insert_plain(conn, [step.spec for step in steps], parents=callback is not None and bool(steps))
        else:
            ids = self._steps_in_order(conn, steps)
        insert_rows(
            conn, flow_jobs, [dict(flow_id=flow_id, job_id=j, step=s.name) for j, s in zip(ids, steps, strict=True)]
        )
        made = None
        if callback is not None and plain:  # its members are new and queued: it waits for all of them
            [made] = insert_jobs(conn, self.store.whole, replace(callback, after=()))
            fan_in(conn, flow_id, made, len(ids))
        elif callback is not None:
            [made] = insert_jobs(conn, self.store.whole, replace(callback, after=tuple(ids), after_ended=True))
        if made is not None:
            conn.execute(update(flows).where(flows.c.id == flow_id).values(callback_id=made))
        return Made(flow_id, ids, made)

    def parents(self, job_id: int) -> list[dict[str, Any]]:
        """The jobs `job_id` runs after (see dependencies.parents_of)."""
        with _reading(self.store) as conn:
            return parents_of(conn, job_id)

    def results(self, job_id: int) -> dict[str | int, Any]:
        """What the jobs `job_id` runs after returned (see dependencies.results): a running job's context.results()."""
        with _reading(self.store) as conn:
            return results(conn, job_id)

    def _steps_in_order(self, conn: Connection, steps: Sequence[Step]) -> list[int]:
        """Each step inserted after the steps it names, which are inserted before it: their ids."""
        named: dict[str, int] = {}
        ids: list[int] = []
        for step in steps:
            after = tuple(step.spec.after) + tuple(named[a] for a in step.after)
            ended = step.spec.after_ended or step.after_ended
            [job_id] = insert_jobs(conn, self.store.whole, replace(step.spec, after=after, after_ended=ended))
            ids.append(job_id)
            if step.name is not None:
                named[step.name] = job_id
        return ids

    def read(self, flow_id: int, *, steps: bool = True) -> dict[str, Any]:
        """A flow: id, kind, name, created_at, its progress (see groups.tally), its callback job's id and state, and
        with `steps` each step: name, job id, state, last error and the steps (or other jobs) it runs after."""
        with _reading(self.store) as conn:
            row = conn.execute(select(flows).where(flows.c.id == flow_id)).first()
            if row is None:
                raise NotFound(f"no workflow or group with id {flow_id}", what="workflow", ref=flow_id)
            flow = dict(row._mapping)
            flow["progress"] = tally(conn, flow_id)
            callback = flow.pop("callback_id")
            state = conn.execute(select(jobs.c.state).where(jobs.c.id == callback)).scalar() if callback else None
            flow["callback"] = None if callback is None else {"id": callback, "state": state}
            if steps:
                flow["steps"] = _steps(conn, flow_id)
        return flow


def _reading(store: StoreBase) -> Connection:
    """A connection for reads (on SQLite, one that does not take the write lock: see database)."""
    return store.engine.execution_options(read_only=True).connect()


def _steps(conn: Connection, flow_id: int) -> list[dict[str, Any]]:
    """A flow's steps in the order they were enqueued, each with what it runs after (a step's name, or a job's id
    from outside the flow)."""
    rows = conn.execute(
        select(flow_jobs.c.job_id, flow_jobs.c.step, jobs.c.state, jobs.c.last_error)
        .join(jobs, jobs.c.id == flow_jobs.c.job_id)
        .where(flow_jobs.c.flow_id == flow_id)
        .order_by(flow_jobs.c.job_id)
    ).all()
    names = {job_id: step for job_id, step, *_ in rows}
    member = select(flow_jobs.c.job_id).where(flow_jobs.c.flow_id == flow_id)
    after: dict[int, list[str | int]] = {}
    for parent, child in conn.execute(
        select(deps.c.parent_id, deps.c.child_id).where(deps.c.child_id.in_(member)).order_by(deps.c.parent_id)
    ).all():
        after.setdefault(child, []).append(names.get(parent) or parent)
    return [
        dict(name=step, job_id=job_id, state=state, last_error=error, after=after.get(job_id, []))
        for job_id, step, state, error in rows
    ]
