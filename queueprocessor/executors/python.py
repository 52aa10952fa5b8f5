"""Python jobs: a callable `package.module:function`, called as `function(payload, context)`.

A plain function runs in a worker thread so the node's event loop stays free.
A thread cannot be killed, so stopping one (timeout, cancel, lost lease) sets
`context.cancelled` and waits for the callable to return. One that ignores its
flag past the job's grace is reported loudly, and its run stays held until it
returns: its result is discarded, but the job is not started again on this
machine meanwhile, nor (its lease renewed) on any other, unless the lease is
lost, as when the machine is cut off from the database: then another machine
may start the job while the ignored flag lets the old call run on. Work that
must stop for certain checks its flag, or is an `async def` function, which
runs on the node's event loop and is cancelled at once (the flag is set too),
or a command, whose process is killed. Only modules under the node's allowed
prefixes are imported at all, in a worker thread, once per target.
"""

import asyncio
import importlib
import inspect
import json
import logging
import traceback
from collections.abc import Callable
from typing import Any, cast

from ..rules.allow import check_module, module_allowed, parse_target
from ..rules.logs import about
from ..store.types import Claimed, JobSpec
from .base import Executor, JobContext, JobFailed, excerpt
from .threads import Threads

log = logging.getLogger("queueprocessor.executors.python")


def resolve(target: str, allowed: tuple[str, ...]) -> Callable[..., Any]:
    """Import the module and find the callable; a clear JobFailed when either is missing.

    The callable must be defined in an allowed module: an allowed module's attributes also hold the
    modules and functions it imported (`app.jobs:shutil.rmtree`), which the allow-list does not allow."""
    module_name, path = parse_target(target)
    try:
        thing: object = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise JobFailed(
            f"Python job {target}: no module named {error.name!r} on this machine", permanent=True
        ) from None
    for part in path.split("."):
        try:
            thing = getattr(thing, part)
        except AttributeError:
            raise JobFailed(f"Python job {target}: {module_name} has no attribute {path!r}", permanent=True) from None
        home = thing.__name__ if inspect.ismodule(thing) else getattr(thing, "__module__", None)
        if (home is not None or callable(thing)) and not (isinstance(home, str) and module_allowed(home, allowed)):
            raise JobFailed(
                f"Python job {target}: {part} is from module {home!r}, which is not allowed on this machine",
                permanent=True,
            )
    if not callable(thing):
        raise JobFailed(f"Python job {target}: {path} is a {type(thing).__name__}, not a function", permanent=True)
    return thing


def _failed(error: Exception) -> JobFailed:
    assert error.__traceback__ is not None  # it was raised
    frames = traceback.format_exception(type(error), error, error.__traceback__.tb_next)  # from the callable on
    return JobFailed(f"{type(error).__name__}: {error}", excerpt("".join(frames)))


def _output(result: object) -> str | None:
    return None if result is None else excerpt(json.dumps(result, default=str))


def _call(function: Callable[..., object], payload: str | None, context: JobContext) -> str | None:
    try:
        result = function(json.loads(payload) if payload else None, context)
    except Exception as error:
        raise _failed(error) from None
    return _output(result)


class PythonExecutor(Executor):
    name = "python"

    def __init__(self, allowed_modules: tuple[str, ...] = (), workers: int = 64):
        self.allowed_modules = tuple(allowed_modules)
        self.workers = workers
        self._threads: Threads | None = None  # made on first use, on the runner's loop
        # Targets resolved already (the allow-list does not change), each with whether it is an `async def`.
        self._functions: dict[str, tuple[Callable[..., Any], bool]] = {}

    def validate(self, spec: JobSpec) -> None:
        check_module(spec.target, self.allowed_modules)

    async def run(self, job: Claimed, context: JobContext) -> str | None:
        if self._threads is None:
            self._threads = Threads(asyncio.get_running_loop(), self.workers, "qp-python")
        known = self._functions.get(job.target)
        if known is None:
            self.validate(JobSpec(executor=self.name, target=job.target))
            function = cast(
                Callable[..., Any], await self._threads.call(resolve, job.target, self.allowed_modules).done
            )
            known = self._functions[job.target] = function, inspect.iscoroutinefunction(inspect.unwrap(function))
        function, is_async = known
        if is_async:
            try:
                return _output(await function(json.loads(job.payload) if job.payload else None, context))
            except asyncio.CancelledError:
                context.cancelled.set()
                raise
            except Exception as error:
                raise _failed(error) from None
        call = self._threads.call(_call, function, job.payload, context)
        try:
            return cast(str | None, await call.done)
        except asyncio.CancelledError:  # its result is dropped; its run ends once the call has returned
            context.cancelled.set()
            if not await self._threads.finished(call, context.grace):
                log.error(
                    "job %s: Python function %s has not returned %g s after it was told to stop (it does not "
                    "check context.cancelled); the job stays held here until it returns",
                    job.id,
                    job.target,
                    context.grace,
                    extra=about(job.id),
                )
                await self._threads.finished(call, None)
            raise

    async def close(self) -> None:
        if self._threads is not None:
            self._threads.close()
