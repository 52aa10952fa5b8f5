"""Executors by name. Each node builds its own set, with its own allow-lists (queueprocessor.allow)."""

from ..allow import AllowLists
from ..errors import InvalidJob
from .base import Executor, JobContext, JobFailed
from .command import CommandExecutor
from .http import HttpExecutor
from .python import PythonExecutor

__all__ = ["AllowLists", "CommandExecutor", "Executor", "HttpExecutor", "JobContext", "JobFailed",
           "PythonExecutor", "executor_for"]


def executor_for(executors: dict[str, Executor], name: str) -> Executor:
    try:
        return executors[name]
    except KeyError:
        raise InvalidJob(f"unknown executor {name!r}: this node runs {', '.join(sorted(executors))}") from None
