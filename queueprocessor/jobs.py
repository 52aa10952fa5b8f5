"""One job as the Farm builds, queues and reads it: the spec of each kind of work with the options every kind takes
alike (rules.job.JobOptions), the checks before it is stored (count, delay and time, the live machines' allow-lists,
who signed it), and a job read whole with the jobs it runs after and its runs."""

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Unpack, cast

from . import grabs, tracing
from .jobfunctions import JobFunction, target_of
from .machines import Machines
from .rules.errors import BadJobInput, DuplicateKey
from .rules.job import JobOptions, JobSpec, to_json, work_spec
from .rules.kinds import COMMAND, HTTP, PYTHON
from .rules.limits import LATEST, MAX_WAIT
from .rules.queues import serving_machines
from .store.stores import Store


@dataclass(frozen=True)
class Enqueued:
    """What Farm.submit queued: the jobs' ids, and whether a live machine serves their queue; `settled`, if its key
    was held: the holder's id is the one id, "existing" (returned as it was), "replaced" (its payload and time) or
    "debounced" (its time moved)."""

    ids: list[int]
    served: bool
    settled: str | None = None


def http_spec(path: str, *, payload: str | None = None, **options: Unpack[JobOptions]) -> JobSpec:
    return work_spec(HTTP.name, path, payload=payload, **options)


def python_spec(function: str | JobFunction, payload: object = None, **options: Unpack[JobOptions]) -> JobSpec:
    if isinstance(function, JobFunction):  # its @job options, but for those given here
        options = cast(JobOptions, function.options | {k: v for k, v in options.items() if v is not None})
    target = function if isinstance(function, str) else target_of(function)
    return work_spec(PYTHON.name, target, payload=to_json(payload), **options)


def command_spec(argv: Iterable[str], payload: object = None, **options: Unpack[JobOptions]) -> JobSpec:
    return work_spec(COMMAND.name, json.dumps(list(argv)), payload=to_json(payload), **options)


def submit(store: Store, machines: Machines, spec: JobSpec, *, delay: float, at: float | None, count: int) -> Enqueued:
    """Queue `count` copies of `spec`, checked, and say whether a live machine serves their queue, from the same
    read of the machine rows as the allow-list check. A key another job holds raises grabs.AlreadyTaken, unless
    `spec`'s key terms settle it otherwise (store/key_holds.py)."""
    if count < 1:
        raise BadJobInput.out_of("count", count, "at least 1")
    if not 0 <= delay <= MAX_WAIT:
        raise BadJobInput.out_of("delay", delay, f"from 0 to {MAX_WAIT:.0f} seconds, ten years")
    if at is not None and not 0 <= at <= LATEST:
        raise BadJobInput.out_of(
            "at",
            at,
            f"a time from 1970 to 9999, e.g. 2026-11-22T18:00:00+00:00 or epoch seconds up to {LATEST:.0f}",
        )
    live = machines.allowing(spec)
    span = None
    if tracing.API in sys.modules:  # a caller that traces: the job keeps its producer span's context (design §12)
        spec, span = tracing.sending(spec)
    try:
        made = store.jobs.made(grabs.signed(spec), delay=delay, at=at, count=count)
    except DuplicateKey as error:
        raise grabs.refuse(store, error) from None
    finally:
        if span is not None:
            span.end()
    return Enqueued(made.ids, bool(serving_machines(live, spec.queue)), made.settled)


def read(store: Store, job_id: int) -> dict[str, Any]:
    """A job's row, the jobs it runs `after`, and its runs."""
    record = store.jobs.get(job_id)
    record["after"] = store.flows.parents(job_id)
    record["runs"] = store.runs.read(job_id=job_id)
    return record
