"""The kinds of work a job can be (http, python, command): one row each in KINDS, and everything that differs
between them written in that row: the name a job's executor column holds, the check of its target's form, the
allow-list a node keeps for it and how a refusal by that list is worded, the hint and the checks of the SQL door
(store/sqlfunctions.py), and how a form or a command line names its target.

Every reader takes the kinds from here: the allow-lists (rules/allow.py), the form check of every enqueue
(rules/job.py), the SQL door, a node's options and settings, the executors (one per kind), the CLI's choices and the
app's dialog. Adding a kind is a row here with its form check, its executor (executors/), and its allow-list as a
field of AllowLists (rules/allow.py) and of NodeConfig (node/config.py).

Pure text and rules: the SQL checks are fragments of the stored code's text, which the store assembles.
"""

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from .errors import InvalidJob, echoed
from .urls import HTTP_SCHEMES, mask


@dataclass(frozen=True)
class SqlChecks:
    """How qp_enqueue checks a kind's target in one dialect, as closely as the dialect allows (the node checks
    exactly before it runs anything). `refusals`: pairs of a condition on the stored code's target variable (v_target
    on PostgreSQL, @target on SQL Server) that refuses the job, and what the refusal says (on PostgreSQL its % shows
    the target; on SQL Server the target follows it), tried in order. `declare` and `setup`: a variable the
    conditions read, and the statement that sets it for a job of this kind."""

    refusals: tuple[tuple[str, str], ...]
    declare: str = ""
    setup: str = ""


@dataclass(frozen=True)
class WorkKind:
    """One kind of work. `check(target, method)` raises InvalidJob for a target of the wrong form and returns what
    the kind's allow-list judges of it (a host, a module, a program; None: nothing to judge, as for a path under
    the node's own HTTP base); `admits(that, allowed)` says whether the list allows it."""

    name: str  # what a job's executor column holds
    check: Callable[[str, str], str | None]
    admits: Callable[[str, tuple[str, ...]], bool]
    example: str  # a target of this kind, as a usage error shows one
    said: str  # how a hint names its targets ("a path or URL")
    hint: str  # what qp_enqueue's refusal of a malformed target says to do
    # Its allow-list: AllowLists' field, the NodeConfig field (and Farm.node keyword) that fills it, what one entry is
    # (NotAllowed's kind, and the command line's --allow-<subject>), the option's help and metavar, and what the list
    # holds whatever a node is told.
    allow_field: str
    option: str
    subject: str
    option_help: str
    metavar: str
    # NotAllowed's wording: a template of its fields {target} {value} {where} {allowed} {option}, and what {allowed}
    # says of an empty list (a template of {option}; none for a list that is never empty).
    refusal: str
    unlisted: str
    postgresql: SqlChecks
    mssql: SqlChecks
    always: tuple[str, ...] = ()
    argv: bool = False  # its target is a list of words, given on a command line as words (and stored as JSON)

    def target_of(self, words: Sequence[str]) -> str | None:
        """The target a command line's `words` name: an argv as its JSON list, else the one word (None: not one)."""
        if self.argv:
            return json.dumps(list(words))
        return words[0] if len(words) == 1 else None


def _listed(value: str, allowed: tuple[str, ...]) -> bool:
    return value in allowed


# -- http: a path under the node's HTTP base, or a URL on an allowed host -------------------------------------------

METHODS = ("GET", "POST")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
LOCAL_BASE = "http://localhost/"  # what HTTP job paths are relative to unless a node is told otherwise

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


def check_syntax(target: str, method: str) -> str | None:
    """A path relative to the node's http_base that stays under it, or an absolute http(s) URL: returns its host
    (None if relative)."""
    if method not in METHODS:
        raise InvalidJob(f"HTTP method {echoed(method)} is not supported: use GET or POST")
    try:
        parts = urlsplit(target)
    except ValueError as error:  # e.g. "[::1" or a host that NFKC normalisation would change
        raise InvalidJob(f"HTTP job target {echoed(mask(target))} is not a valid URL ({mask(error)})") from None
    if not (parts.scheme or parts.netloc or target.startswith("//")):
        if climbs(parts.path):
            raise InvalidJob(
                f"HTTP job target {echoed(mask(target))} climbs out of the node's HTTP base: a path may hold "
                "no '..' segment, plain, percent-encoded or after '\\'; name the path under the base, such as "
                "/reports/run"
            )
        return None
    if parts.scheme not in HTTP_SCHEMES or not parts.hostname:
        raise InvalidJob(
            f"HTTP job target {echoed(mask(target))} is neither a path such as /reports/run nor an http(s) URL"
        )
    return parts.hostname


_PG_URL = "^https?://([^/?#@]*@)?(\\[[^]/?#]+\\]|[^]/?#:@[]+)(:[0-9]*)?([/?#]|$)"
_MS_SCHEME = "@target LIKE N'[A-Za-z]%:%' AND LEFT(@target, CHARINDEX(N':', @target) - 1) NOT LIKE N'%[^A-Za-z0-9+.-]%'"

