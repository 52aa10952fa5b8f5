"""Executors by name. Each node builds its own set, with its own allow-lists (see allow)."""

from ..errors import InvalidJob
from .allow import AllowLists, check_allowed, check_form
from .base import Executor, JobContext, JobFailed
from .command import CommandExecutor
from .http import HttpExecutor
from .python import PythonExecutor

__all__ = ["AllowLists", "CommandExecutor", "Executor", "HttpExecutor", "JobContext", "JobFailed",
           "PythonExecutor", "check_allowed", "check_form", "executor_for"]


def executor_for(executors: dict[str, Executor], name: str) -> Executor:
    try:
        return executors[name]
    except KeyError:
        raise InvalidJob(f"unknown executor {name!r}: this node runs {', '.join(sorted(executors))}") from None
