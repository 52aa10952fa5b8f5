"""Allow-lists: what work a node agrees to run, and the door check an enqueuer makes against them.

Each node publishes its lists on its machine row. An enqueuer refuses work
that no live machine would run, with the reason; when no machine is up it can
only check the work's form, and a node that refuses it later fails that one
run with the same reason.
"""

import json
from dataclasses import dataclass

from ..errors import InvalidJob, NotAllowed
from ..store import JobSpec
from .base import Executor
from .command import CommandExecutor, parse_argv
from .http import LOCAL_HOSTS, HttpExecutor, check_syntax
from .python import PythonExecutor, parse_target

EXECUTORS = ("http", "python", "command")


@dataclass(frozen=True)
class AllowLists:
    """Extra HTTP hosts (the local machine is always allowed), Python module prefixes, commands."""

    hosts: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps({"hosts": list(self.hosts), "modules": list(self.modules), "commands": list(self.commands)})

    @classmethod
    def from_json(cls, text: str) -> "AllowLists":
        data = json.loads(text)
        return cls(tuple(data["hosts"]), tuple(data["modules"]), tuple(data["commands"]))

    def executors(self, http_base: str = "http://localhost/") -> dict[str, Executor]:
        return {
            "http": HttpExecutor(http_base, LOCAL_HOSTS + tuple(h for h in self.hosts if h not in LOCAL_HOSTS)),
            "python": PythonExecutor(self.modules),
            "command": CommandExecutor(self.commands),
        }


def check_form(spec: JobSpec) -> None:
    """The checks that need no node: a known executor and a well-formed target."""
    if spec.executor == "http":
        check_syntax(spec)
    elif spec.executor == "python":
        parse_target(spec.target)
    elif spec.executor == "command":
        parse_argv(spec.target)
    else:
        raise InvalidJob(f"unknown executor {spec.executor!r}: use one of {', '.join(EXECUTORS)}")


def check_allowed(spec: JobSpec, published: list[str]) -> None:
    """Refuse `spec` if every live machine's published allow-lists refuse it (none published: accept)."""
    check_form(spec)
    refusals = []
    for text in published:
        try:
            AllowLists.from_json(text).executors()[spec.executor].validate(spec)
            return
        except NotAllowed as error:
            refusals.append(error)
    if refusals:
        raise refusals[0].elsewhere()

