"""What work a machine agrees to run, checked without running anything.

A job's form (a known executor, a well-formed target) and a machine's allow-lists (HTTP hosts, Python module
prefixes, commands) are rules on text. Each node publishes its lists on its machine row; an enqueuer refuses
work that no live machine would run, with the reason (when no machine is up it can only check the work's form,
and a node that refuses it later fails that one run with the same reason). Each executor applies the same
rules to its own node's lists before it runs a job. Nothing here loads the executors (aiohttp, subprocesses),
so a command that only enqueues never does.
"""

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from .errors import InvalidJob, NotAllowed, echoed
from .urls import mask

if TYPE_CHECKING:  # a JobSpec is only passed through here: importing the store would load SQLAlchemy
    from .job import JobSpec

EXECUTORS = ("http", "python", "command")
METHODS = ("GET", "POST")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
LOCAL_BASE = "http://localhost/"  # what HTTP job paths are relative to unless a node is told otherwise
_PYTHON_TARGET = re.compile(
    r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<function>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$"
)


@dataclass(frozen=True)
class AllowLists:
    """Extra HTTP hosts (the local machine is always allowed), Python module prefixes, commands."""

    hosts: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()

    @property
    def http_hosts(self) -> tuple[str, ...]:
        return LOCAL_HOSTS + tuple(h for h in self.hosts if h not in LOCAL_HOSTS)

    def to_json(self) -> str:
        return json.dumps({"hosts": list(self.hosts), "modules": list(self.modules), "commands": list(self.commands)})

    @classmethod
    def from_json(cls, text: str) -> "AllowLists":
        data = json.loads(text)
        return cls(tuple(data["hosts"]), tuple(data["modules"]), tuple(data["commands"]))

    def check(self, spec: "JobSpec") -> None:
        """Raise NotAllowed (or InvalidJob, for a malformed job) if these lists refuse `spec`."""
        if spec.executor == "http":
            check_host(spec, self.http_hosts)
        elif spec.executor == "python":
            check_module(spec.target, self.modules)
        elif spec.executor == "command":
            check_command(spec.target, self.commands)
        else:
            check_form(spec)


def check_form(spec: "JobSpec") -> None:
    """The checks that need no node: a known executor and a well-formed target."""
    if spec.executor == "http":
        check_syntax(spec)
    elif spec.executor == "python":
        parse_target(spec.target)
    elif spec.executor == "command":
        parse_argv(spec.target)
    else:
        raise InvalidJob(f"unknown executor {echoed(spec.executor)}: use one of {', '.join(EXECUTORS)}")


def check_allowed(spec: "JobSpec", published: list[str]) -> None:
    """Refuse `spec` if every live machine's published allow-lists refuse it (none published: accept)."""
    check_form(spec)
    refusals = []
    for text in published:
        try:
            AllowLists.from_json(text).check(spec)
            return
        except NotAllowed as error:
            refusals.append(error)
    if refusals:
        raise refusals[0].elsewhere()


# -- HTTP -------------------------------------------------------------------


# What separates a path's segments for some server: "/", and "\\" on Windows' and some proxies'.
_SEGMENTS = re.compile(r"[/\\]")


def climbs(path: str) -> bool:
    """Whether a relative target's `path` has a ".." segment as any server on the way may read it, so that it could
    leave the node's http_base: percent-decoded, again and again (a proxy may decode what its server decodes
    again), with "\\" for "/", and without a segment's ";parameters" (Tomcat reads "..;" as "..")."""
    while True:
        if any(segment.split(";")[0].strip() == ".." for segment in _SEGMENTS.split(path)):
            return True
        decoded = unquote(path)
        if decoded == path:
            return False
        path = decoded


def check_syntax(spec: "JobSpec") -> str | None:
    """A path relative to the node's http_base that stays under it, or an absolute http(s) URL: returns its host
    (None if relative)."""
    if spec.method not in METHODS:
        raise InvalidJob(f"HTTP method {echoed(spec.method)} is not supported: use GET or POST")
    try:
        parts = urlsplit(spec.target)
    except ValueError as error:  # e.g. "[::1" or a host that NFKC normalisation would change
        raise InvalidJob(f"HTTP job target {echoed(mask(spec.target))} is not a valid URL ({mask(error)})") from None
    if not (parts.scheme or parts.netloc or spec.target.startswith("//")):
        if climbs(parts.path):
            raise InvalidJob(
                f"HTTP job target {echoed(mask(spec.target))} climbs out of the node's HTTP base: a path may hold "
                "no '..' segment, plain, percent-encoded or after '\\'; name the path under the base, such as "
                "/reports/run"
            )
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidJob(
            f"HTTP job target {echoed(mask(spec.target))} is neither a path such as /reports/run nor an http(s) URL"
        )
    return parts.hostname


def check_host(spec: "JobSpec", hosts: tuple[str, ...]) -> None:
    host = check_syntax(spec)
    if host is not None and host not in hosts:
        raise NotAllowed("host", host, hosts, "allow_hosts", target=mask(spec.target))


# -- Python -----------------------------------------------------------------


def parse_target(target: str) -> tuple[str, str]:
    """Split `package.module:function` into module and attribute path."""
    match = _PYTHON_TARGET.match(target)
    if not match:
        raise InvalidJob(f"Python job target {echoed(target)} is not of the form package.module:function")
    if any(part.startswith("_") for part in match["function"].split(".")):
        raise InvalidJob(f"Python job target {echoed(target)} names a private attribute: jobs call public functions")
    return match["module"], match["function"]


def module_allowed(module: str, prefixes: tuple[str, ...]) -> bool:
    """`app` allows `app` and `app.jobs`, not `apple`."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def check_module(target: str, prefixes: tuple[str, ...]) -> None:
    module, _ = parse_target(target)
    if not module_allowed(module, prefixes):
        raise NotAllowed("module", module, prefixes, "allow_modules")


# -- commands ---------------------------------------------------------------


def parse_argv(target: str) -> list[str]:
    """A command job's target, a JSON list of strings: the argv it runs, never re-split by a shell."""
    try:
        argv = json.loads(target)
    except json.JSONDecodeError:
        argv = None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
        raise InvalidJob(
            f'command job target {echoed(target)} is not a JSON list of strings such as ["backup", "--full"]'
        )
    return argv


def check_command(target: str, commands: tuple[str, ...]) -> None:
    """argv[0] must be on the list exactly as written (`backup` allows `backup` on PATH, not `/tmp/backup`)."""
    program = parse_argv(target)[0]
    if program not in commands:
        raise NotAllowed("command", program, commands, "allow_commands")
