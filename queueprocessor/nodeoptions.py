"""The options of a node, defined once for every entry point that runs one: `queueprocessor node`,
`queueprocessor gui` and the desktop app (`python -m ui`).

Each field of NodeOptions is one option. Its click type checks the value alone (a range, a finite number);
`checked()` checks what spans several (the allow-lists against --http-base), so the three entry points accept
and refuse the same values, with the same words. Adding an option is adding a field here: `node_options`
attaches it to every command that runs a node, `to_argv` carries it from `gui` to the app, and its name is
the keyword Farm.node takes (`node_keywords()`), unless it is marked `to_node=False`: a setting of the process
around the node (its logs, say), which each entry point reads from its NodeOptions itself.
"""

import math
import socket
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from enum import Enum
from typing import Any, TypeVar, overload

import click

from .rules.allow import AllowLists
from .rules.errors import echoed
from .rules.limits import MAX_CAPACITY
from .rules.logs import LogFormat
from .rules.queues import Served


class Seconds(click.FloatRange):
    """A finite number of seconds: click's FloatRange lets "nan" and "inf" through, and a node given one
    would sleep forever or compare false with every time."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number: float = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{echoed(value)} is not a finite number of seconds", param, ctx)
        return number

    def _describe_range(self) -> str:
        return "" if self.min is None and self.max is None else super()._describe_range()


def _option(
    help: str,
    type: Any = None,
    *,
    flag: str | None = None,
    metavar: str | None = None,
    to_node: bool = True,
    secret: bool = False,
) -> dict[str, Any]:
    """`secret`: the value may hold a password, so it travels to the app in its QP_* variable, not its argv
    (which the process list shows)."""
    return {"option": dict(help=help, type=type, flag=flag, metavar=metavar, to_node=to_node, secret=secret)}


FARM_WIDE = " Farm-wide."
_Command = TypeVar("_Command", bound=Callable[..., Any])  # a click command, or the function it will be made of


@dataclass(frozen=True)
class NodeOptions:
    """What a node on this machine is told. Field names are Farm.node's keywords (clock_skew makes its clock)."""

    name: str | None = field(default=None, metadata=_option("Machine name shown to operators. Default: host name."))
    capacity: int = field(
        default=4, metadata=_option("Jobs this machine runs at once.", click.IntRange(1, MAX_CAPACITY))
    )
    misses: int | None = field(
        default=None, metadata=_option("Missed heartbeats after which a machine is dead." + FARM_WIDE, int)
    )
    heartbeat: float | None = field(default=None, metadata=_option("Seconds between check-ins." + FARM_WIDE, Seconds()))
    period: float | None = field(
        default=None,
        metadata=_option(
            "Seconds per turn slot (one queue poll per period for the whole farm)." + FARM_WIDE, Seconds()
        ),
    )
    http_base: str = field(
        default="http://localhost/", metadata=_option("Base URL that HTTP job paths are relative to.")
    )
    clock_skew: float = field(
        default=0.0,
        metadata=_option("Pretend this machine's clock is off by SECONDS (to see skew handled).", Seconds()),
    )
    turn_keep: float = field(default=86400.0, metadata=_option("Seconds of turn history to keep.", Seconds()))
    keep_jobs: float = field(
        default=7 * 86400.0,
        metadata=_option(
            "Seconds finished jobs and their runs are kept before the turn-holder deletes them.",
            Seconds(min=0, min_open=True),
        ),
    )
    allow_hosts: tuple[str, ...] = field(
        default=(),
        metadata=_option(
            "Also run HTTP jobs on this host (the local machine is always allowed). Repeatable.",
            flag="--allow-host",
            metavar="HOST",
        ),
    )
    allow_modules: tuple[str, ...] = field(
        default=(),
        metadata=_option(
            "Run Python jobs from modules under this prefix, e.g. myapp.jobs. Repeatable.",
            flag="--allow-module",
            metavar="PREFIX",
        ),
    )
    allow_commands: tuple[str, ...] = field(
        default=(),
        metadata=_option(
            "Run command jobs whose argv[0] is exactly this. Repeatable.", flag="--allow-command", metavar="PROGRAM"
        ),
    )
    queues: str | None = field(
        default=None,
        metadata=_option(
            "Serve only these queues, e.g. reports:2,default (at most 2 reports jobs at once on this machine). "
            "Default: every queue.",
            metavar="NAME[:LIMIT],...",
        ),
    )
    push: bool = field(
        default=True,
        metadata=_option(
            "On PostgreSQL, start new work as soon as it is enqueued (LISTEN/NOTIFY).", flag="--push/--no-push"
        ),
    )
    metrics_port: int | None = field(
        default=None,
        metadata=_option(
            "Serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port, logged). Default: off.",
            click.IntRange(0, 65535),
            metavar="PORT",
        ),
    )
    metrics_host: str = field(
        default="127.0.0.1",
        metadata=_option("Address --metrics-port listens on (0.0.0.0: every interface).", metavar="HOST"),
    )
    log_format: LogFormat = field(
        default=LogFormat.TEXT,
        metadata=_option(
            "Log as text, or as one JSON object per line (time, level, logger, machine, message, job_id) for a log "
            "store.",
            click.Choice(LogFormat, case_sensitive=False),
            to_node=False,
        ),
    )
    listen_db: str | None = field(
        default=None,
        metadata=_option(
            "For push, LISTEN on this PostgreSQL URL: the server's own, when --db reaches it through a pooler such as "
            "PgBouncer (where LISTEN cannot work). Default: --db; through a pooler without it, the farm polls.",
            metavar="URL",
            secret=True,
        ),
    )

    @property
    def machine(self) -> str:
        """The machine name its node will have (the host name unless --name says otherwise)."""
        return self.name or socket.gethostname()

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "NodeOptions":
        """The options among a command's parsed parameters, checked."""
        return cls(**{f.name: params[f.name] for f in fields(cls) if f.name in params}).checked()

    def checked(self) -> "NodeOptions":
        """Raise the QPError a node would meet at start for options that only fail together."""
        from .executors import make_executors  # only a command that runs a node comes here

        make_executors(AllowLists(self.allow_hosts, self.allow_modules, self.allow_commands), self.http_base)
        Served.parse(self.queues)
        if self.listen_db is not None:
            from .store.database import listen_url  # SQLAlchemy: only a command that runs a node comes here

            listen_url(self.listen_db)
        return self

    def node_keywords(self) -> dict[str, Any]:
        """Farm.node's keywords for these options."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata["option"]["to_node"]}

    def to_argv(self) -> list[str]:
        """These options as a command line any entry point takes back (gui hands them to the app)."""
        argv = []
        for f in fields(self):
            value, flag = getattr(self, f.name), _flag(f)
            if f.metadata["option"]["secret"]:
                continue
            if isinstance(value, bool):
                argv += [flag.split("/")[0] if value else flag.split("/")[1]]
            elif isinstance(value, tuple):
                argv += [part for item in value for part in (flag, item)]
            elif value is not None:
                argv += [flag, repr(value) if isinstance(value, float) else str(value)]
        return argv

    def secret_env(self) -> dict[str, str]:
        """The options to_argv leaves out, as the QP_* variables every entry point also reads them from."""
        return {
            _envvar(f): getattr(self, f.name)
            for f in fields(self)
            if f.metadata["option"]["secret"] and getattr(self, f.name) is not None
        }


def _envvar(f: Field[Any]) -> str:
    return "QP_" + _flag(f).split("/")[0].removeprefix("--").replace("-", "_").upper()


def _flag(f: Field[Any]) -> str:
    flag: str = f.metadata["option"]["flag"] or "--" + f.name.replace("_", "-")
    return flag


def flag_of(keyword: str) -> str:
    """The command-line option for an API keyword (errors.QPError.say): --allow-host for allow_hosts,
    --max-attempts for max_attempts."""
    named = next((f for f in fields(NodeOptions) if f.name == keyword), None)
    return _flag(named).split("/")[0] if named else "--" + keyword.replace("_", "-")


class NodeCommand(click.Command):
    """A command that runs a node: its node options reach the callback as one checked `options`
    (NodeOptions), and a refusal comes while parsing, before anything opens."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        given = {f.name: ctx.params.pop(f.name) for f in fields(NodeOptions) if f.name in ctx.params}
        ctx.params["options"] = NodeOptions.from_params(given)
        return rest


@overload
def node_options(command: _Command, *, only: tuple[str, ...] | None = None) -> _Command: ...
@overload
def node_options(command: None = None, *, only: tuple[str, ...] | None = None) -> Callable[[_Command], _Command]: ...
def node_options(
    command: _Command | None = None, *, only: tuple[str, ...] | None = None
) -> _Command | Callable[[_Command], _Command]:
    """Attach the node's options (or `only` those named) to a click command, each with its QP_* variable."""

    def attach(command: _Command) -> _Command:
        for f in reversed([f for f in fields(NodeOptions) if only is None or f.name in only]):
            spec = f.metadata["option"]
            flag = _flag(f)
            envvar = _envvar(f)
            # An enum's default shows as the word a user types (click would show the member's name).
            default = f.default.value if isinstance(f.default, Enum) else f.default
            extra = dict(multiple=True) if isinstance(f.default, tuple) else dict(type=spec["type"], default=default)
            command = click.option(
                flag, f.name, envvar=envvar, show_envvar=True, metavar=spec["metavar"], help=spec["help"], **extra
            )(command)
        return command

    return attach if command is None else attach(command)
