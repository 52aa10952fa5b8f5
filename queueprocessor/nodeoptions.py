"""The options of a node, defined once for every entry point that runs one: `queueprocessor node`,
`queueprocessor gui` and the desktop app (`python -m ui`), each with its QP_* variable and its key in the TOML file.

Each option fills one field of NodeConfig (queueprocessor.node.config), the one shape of a node's settings, whose
defaults they show. Its click type checks the value alone (a range, a finite number); NodeConfig.checked() checks
what spans several (the allow-lists against --http-base), so the three entry points and Farm.node accept and refuse
the same values, with the same words. Adding an option is adding a field to NodeConfig and its spelling here:
`node_options` attaches it to every command that runs a node, and `to_argv` carries it from `gui` to the app.
"""

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, TypeVar, overload

import click

from .node.config import FARM_TIMING
from .node.config import NodeConfig as NodeConfig  # the shape the options make: the app names it from here
from .rules.errors import echoed
from .rules.kinds import KINDS
from .rules.limits import MAX_CAPACITY
from .rules.logs import LogFormat


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


class Names(click.types.StringParamType):
    """Names given one per option, or several in its QP_* variable separated by commas or spaces."""

    name = "name"

    def split_envvar_value(self, rv: str) -> Sequence[str]:
        return [name for name in re.split(r"[,\s]+", rv) if name]


@dataclass(frozen=True)
class _Option:
    """How the command line spells one of NodeConfig's fields. `secret`: the value may hold a password, so it
    travels to the app in its QP_* variable, not its argv (which the process list shows)."""

    help: str
    type: Any = None
    flag: str | None = None
    metavar: str | None = None
    secret: bool = False


FARM_WIDE = " Farm-wide."
_Command = TypeVar("_Command", bound=Callable[..., Any])  # a click command, or the function it will be made of

# The options, in the order --help lists them, each named as the NodeConfig field it fills; the defaults are
# NodeConfig's (None: the host name for --name, the farm's for the farm-wide timing).
OPTIONS = {
    "name": _Option("Machine name shown to operators. Default: host name."),
    "capacity": _Option("Jobs this machine runs at once.", click.IntRange(1, MAX_CAPACITY)),
    "misses": _Option("Missed heartbeats after which a machine is dead." + FARM_WIDE, int),
    "heartbeat": _Option("Seconds between check-ins." + FARM_WIDE, Seconds()),
    "period": _Option("Seconds per turn slot (one queue poll per period for the whole farm)." + FARM_WIDE, Seconds()),
    "http_base": _Option("Base URL that HTTP job paths are relative to."),
    "clock_skew": _Option("Pretend this machine's clock is off by SECONDS (to see skew handled).", Seconds()),
    "turn_keep": _Option("Seconds of turn history to keep.", Seconds()),
    "keep_jobs": _Option(
        "Seconds finished jobs and their runs are kept before the turn-holder deletes them.",
        Seconds(min=0, min_open=True),
    ),
    "keep_history": _Option(
        "Seconds of per-queue history (the app's charts, `stats`) kept; past a day it is kept by the hour.",
        Seconds(min=0, min_open=True),
    ),
    "keep_events": _Option(
        "Seconds the farm's event log (the app's Events tab, `events`) is kept.", Seconds(min=0, min_open=True)
    ),
    **{  # an allow-list for each kind of work, --allow-host for one host
        kind.option: _Option(kind.option_help + " Repeatable.", flag="--allow-" + kind.subject, metavar=kind.metavar)
        for kind in KINDS.values()
    },
    "command_env": _Option(
        "Also give command jobs this variable of the node's environment (they get PATH, HOME, USER, LOGNAME, LANG, "
        "LC_*, TZ, TMPDIR and their QP_JOB_ID, QP_ATTEMPT, QP_FENCE, QP_MACHINE, QP_QUEUE, never QP_DB). Repeatable; "
        "QP_COMMAND_ENV takes several, separated by commas.",
        Names(),
        flag="--command-env",
        metavar="NAME",
    ),
    "queues": _Option(
        "Serve only these queues, e.g. reports:2,default (at most 2 reports jobs at once on this machine). "
        "Default: every queue.",
        metavar="NAME[:LIMIT],...",
    ),
    "push": _Option(
        "On PostgreSQL, start new work as soon as it is enqueued (LISTEN/NOTIFY).", flag="--push/--no-push"
    ),
    "metrics_port": _Option(
        "Serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port, logged). Default: off.",
        click.IntRange(0, 65535),
        metavar="PORT",
    ),
    "metrics_host": _Option("Address --metrics-port listens on (0.0.0.0: every interface).", metavar="HOST"),
    "log_format": _Option(
        "Log as text, or as one JSON object per line (time, level, logger, machine, message, job_id) for a log store.",
        click.Choice(LogFormat, case_sensitive=False),
    ),
    "listen_db": _Option(
        "For push, LISTEN on this PostgreSQL URL: the server's own, when --db reaches it through a pooler such as "
        "PgBouncer (where LISTEN cannot work). Default: --db; through a pooler without it, the farm polls.",
        metavar="URL",
        secret=True,
    ),
}


