"""Executors by name. Each node builds its own set, with its own allow-lists."""

from ..errors import InvalidJob
from .base import Executor, JobContext, JobFailed
from .http import HttpExecutor

__all__ = ["Executor", "JobContext", "JobFailed", "HttpExecutor", "executor_for"]


def executor_for(executors: dict[str, Executor], name: str) -> Executor:
    try:
        return executors[name]
    except KeyError:
        raise InvalidJob(f"unknown executor {name!r}: this node runs {', '.join(sorted(executors))}") from None
