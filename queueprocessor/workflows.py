"""Workflows and groups as the API builds them (docs/api.md#workflows-and-groups): a graph of named steps, or many
jobs with a callback, checked here and enqueued in one transaction (store/flows.py), all or none.

    flow = farm.workflow("nightly")
    flow.step("import", farm.python_spec("etl:load", {"day": "2026-11-28"}))
    flow.step("index", farm.python_spec("etl:index"), after=["import"])
    flow.step("mail", farm.http_spec("/report", method="POST"), after=["index"])
    workflow_id = flow.enqueue()

A step names only steps added before it, so a cycle cannot be written.
"""

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from . import grabs, tracing
from .machines import Machines
from .rules.errors import BadJobInput, DuplicateKey, NotFound, echoed
from .rules.job import JobSpec
from .rules.kinds import HTTP
from .rules.queues import MAX_NAME
from .store.flows import GROUP, WORKFLOW, FlowStore, Made, Step
from .store.stores import Store

MAX_STEPS = 100_000  # jobs one call enqueues: a graph is one transaction

# How a flow is stored: Flows._submit checks and signs each job's work, then stores them all at once.
Submit = Callable[[str, str | None, Sequence[Step], JobSpec | None], Made]


def check_flow_name(name: str | None, what: str) -> str | None:
    """A workflow's, a group's or a step's name as given (any text that fits the column, without surrounding
    spaces: unlike a queue's, rules.queues.check_name), or BadJobInput."""
    if name is not None and not (isinstance(name, str) and 0 < len(name) <= MAX_NAME and name.strip() == name):
        raise BadJobInput(
            "{0} {value} is not a name: give 1 to {limit} characters without surrounding spaces",
            what,
            value=name,
            limit=str(MAX_NAME),
        )
    return name


class Workflow:
    """A graph of named steps, each a JobSpec run after the steps it names (and after the job ids its spec's own
    `after` names). `enqueue()` stores them all in one transaction, or none; a step's function reads what its
    parents returned by step name with `context.results()`."""

    def __init__(self, submit: Submit, name: str | None = None):
        self._submit = submit
        self.name = check_flow_name(name, "name")
        self.steps: list[Step] = []

    def step(self, name: str, spec: JobSpec, *, after: Iterable[str] = (), after_ended: bool = False) -> "Workflow":
        """Add step `name`, run once the steps named in `after` (added before it) have succeeded (with
        `after_ended`: have ended, whatever the outcome)."""
        check_flow_name(name, "step")
        known = {s.name for s in self.steps}
        if name in known:
            raise BadJobInput("{0} {value} is named twice: give each step its own name", "step", value=name)
        parents = tuple(after)
        for parent in parents:
            if parent not in known:
                raise BadJobInput(
                    "{0} {value} runs after {part}, which is not a step added before it: add {part} first",
                    "step",
                    value=name,
                    part=echoed(parent),
                )
        if len(self.steps) >= MAX_STEPS:
            raise BadJobInput.out_of("steps", len(self.steps) + 1, f"at most {MAX_STEPS:,} in one call")
        if after_ended and not parents and not spec.after:
            raise BadJobInput("{0} needs {1}: the steps whose end it waits for", "after_ended", "after")
        self.steps.append(Step(name, spec, parents, after_ended))
        return self

    def enqueue(self) -> int:
        """Store every step at once (all or none); the workflow's id, for `Farm.flow` and `workflow show`."""
        if not self.steps:
            raise BadJobInput("{0} has no steps: add one with .step(name, spec)", "workflow")
        return self._submit(WORKFLOW, self.name, self.steps, None).id


def group(submit: Submit, specs: Iterable[JobSpec], callback: JobSpec | None, name: str | None) -> Made:
    """Many jobs as one group, with `callback` run once after all of them have ended (store/groups.py)."""
    if callback is not None and callback.executor == HTTP.name and callback.method != "POST":
        raise BadJobInput(
            "{0} gets the group's outcome as its payload, which a GET cannot carry: give it method POST", "callback"
        )
    members = [Step(None, spec) for spec in specs]
    if not members:
        raise BadJobInput("{0} has no jobs: give at least one", "group")
    if len(members) > MAX_STEPS:
        raise BadJobInput.out_of("group", len(members), f"at most {MAX_STEPS:,} jobs in one call")
    return submit(GROUP, check_flow_name(name, "name"), members, callback)


def read(flows: FlowStore, flow_id: int, kind: str, steps: bool) -> dict[str, Any]:
    """A workflow or group as `workflow show` and `group show` print it (NotFound if it is of the other kind)."""
    flow = flows.read(flow_id, steps=steps)
    if flow["kind"] != kind:
        raise NotFound(f"no {kind} with id {flow_id} (it is a {flow['kind']})", what=kind, ref=flow_id)
    return flow


class Flows:
    """The workflows and groups of one farm: each job's work is checked against the live machines' allow-lists
    (one read for all of them) and signed, then all are stored at once."""

    def __init__(self, store: Store, machines: Machines):
        self._store = store
        self._machines = machines

    def workflow(self, name: str | None) -> Workflow:
        return Workflow(self._submit, name)

    def group(self, specs: Iterable[JobSpec], callback: JobSpec | None, name: str | None) -> int:
        return group(self._submit, specs, callback, name).id

    def workflow_info(self, workflow_id: int) -> dict[str, Any]:
        return read(self._store.flows, workflow_id, WORKFLOW, steps=True)

    def group_info(self, group_id: int) -> dict[str, Any]:
        return read(self._store.flows, group_id, GROUP, steps=False)

    def _submit(self, kind: str, name: str | None, steps: Sequence[Step], callback: JobSpec | None) -> Made:
        self._machines.allowing(*{step.spec for step in steps} | ({callback} if callback else set()))
        if tracing.API in sys.modules and (traceparent := tracing.current_traceparent()) is not None:
            # a caller that traces: each job given none keeps the current context (docs/design.md §12)
            steps = [
                step._replace(spec=replace(step.spec, traceparent=step.spec.traceparent or traceparent))
                for step in steps
            ]
            callback = callback and replace(callback, traceparent=callback.traceparent or traceparent)
        signed = [step._replace(spec=grabs.signed(step.spec)) for step in steps]
        try:
            return self._store.flows.create(kind, name, signed, grabs.signed(callback) if callback else None)
        except DuplicateKey as error:
            raise grabs.refuse(self._store, error) from None
