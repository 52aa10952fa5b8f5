"""Defining jobs in Python: a decorator that turns a function into work any node can run by name.

    from queueprocessor import job

    @job(max_attempts=5, timeout=60)
    def send_report(payload, context):
        ...                      # context.job_id, .attempt, .fence, .cancelled
        return {"sent": True}    # kept (as JSON) with the run

    send_report.enqueue(farm, {"day": "2026-11-22"})

A node runs it by importing `module:function`, so the function must live at
the top level of a module the node can import (and allow, `--allow-module`).
The decorated function is still an ordinary function: calling it calls it.

A batch function takes many jobs of its target at once (see `job`'s `batch`):

    @job(batch=500)
    def index(payloads, contexts):  # two lists of equal length, one entry per job
        search.bulk_add(payloads)     # return normally: every job succeeds; raise: every job fails
        # or return one entry per job: an exception fails that job alone, anything else is its result

Each payload is still enqueued as a job of its own (`index.enqueue(farm, row)`).
"""

import functools
import sys
from collections.abc import Callable
from typing import Any, overload

from .rules.errors import InvalidJob
from .rules.limits import MAX_ATTEMPTS


def target_of(function: Callable[..., object]) -> str:
    """`package.module:function` for a top-level function; refused for what a node could not import."""
    module, name = function.__module__, function.__qualname__
    if module == "__main__":  # run with `python -m package.module`: the real name is on its spec
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        if spec is None:
            raise InvalidJob(
                f"{name} is defined in a script run by path; nodes cannot import it: put it in a "
                "module (or run the script with python -m)"
            )
        module = spec.name
    if "<" in name:
        raise InvalidJob(f"{name} is not defined at the top level of its module; nodes cannot import it")
    return f"{module}:{name}"


MAX_BATCH = 100_000  # jobs one call of a batch function may be given at most (a node's capacity is the real bound)


class JobFunction:
    """A function the farm can run, with its default options (see `job`). `farm` below is a farm.Farm, which
    imports this module: named as Any here, so that the @job decorator never loads the engine.

    `qp_batch` is what a node's Python executor reads on the callable it resolved (it cannot import this module):
    the most jobs one call takes, or None for one job per call."""

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        max_attempts: int,
        timeout: float | None,
        priority: int,
        batch: int | None = None,
    ):
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH):
            raise InvalidJob(f"batch={batch!r}: a batch function takes from 1 to {MAX_BATCH:,} jobs per call")
        functools.update_wrapper(self, function)
        self.function = function
        self.target = target_of(function)
        self.options = dict(max_attempts=max_attempts, timeout=timeout, priority=priority)
        self.qp_batch = batch

    @property
    def batch(self) -> int | None:
        """The most jobs one call takes (`@job(batch=N)`), or None: one job per call."""
        return self.qp_batch

    def __call__(self, payload: Any, context: Any) -> Any:
        return self.function(payload, context)

    def enqueue(self, farm: Any, payload: object = None, **options: Any) -> int:
        """Queue one run on `farm` (a Farm); options as Farm.enqueue_python. Returns the job id."""
        job_id: int = farm.enqueue_python(self, payload, **options)[0]
        return job_id

    def schedule(self, farm: Any, name: str, payload: object = None, **options: Any) -> dict[str, Any]:
        """Run it on a schedule: Farm.schedule(name, ..., cron=/every=)."""
        made: dict[str, Any] = farm.schedule(name, farm.python_spec(self, payload), **options)
        return made


@overload
def job(function: Callable[..., Any]) -> JobFunction: ...
@overload
def job(
    *, max_attempts: int = MAX_ATTEMPTS, timeout: float | None = None, priority: int = 0, batch: int | None = None
) -> Callable[[Callable[..., Any]], JobFunction]: ...
def job(
    function: Callable[..., Any] | None = None,
    *,
    max_attempts: int = MAX_ATTEMPTS,
    timeout: float | None = None,
    priority: int = 0,
    batch: int | None = None,
) -> JobFunction | Callable[[Callable[..., Any]], JobFunction]:
    """Decorate a function `f(payload, context)` to make it a job: `@job` or `@job(max_attempts=5, ...)`.

    `batch=N` makes it a batch function, `f(payloads, contexts)`: a node calls it with up to N due jobs of it at
    once (two lists of equal length, one entry per job; as many as it has claimed and room for, never held back to
    fill a batch). It returns normally: every job succeeds, each with the value returned as its result (None: no
    output); it raises: every job of the call fails, each retried by its own `max_attempts`. It returns a list with
    one entry per job: an entry that is an exception fails that job, anything else is that job's result (a list of
    any other length fails every job of the call). Each job keeps its own lease, fence, attempt and run. A job
    stopped during the call (cancel, lost lease) has its `contexts[i].cancelled` set and ends as stopped once the
    call returns, its entry discarded; a timeout stops the call and ends every job of it. docs/api.md has it all."""

    def wrap(f: Callable[..., Any]) -> JobFunction:
        return JobFunction(f, max_attempts=max_attempts, timeout=timeout, priority=priority, batch=batch)

    return wrap if function is None else wrap(function)
