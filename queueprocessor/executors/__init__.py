"""Executors by name, one per kind of work (queueprocessor.rules.kinds). Each node builds its own set, with its own
allow-lists (queueprocessor.rules.allow)."""

from ..rules.allow import AllowLists
from ..rules.errors import InvalidJob
from ..rules.kinds import COMMAND, HTTP, LOCAL_BASE, PYTHON
from .base import Executor, JobContext, JobFailed, Snooze
from .command import CommandExecutor
from .http import HttpExecutor
from .python import PythonExecutor

__all__ = [
    "AllowLists",
    "CommandExecutor",
    "Executor",
    "HttpExecutor",
    "JobContext",
    "JobFailed",
    "PythonExecutor",
    "Snooze",
    "executor_for",
    "make_executors",
]


def make_executors(
    allow: AllowLists, http_base: str = LOCAL_BASE, command_env: tuple[str, ...] = ()
) -> dict[str, Executor]:
    """The executors that run work under `allow` (`command_env`: the node's variables its commands also get). Here,
    not on AllowLists, so that the allow-lists (which an enqueuer checks) never import the executors, and only what
    runs a node loads them."""
    made: tuple[Executor, ...] = (
        HttpExecutor(http_base, allow.of(HTTP)),
        PythonExecutor(allow.of(PYTHON)),
        CommandExecutor(allow.of(COMMAND), command_env),
    )
    return {executor.name: executor for executor in made}


def executor_for(executors: dict[str, Executor], name: str) -> Executor:
    try:
        return executors[name]
    except KeyError:
        raise InvalidJob(f"unknown executor {name!r}: this node runs {', '.join(sorted(executors))}") from None