def node_config(params: dict[str, Any]) -> NodeConfig:
    """The node's settings among a command's parsed parameters, checked."""
    return NodeConfig().given(**{name: params[name] for name in OPTIONS if name in params}).checked()


def to_argv(config: NodeConfig) -> list[str]:
    """A node's settings as a command line any entry point takes back (gui hands them to the app)."""
    argv = []
    for name, option in OPTIONS.items():
        value, flag = getattr(config, name), _flag(name)
        if option.secret or (name in FARM_TIMING and name not in config.asked):
            continue
        if isinstance(value, bool):
            argv += [flag.split("/")[0] if value else flag.split("/")[1]]
        elif isinstance(value, tuple):
            argv += [part for item in value for part in (flag, item)]
        elif value is not None:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    return argv


def secret_env(config: NodeConfig) -> dict[str, str]:
    """The settings to_argv leaves out, as the QP_* variables every entry point also reads them from."""
    return {
        _envvar(name): getattr(config, name)
        for name, option in OPTIONS.items()
        if option.secret and getattr(config, name) is not None
    }


def _envvar(name: str) -> str:
    return "QP_" + _flag(name).split("/")[0].removeprefix("--").replace("-", "_").upper()


def _flag(name: str) -> str:
    return OPTIONS[name].flag or "--" + name.replace("_", "-")


def _default(name: str) -> Any:
    """An option's default as click shows it: NodeConfig's, as the word a user types (an enum's value, where click
    would show the member's name); None where it is the host name or the farm's."""
    if name == "name" or name in FARM_TIMING:
        return None
    default = next(f.default for f in fields(NodeConfig) if f.name == name)
    return default.value if isinstance(default, Enum) else default


def flag_of(keyword: str) -> str:
    """The command-line option for an API keyword (errors.QPError.say): --allow-host for allow_hosts,
    --max-attempts for max_attempts."""
    return _flag(keyword).split("/")[0] if keyword in OPTIONS else "--" + keyword.replace("_", "-")


class NodeCommand(click.Command):
    """A command that runs a node: its node options reach the callback as one checked `options` (NodeConfig),
    and a refusal comes while parsing, before anything opens."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        ctx.params["options"] = node_config({name: ctx.params.pop(name) for name in OPTIONS if name in ctx.params})
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
        for name in reversed([name for name in OPTIONS if only is None or name in only]):
            option, default = OPTIONS[name], _default(name)
            extra = (
                dict(multiple=True, type=option.type)
                if isinstance(default, tuple)
                else dict(type=option.type, default=default)
            )
            command = click.option(
                _flag(name),
                name,
                envvar=_envvar(name),
                show_envvar=True,
                metavar=option.metavar,
                help=option.help,
                **extra,
            )(command)
        return command

    return attach if command is None else attach(command)
