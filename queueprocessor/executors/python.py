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

A batch function (`@job(batch=N)`: the callable carries `qp_batch`) is called
as `function(payloads, contexts)` with many jobs of its target at once, which
the runner groups (run_batch); a job that reaches run() alone is a batch of
one. The call is one unit of work: stopping it sets every job's flag, and an
`async def` one is cancelled.

A job that calls `context.snooze(seconds)` ends its run snoozed (executors.base.Snooze); a batch function that
raises one snoozes every job of its call, and one that returns a Snooze as a job's entry snoozes that job alone.
"""

import asyncio
import importlib
import inspect
import json
import logging
import traceback
from collections.abc import Callable
from contextlib import suppress
from typing import Any, cast

from .. import tracing
from ..rules.allow import check_listed
from ..rules.job import Claimed, JobSpec
from ..rules.kinds import PYTHON, module_allowed, parse_target
from ..rules.logs import about
from .base import Executor, JobContext, JobFailed, Snooze, excerpt
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
    except BaseException as error:  # a module that exits or parses argv when imported ends its job, not the node
        raise JobFailed(f"Python job {target}: importing {module_name} failed: {said(error)}") from None
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


def said(error: BaseException) -> str:
    """What a job's error says; a SystemExit or KeyboardInterrupt (`sys.exit`, argparse or click called in a job)
    says too that it ended its job alone: a node runs many jobs in one process, which no job may end."""
    if isinstance(error, (SystemExit, KeyboardInterrupt)):
        return f"{type(error).__name__}: {error} (a job cannot exit its node's process: it ended this job alone)"
    return f"{type(error).__name__}: {error}"


def _failed(error: BaseException) -> JobFailed:
    """How a run whose callable raised `error` ends: a snooze as it asked (context.snooze), anything else as a
    failure with its traceback from the callable on."""
    if isinstance(error, Snooze):
        return error
    assert error.__traceback__ is not None  # it was raised
    frames = traceback.format_exception(type(error), error, error.__traceback__.tb_next)  # from the callable on
    return JobFailed(said(error), excerpt("".join(frames)))


def _output(result: object) -> str | None:
    return None if result is None else excerpt(json.dumps(result, default=str))


def _call(function: Callable[..., object], payload: str | None, context: JobContext) -> str | None:
    try:
        if context.traceparent is not None:  # a tracing node's run: its span is the current context while it works
            with tracing.current(context.traceparent):
                result = function(json.loads(payload) if payload else None, context)
        else:
            result = function(json.loads(payload) if payload else None, context)
    except BaseException as error:  # SystemExit too: handed to the runner's loop, it would end the loop
        raise _failed(error) from None
    return _output(result)


def _entry_failed(error: BaseException) -> JobFailed:
    """A batch function's entry that fails its job alone: an exception returned (never raised: no traceback) or
    raised and caught by the function."""
    if isinstance(error, JobFailed):
        return error
    frames = traceback.format_exception(type(error), error, error.__traceback__) if error.__traceback__ else None
    return JobFailed(said(error), excerpt("".join(frames)) if frames else None)


def _outcomes(result: object, count: int) -> list[str | None | JobFailed]:
    """Each job's part of what a batch function returned: a list of `count` entries is one per job (an exception
    fails its job); any other value is every job's result. A list of another length fails them all: it cannot be
    told apart from a mistake."""
    if isinstance(result, list):
        if len(result) != count:
            raise JobFailed(
                f"the batch function returned a list of {len(result)} entries for {count} jobs: return one entry "
                "per job, or anything that is not a list for all of them"
            )
        return [_entry_failed(entry) if isinstance(entry, BaseException) else _output(entry) for entry in result]
    return [_output(result)] * count


def _payloads(jobs: list[Claimed]) -> list[object]:
    return [json.loads(job.payload) if job.payload else None for job in jobs]


def _call_batch(
    function: Callable[..., Any], jobs: list[Claimed], contexts: list[JobContext]
) -> list[str | None | JobFailed]:
    try:
        result = function(_payloads(jobs), contexts)
    except BaseException as error:  # as _call
        raise _failed(error) from None
    return _outcomes(result, len(jobs))


class PythonExecutor(Executor):
    kind = PYTHON
    name = kind.name

    def __init__(self, allowed_modules: tuple[str, ...] = (), workers: int = 64):
        self.allowed_modules = tuple(allowed_modules)
        self.workers = workers
        self._threads: Threads | None = None  # made on first use, on the runner's loop
        # Targets resolved already (the allow-list does not change), each with whether it is an `async def` and, for
        # a batch function, the most jobs a call takes (0: one job per call).
        self._functions: dict[str, tuple[Callable[..., Any], bool, int]] = {}

    def validate(self, spec: JobSpec) -> None:
        check_listed(self.kind, spec, self.allowed_modules)

    def batch_size(self, target: str) -> int | None:
        known = self._functions.get(target)
        return known[2] if known is not None else None

    async def prepare(self, target: str) -> None:
        await self._resolved(target)

    async def warm(self, job: Claimed) -> None:
        if job.target not in self._functions:  # import its module now: a heavy one would make its first run late
            with suppress(Exception):  # a target that cannot be resolved fails its run, at its time
                await self._resolved(job.target)

    async def _resolved(self, target: str) -> tuple[Callable[..., Any], bool, int]:
        if self._threads is None:
            self._threads = Threads(asyncio.get_running_loop(), self.workers, "qp-python")
        known = self._functions.get(target)
        if known is None:
            self.validate(JobSpec(executor=self.name, target=target))
            function = cast(Callable[..., Any], await self._threads.call(resolve, target, self.allowed_modules).done)
            batch = getattr(function, "qp_batch", None)
            known = self._functions[target] = (
                function,
                inspect.iscoroutinefunction(inspect.unwrap(function)),
                batch if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0 else 0,
            )
        return known

    async def run(self, job: Claimed, context: JobContext) -> str | None:
        known = self._functions.get(job.target)  # resolved already: no coroutine of _resolved's a job
        function, is_async, batch = known if known is not None else await self._resolved(job.target)
        if batch:  # a batch function's job on its own (its first on this node, one due alone): a batch of one
            [outcome] = await self._batch(function, is_async, [job], [context])
            if isinstance(outcome, JobFailed):
                raise outcome
            return outcome
        assert self._threads is not None
        if is_async:
            try:
                if context.traceparent is not None:  # as _call: in its own task, the context is its alone
                    with tracing.current(context.traceparent):
                        return _output(await function(json.loads(job.payload) if job.payload else None, context))
                return _output(await function(json.loads(job.payload) if job.payload else None, context))
            except asyncio.CancelledError:
                context.cancelled.set()
                raise
            except BaseException as error:  # SystemExit too: out of a task, it would end the node's loop
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

    async def run_batch(self, jobs: list[Claimed], contexts: list[JobContext]) -> list[str | None | JobFailed]:
        function, is_async, _ = await self._resolved(jobs[0].target)
        return await self._batch(function, is_async, jobs, contexts)

    async def _batch(
        self, function: Callable[..., Any], is_async: bool, jobs: list[Claimed], contexts: list[JobContext]
    ) -> list[str | None | JobFailed]:
        """One call of a batch function with `jobs`. Cancelled (a timeout, or every one of its jobs stopped): every
        flag is set; a plain function's call is waited for as run() waits for one job's."""
        assert self._threads is not None
        if is_async:
            try:
                result = await function(_payloads(jobs), contexts)
            except asyncio.CancelledError:
                for context in contexts:
                    context.cancelled.set()
                raise
            except BaseException as error:  # as run's
                raise _failed(error) from None
            return _outcomes(result, len(jobs))
        call = self._threads.call(_call_batch, function, jobs, contexts)
        try:
            outcomes: list[str | None | JobFailed] = await call.done  # type: ignore[assignment]
            return outcomes
        except asyncio.CancelledError:  # every result is dropped; the jobs' runs end once the call has returned
            for context in contexts:
                context.cancelled.set()
            grace = min(context.grace for context in contexts)
            if not await self._threads.finished(call, grace):
                log.error(
                    "jobs %s: batch function %s has not returned %g s after it was told to stop (it does not "
                    "check context.cancelled); its jobs stay held here until it returns",
                    ", ".join(str(job.id) for job in jobs),
                    jobs[0].target,
                    grace,
                    extra=about(jobs[0].id),
                )
                await self._threads.finished(call, None)
            raise

    async def close(self) -> None:
        if self._threads is not None:
            self._threads.close()