HTTP = WorkKind(
    name="http",
    check=check_syntax,
    admits=_listed,
    example="/reports/run",
    said="a path or URL",
    hint="an HTTP job's target is a path such as /reports/run, or an http(s) URL on a host the nodes allow",
    allow_field="hosts",
    option="allow_hosts",
    subject="host",
    option_help="Also run HTTP jobs on this host (the local machine is always allowed).",
    metavar="HOST",
    refusal=(
        "HTTP job target {target}: host {value} is not allowed {where}; allowed hosts: {allowed} "
        "(add one with {option})"
    ),
    unlisted="",
    always=LOCAL_HOSTS,
    postgresql=SqlChecks(
        (
            (
                f"(v_target ~ '^[A-Za-z][A-Za-z0-9+.-]*:' OR v_target LIKE '//%') AND v_target !~* '{_PG_URL}'",
                "HTTP job target % is neither a path such as /reports/run nor an http(s) URL",
            ),
        )
    ),
    mssql=SqlChecks(
        (
            (
                f"(({_MS_SCHEME}) OR @target LIKE N'//%')"
                " AND NOT (@target LIKE N'http://[^/?#:@]%' OR @target LIKE N'https://[^/?#:@]%')",
                "HTTP job target is neither a path such as /reports/run nor an http(s) URL: ",
            ),
        )
    ),
)


# -- python: a public function of an allowed module -----------------------------------------------------------------

_PYTHON_TARGET = re.compile(
    r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<function>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$"
)


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


def _module(target: str, _method: str) -> str:
    return parse_target(target)[0]


_PG_PYTHON_TARGET = _PYTHON_TARGET.pattern.replace("(?P<module>", "(").replace("(?P<function>", "(")
_MS_FUNCTION = "SUBSTRING(@target, CHARINDEX(N':', @target) + 1, 4000)"

PYTHON = WorkKind(
    name="python",
    check=_module,
    admits=module_allowed,
    example="myapp.jobs:report",
    said="package.module:function",
    hint="a Python job's target is package.module:function, a public function",
    allow_field="modules",
    option="allow_modules",
    subject="module",
    option_help="Run Python jobs from modules under this prefix, e.g. myapp.jobs.",
    metavar="PREFIX",
    refusal="Python module {value} is not allowed {where}; allowed prefixes: {allowed}",
    unlisted="none (start the node with {option} PREFIX)",
    postgresql=SqlChecks(
        (
            (f"v_target !~ '{_PG_PYTHON_TARGET}'", "Python job target % is not of the form package.module:function"),
            ("v_target ~ ':(.*\\.)?_'", "Python job target % names a private attribute"),
        )
    ),
    mssql=SqlChecks(
        (
            (
                "(@target NOT LIKE N'[A-Za-z_]%:[A-Za-z_]%'"
                " OR @target LIKE N'%[^A-Za-z0-9_.:]%' OR @target LIKE N'%:%:%' OR @target LIKE N'%..%'"
                " OR @target LIKE N'%.' OR @target LIKE N'%.:%' OR @target LIKE N'%.[0-9]%')",
                "Python job target is not of the form package.module:function: ",
            ),
            (
                f"({_MS_FUNCTION} LIKE N'[_]%' OR {_MS_FUNCTION} LIKE N'%.[_]%')",
                "Python job target names a private attribute: ",
            ),
        )
    ),
)


# -- command: a program on the node's list, run without a shell -----------------------------------------------------


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


def _program(target: str, _method: str) -> str:
    """argv[0], which the list must hold exactly as written (`backup` allows `backup` on PATH, not `/tmp/backup`)."""
    return parse_argv(target)[0]


COMMAND = WorkKind(
    name="command",
    check=_program,
    admits=_listed,
    example='["backup", "--full"]',
    said="a JSON argv list",
    hint='a command job\'s target is a JSON list of strings such as ["backup", "--full"]',
    allow_field="commands",
    option="allow_commands",
    subject="command",
    option_help="Run command jobs whose argv[0] is exactly this.",
    metavar="PROGRAM",
    refusal="command {value} is not allowed {where}; allowed: {allowed}",
    unlisted="none (start the node with {option} NAME)",
    argv=True,
    postgresql=SqlChecks(
        (
            (
                "(v_argv IS NULL OR jsonb_typeof(v_argv) <> 'array' OR jsonb_array_length(v_argv) = 0"
                " OR EXISTS (SELECT 1 FROM jsonb_array_elements(v_argv) AS a(e) WHERE jsonb_typeof(a.e) <> 'string')"
                " OR v_argv ->> 0 = '')",
                "command job target % is not a JSON list of strings",
            ),
        ),
        declare="v_argv jsonb;",
        setup="BEGIN v_argv := v_target::jsonb; EXCEPTION WHEN others THEN v_argv := NULL; END;",
    ),
    mssql=SqlChecks(
        (
            (
                "(ISJSON(@target) = 0 OR LEFT(LTRIM(@target), 1) <> N'[')",
                "command job target is not a JSON list of strings: ",
            ),
            (
                "(NOT EXISTS (SELECT 1 FROM OPENJSON(@target))"
                " OR EXISTS (SELECT 1 FROM OPENJSON(@target) WHERE [type] <> 1) OR JSON_VALUE(@target, '$[0]') = N'')",
                "command job target is not a JSON list of strings: ",
            ),
        )
    ),
)


KINDS = {kind.name: kind for kind in (HTTP, PYTHON, COMMAND)}  # in the order every list of them shows
TARGETS_SAID = ", ".join(f"{kind.said} ({kind.name})" for kind in KINDS.values())  # "a path or URL (http), ..."


def work_said(row: Mapping[str, Any]) -> str:
    """A job's or schedule's work as a person reads it: an HTTP job's method and target, another kind's target
    alone (its method column holds the default, which means nothing for it)."""
    return f"{row['method']} {row['target']}" if row["executor"] == HTTP.name else str(row["target"])


def kind_of(executor: str) -> WorkKind:
    """The kind of work `executor` names (InvalidJob for none)."""
    try:
        return KINDS[executor]
    except KeyError:
        raise InvalidJob(f"unknown executor {echoed(executor)}: use one of {', '.join(KINDS)}") from None
