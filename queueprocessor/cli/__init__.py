"""The `queueprocessor` command.

Options come from the command line, then QP_* environment variables, then the
TOML config file (`--config`, a `[node]`-style table per command and a
top-level `db`), then defaults. Every error a user can cause is one line on
stderr and a non-zero exit code, never a traceback.

A command answers as fast as what it does allows: this module loads only click and the light modules (errors,
states, output, urls, nodeoptions), and a command's handler loads the farm side it uses (`Context.farm` the
engine and SQLAlchemy, `Farm.node` the node, aiohttp and the executors). So `--help` loads no SQLAlchemy and
`enqueue` no node; tests/unit/test_cli_imports.py holds both.
"""

import gc
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from .nodeoptions import NodeCommand, NodeConfig, Seconds, flag_of, node_options, secret_env, to_argv
from .rules import logs
from .rules.errors import ConfigError, NotFound, QPError, echoed
from .rules.limits import MAX_ATTEMPTS
from .rules.output import format_time, machine_label, print_json, print_table, progress_text
from .rules.queues import DEFAULT, UNCHANGED, OnFailure, Served, check_name
from .rules.schedules import DEFAULT_GRACE, DEFAULT_MISFIRE, made_by
from .rules.search import JobFilter
from .rules.states import HISTORY_COUNTS, JobState, Wish
from .rules.urls import default_url, mask
from .version import __version__

if TYPE_CHECKING:  # loaded by the commands that use them: `--help` and `enqueue` load no node (test_cli_imports)
    from .farm import Farm, JobSpec
    from .node.node import Node
    from .store.bulk import Changed

log = logging.getLogger("queueprocessor")
_Command = TypeVar("_Command", bound=Callable[..., Any])  # a command's function, given more options
JOB_ID = click.IntRange(1, 2**63 - 1)  # ids are 64-bit: a larger number names no job, and no driver takes it
JOB_ID.name = "integer"  # "'abc' is not a valid integer", not "... integer range"


def _load_config(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    import tomllib  # only with a config file

    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist: check the --config path or QP_CONFIG") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from None
    except (OSError, UnicodeDecodeError) as error:  # a folder, no permission, not text
        raise ConfigError(f"cannot read config file {path}: {getattr(error, 'strerror', None) or error}") from None


def _check_config_keys(
    group: click.Group, config: dict[str, Any], path: str | None, prefix: str = ""
) -> dict[str, Any]:
    """The config's tables become Click's default_map; unknown keys are refused, not ignored."""
    defaults = {}
    for key, value in config.items():
        if key == "db" and not prefix:
            continue
        command = group.commands.get(key)
        if command is None or not isinstance(value, dict):
            raise ConfigError(
                f"config file {path}: unknown key {echoed(prefix + key)}: use 'db' or a table named after "
                f"a command ({', '.join(sorted(group.commands))})"
            )
        if isinstance(command, click.Group):
            defaults[key] = _check_config_keys(command, value, path, prefix=f"{prefix}{key}.")
            continue
        # An option is named by its flag (allow-host) or its parameter (allow_hosts).
        params = {
            name: p
            for p in command.params
            for name in (p.name, *(flag.lstrip("-").replace("-", "_") for flag in p.opts))
        }
        defaults[key] = {}
        for option, given in value.items():
            param = params.get(option.replace("-", "_"))
            if param is None:
                raise ConfigError(
                    f"config file {path}: [{prefix}{key}] has no option {echoed(option)}: "
                    f"see `queueprocessor {(prefix + key).replace('.', ' ')} --help`"
                )
            defaults[key][param.name] = _typed(param, given, f"config file {path}: [{prefix}{key}] {option}")
    return defaults


def _typed(param: click.Parameter, value: object, where: str) -> object:
    """TOML has types of its own: click would turn true into 1, 1.5 into 1 and [1] into "[1]", or fail with a
    traceback on a table or a date. Each value must be of the option's type; a repeatable option takes a list
    of them or one."""
    kind = param.type
    wanted: tuple[type, ...]
    if isinstance(kind, click.types.BoolParamType):
        wanted, text = (bool,), "true or false"
    elif isinstance(kind, click.types.IntParamType):
        wanted, text = (int,), "a whole number"
    elif isinstance(kind, click.types.FloatParamType):
        wanted, text = (int, float), "a number of seconds" if isinstance(kind, Seconds) else "a number"
    else:
        wanted, text = (str,), "a string in quotes"
    repeats = param.multiple or param.nargs != 1
    items = value if repeats and isinstance(value, list) else [value]
    for item in items:
        if not isinstance(item, wanted) or (isinstance(item, bool) and bool not in wanted):
            shown = str(item).lower() if isinstance(item, bool) else echoed(item)
            raise ConfigError(f"{where} must be {text}{', or a list of them' if repeats else ''} (got {shown})")
    return items if repeats else value


class Context:
    """Opens the farm lazily, so `--help` and bad options never touch the database."""

    def __init__(self, url: str | None):
        self.chosen = url is not None  # by --db, QP_DB or the config file
        self.url = url or default_url()
        self.machine: str | None = None  # a node's --name, which labels the farm's connections
        self._farm: Farm | None = None

    @property
    def farm(self) -> "Farm":
        """The farm to change: created on first use, with its tables."""
        return self._open(read_only=False)

    @property
    def reader(self) -> "Farm":
        """The farm only to look at (the app's watch-only mode): a command that reads creates no file or table
        and adopts no settings, so the first node still chooses the farm's timing."""
        return self._open(read_only=True)

    def _open(self, read_only: bool) -> "Farm":
        if self._farm is None:
            # The engine and SQLAlchemy: loaded by the first command that uses the farm.
            from .farm import Farm
            from .store.database import client_name

            self._farm = Farm(self.url, read_only=read_only, client=client_name(self.machine))
        return self._farm

    def close(self) -> None:
        if self._farm is not None:
            self._farm.close()


@click.group(context_settings={"auto_envvar_prefix": "QP", "help_option_names": ["-h", "--help"], "show_default": True})
@click.option(
    "--db",
    envvar="QP_DB",
    metavar="URL",
    help="Farm database, e.g. postgresql://user:pw@host/farm. Default: a SQLite file in your data folder.",
)
@click.option("--config", envvar="QP_CONFIG", metavar="FILE", help="TOML file with defaults for any option.")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.version_option(__version__, prog_name="queueprocessor")
@click.pass_context
def cli(ctx: click.Context, db: str | None, config: str | None, verbose: int) -> None:
    """A farm of machines sharing one SQL database drains a job queue together."""
    settings = _load_config(config)
    ctx.default_map = _check_config_keys(cli, settings, config)
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logs.configure(level)
    ctx.obj = Context(db or settings.get("db"))
    ctx.call_on_close(ctx.obj.close)


pass_ctx = click.make_pass_decorator(Context)


@cli.command("init-db")
@node_options(only=("period", "heartbeat", "misses"))
@pass_ctx
def init_db(ctx: Context, period: float | None, heartbeat: float | None, misses: int | None) -> None:
    """Create the tables (a node also does this on first start)."""
    farm = ctx.farm
    settings = farm.settings(period=period, heartbeat=heartbeat, misses=misses)
    verb = "created" if farm.created else "is up to date"
    click.echo(
        f"schema {verb} in {farm.masked_url}; period {settings['period']:g} s, "
        f"heartbeat {settings['heartbeat']:g} s, dead after {settings['misses']:g} misses"
    )


@cli.command(cls=NodeCommand)
@node_options
@pass_ctx
def node(ctx: Context, options: NodeConfig) -> None:
    """Run this machine's node until stopped (SIGTERM or Ctrl-C drains; a second Ctrl-C exits at once)."""
    logs.configure(min(logging.INFO, logging.getLogger().level), options.log_format, options.name)
    ctx.machine = options.name
    run_until_signalled(ctx.farm.node(options))


def run_until_signalled(the_node: "Node") -> None:
    """SIGTERM or the first SIGINT drains the node; a second SIGINT leaves at once."""
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stopping.is_set() and signum == signal.SIGINT:
            log.warning("second interrupt: leaving now; running jobs go back to the queue")
            threading.Thread(target=the_node.stop, kwargs={"drain": False}, daemon=True).start()
            return
        stopping.set()
        log.info("%s: draining, then exiting (Ctrl-C again to leave at once)", signal.Signals(signum).name)
        threading.Thread(target=the_node.stop, kwargs={"drain": True}, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    the_node.start()
    # What the process holds once started (modules, the engine, compiled statements) lives as long as it does: the
    # collector no longer walks it at each full collection, which a busy node's jobs set off every few seconds.
    gc.freeze()
    the_node.stopped.wait()  # a signal still runs its handler here (a lock's wait is interrupted by it)


@cli.group()
def enqueue() -> None:
    """Add jobs to the queue."""


def _work_options(command: _Command) -> _Command:
    """What every kind of work takes besides its target (enqueue, schedule, singleton, grab)."""
    for option in reversed(
        (
            click.option(
                "--method",
                type=click.Choice(["GET", "POST"], case_sensitive=False),
                default="GET",
                help="HTTP jobs only.",
            ),
            click.option(
                "--payload",
                metavar="JSON",
                help="JSON given to the work (HTTP POST body, Python argument, command's stdin).",
            ),
            click.option("--priority", type=int, default=0, help="Higher runs first."),
            click.option("--max-attempts", type=click.IntRange(min=1), default=MAX_ATTEMPTS),
            click.option("--timeout", type=Seconds(min=0, min_open=True), help="Seconds before a run is stopped."),
            click.option(
                "--queue",
                default=DEFAULT,
                metavar="NAME",
                help="The queue it waits in; only machines serving it run it (node --queues).",
            ),
            click.option(
                "--order-key",
                metavar="KEY",
                help="Jobs with the same key in one queue run one at a time, in the order they were enqueued.",
            ),
        )
    ):
        command = option(command)
    return command


def _job_ids(_ctx: click.Context, _param: click.Parameter, text: str | None) -> tuple[int, ...]:
    """--after 12,13: job ids, separated by commas."""
    try:
        return tuple(int(word) for word in text.split(",")) if text else ()
    except ValueError:
        raise click.BadParameter(
            f"{echoed(text)} is not a list of job ids: give them separated by commas, e.g. 12,13"
        ) from None


def _when_options(command: _Command) -> _Command:
    for option in reversed(
        (
            click.option("--delay", type=Seconds(min=0), default=0.0, help="Seconds from now (database time)."),
            click.option("--at", "at", metavar="TIME", help="Run at an ISO 8601 time or epoch seconds."),
            click.option(
                "--count", type=click.IntRange(min=1, max=1_000_000), default=1, help="Enqueue this many copies."
            ),
            click.option(
                "--key", help="Unique key: a second job with the same key (and instance) is refused, naming the winner."
            ),
            click.option("--instance", help="With --key: the instance of the keyed work, e.g. a date."),
            click.option(
                "--after",
                metavar="IDS",
                callback=_job_ids,
                help="Run once these jobs (ids, e.g. 12,13) have succeeded; until then it waits.",
            ),
            click.option(
                "--after-ended", is_flag=True, help="With --after: run once they have ended, whatever the outcome."
            ),
        )
    ):
        command = option(command)
    return command


def _spec(
    executor: str,
    words: Sequence[str],
    *,
    method: str,
    payload: str | None,
    priority: int,
    max_attempts: int,
    timeout: float | None,
    queue: str,
    order_key: str | None,
    after: tuple[int, ...] = (),
    after_ended: bool = False,
) -> "JobSpec":
    """A JobSpec from `EXECUTOR TARGET...` on the command line."""
    from .farm import work_spec

    return work_spec(
        executor,
        _target_of(executor, words),
        method=method,
        payload=payload,
        priority=priority,
        max_attempts=max_attempts,
        timeout=timeout,
        queue=queue,
        order_key=order_key,
        after=after,
        after_ended=after_ended,
    )


def _target_of(executor: str, words: Sequence[str]) -> str:
    """The target `EXECUTOR TARGET...` names on the command line: a command's argv as JSON."""
    if executor != "command" and len(words) != 1:
        example = "/reports/run" if executor == "http" else "myapp.jobs:report"
        raise click.UsageError(f"{executor} work takes one target, e.g. {example} (got {len(words)})")
    return json.dumps(list(words)) if executor == "command" else words[0]


def _enqueue(
    ctx: Context, spec: "JobSpec", *, delay: float, at: str | None, count: int, key: str | None, instance: str | None
) -> None:
    if at is not None and delay:
        raise click.UsageError("give --delay or --at, not both")
    if instance is not None and key is None:
        raise click.UsageError("--instance needs --key")
    if key is not None:
        from .grabs import grab_key

        spec = replace(spec, key=grab_key(key, instance) if instance is not None else key)
    done = ctx.farm.submit(spec, delay=delay, at=_parse_time(at), count=count)
    ids = done.ids
    click.echo(f"enqueued job {ids[0]}" if len(ids) == 1 else f"enqueued {len(ids)} jobs ({ids[0]}..{ids[-1]})")
    if not done.served:
        click.echo(
            f"warning: no live machine serves queue {echoed(spec.queue)} yet: its jobs wait until one does "
            "(node --queues)",
            err=True,
        )


@enqueue.command("http")
@click.argument("path")
@_work_options
@_when_options
@pass_ctx
def enqueue_http(
    ctx: Context,
    /,
    path: str,
    delay: float,
    at: str | None,
    count: int,
    key: str | None,
    instance: str | None,
    **work: Any,
) -> None:
    """Enqueue an HTTP GET/POST to PATH on each node's --http-base (or a URL on an allowed host)."""
    _enqueue(ctx, _spec("http", [path], **work), delay=delay, at=at, count=count, key=key, instance=instance)


@enqueue.command("python")
@click.argument("target", metavar="MODULE:FUNCTION")
@_work_options
@_when_options
@pass_ctx
def enqueue_python(
    ctx: Context,
    /,
    target: str,
    delay: float,
    at: str | None,
    count: int,
    key: str | None,
    instance: str | None,
    **work: Any,
) -> None:
    """Enqueue a call of MODULE:FUNCTION(payload, context) on a node that allows the module."""
    _enqueue(ctx, _spec("python", [target], **work), delay=delay, at=at, count=count, key=key, instance=instance)


@enqueue.command("command")
@click.argument("argv", nargs=-1, required=True)
@_work_options
@_when_options
@pass_ctx
def enqueue_command(
    ctx: Context,
    /,
    argv: tuple[str, ...],
    delay: float,
    at: str | None,
    count: int,
    key: str | None,
    instance: str | None,
    **work: Any,
) -> None:
    """Enqueue a program run without a shell: `enqueue command -- backup --full` (exit code 0 is success)."""
    _enqueue(ctx, _spec("command", argv, **work), delay=delay, at=at, count=count, key=key, instance=instance)


_executor = click.argument("executor", type=click.Choice(["http", "python", "command"]), metavar="EXECUTOR")
_target = click.argument("target", nargs=-1, required=True)


@cli.group()
def schedule() -> None:
    """Recurring work: each occurrence runs once on the farm, however many machines see it."""


def _when_recurring(misfire: str | None, grace: float | None) -> Callable[[_Command], _Command]:
    """The options that say when a schedule recurs, for `schedule add` (with the defaults) and `set` (None: keep)."""

    def add_options(command: _Command) -> _Command:
        for option in reversed(
            (
                click.option("--cron", metavar="EXPR", help="Cron expression, e.g. '30 2 * * *' (6th field: seconds)."),
                click.option("--tz", metavar="ZONE", help="Time zone of --cron, e.g. Europe/Berlin. Default: UTC."),
                click.option(
                    "--every",
                    type=Seconds(),
                    metavar="SECONDS",
                    help="Fixed interval, at whole multiples since the epoch.",
                ),
                click.option(
                    "--misfire",
                    type=click.Choice(["skip", "once", "all"]),
                    default=misfire,
                    help="Occurrences the farm noticed late (it was down): skip them, run the newest once, or run all.",
                ),
                click.option(
                    "--grace",
                    type=Seconds(min=0),
                    default=grace,
                    help="Seconds after which a missed occurrence is dropped whatever --misfire says.",
                ),
            )
        ):
            command = option(command)
        return command

    return add_options


@schedule.command("add")
@click.argument("name")
@_when_recurring(DEFAULT_MISFIRE, DEFAULT_GRACE)
@_executor
@_target
@_work_options
@pass_ctx
def schedule_add(
    ctx: Context,
    /,
    name: str,
    cron: str | None,
    tz: str | None,
    every: float | None,
    misfire: str,
    grace: float,
    executor: str,
    target: tuple[str, ...],
    **work: Any,
) -> None:
    """Run EXECUTOR TARGET... on a schedule, e.g. `schedule add nightly --cron '0 3 * * *' command -- backup`."""
    row = ctx.farm.schedule(
        name, _spec(executor, target, **work), cron=cron, tz=tz, every=every, misfire=misfire, grace=grace
    )
    _say_schedule(row)


def _say_schedule(row: dict[str, Any]) -> None:
    when = "paused" if row["paused"] else f"next at {format_time(row['next_run'])} UTC"
    click.echo(f"schedule {row['name']}: {_recurrence(row)}, {when}")


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def schedule_list(ctx: Context, as_json: bool) -> None:
    """Every schedule with its next occurrence."""
    rows = ctx.reader.list_schedules()
    if as_json:
        return print_json({"schedules": rows})
    print_table(
        ["name", "when", "work", "misfire", "state", "next (UTC)"],
        [
            [
                r["name"],
                _recurrence(r),
                f"{r['executor']} {r['target']}"[:60],
                f"{r['misfire']}/{r['grace']:g}s",
                "paused" if r["paused"] else "active",
                "-" if r["paused"] else format_time(r["next_run"]),
            ]
            for r in rows
        ],
    )


def _recurrence(row: dict[str, Any]) -> str:
    """A schedule's occurrences in words (croniter is loaded by the schedule commands only)."""
    from .rules.schedules import Recurrence

    return Recurrence.of(row).describe()


@schedule.command("remove")
@click.argument("name")
@pass_ctx
def schedule_remove(ctx: Context, name: str) -> None:
    """Delete a schedule; its occurrences still waiting in the queue are cancelled."""
    cancelled = ctx.farm.remove_schedule(name)
    click.echo(f"schedule {name} removed ({cancelled} waiting occurrence(s) cancelled)")


@schedule.command("pause")
@click.argument("name")
@pass_ctx
def schedule_pause(ctx: Context, name: str) -> None:
    """Stop making occurrences until resumed (those in between are not run)."""
    cancelled = ctx.farm.pause_schedule(name)
    click.echo(f"schedule {name} paused ({cancelled} waiting occurrence(s) cancelled)")


@schedule.command("resume")
@click.argument("name")
@pass_ctx
def schedule_resume(ctx: Context, name: str) -> None:
    """Start a paused schedule again from its next occurrence."""
    row = ctx.farm.resume_schedule(name)
    click.echo(f"schedule {name} active, next at {format_time(row['next_run'])} UTC")


@schedule.command("run")
@click.argument("name")
@click.option(
    "--request",
    metavar="KEY",
    help="Names this request: sent again (a retry), it runs nothing more. Default: a new request.",
)
@pass_ctx
def schedule_run(ctx: Context, name: str, request: str | None) -> None:
    """Run schedule NAME once now, beside its regular occurrences (which stay as they are)."""
    job_id = ctx.farm.run_schedule(name, request)
    click.echo(f"schedule {name}: run now as job {job_id}; the next turn starts it")


@schedule.command("set")
@click.argument("name")
@_when_recurring(None, None)
@click.option("--queue", metavar="NAME", help="The queue its occurrences wait in.")
@click.option("--payload", metavar="JSON", help="JSON given to the work; '' for none.")
@click.option("--method", type=click.Choice(["GET", "POST"], case_sensitive=False), help="HTTP work only.")
@click.argument("executor", type=click.Choice(["http", "python", "command"]), metavar="[EXECUTOR", required=False)
@click.argument("target", nargs=-1, metavar="TARGET...]")
@pass_ctx
def schedule_set(ctx: Context, /, name: str, executor: str | None, target: tuple[str, ...], **given: Any) -> None:
    """Change what is given of schedule NAME, e.g. `schedule set nightly --cron '0 4 * * *'` or `schedule set
    nightly http /backup`; the rest stays. A new recurrence starts at its next occurrence, none it missed runs;
    a paused schedule stays paused."""
    changes = {key: value for key, value in given.items() if value is not None}
    if executor is not None:
        changes |= dict(executor=executor, target=_target_of(executor, target))
    if not changes:
        raise click.UsageError(
            "nothing to change: give --cron, --tz, --every, --misfire, --grace, --queue, --payload, --method "
            "or EXECUTOR TARGET..."
        )
    _say_schedule(ctx.farm.edit_schedule(name, **changes))


@schedule.command("show")
@click.argument("name")
@click.option("--runs", type=click.IntRange(1, 1000), default=10, help="How many of its last occurrences to show.")
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def schedule_show(ctx: Context, name: str, runs: int, as_json: bool) -> None:
    """Schedule NAME, and its last runs: when each was due, how late it started, how it ended."""
    row, last = ctx.reader.get_schedule(name), ctx.reader.schedule_runs(name, runs)
    if as_json:
        return print_json({"schedule": row, "runs": last})
    _say_schedule(row)
    work = f"{row['executor']} {row['method'] + ' ' if row['executor'] == 'http' else ''}{row['target']}"
    click.echo(f"work: {work} in queue {row['queue']}, payload {row['payload'] or 'none'}")
    click.echo(f"misfire: {row['misfire']}, grace {row['grace']:g} s")
    print_table(
        ["job", "due (UTC)", "kind", "attempt", "machine", "started", "late", "outcome", "error"],
        [
            [
                r["job"],
                format_time(r["due"]),
                "run now" if r["manual"] else "scheduled",
                r["attempt"] or "-",
                machine_label(r["machine_name"], r["machine_id"]),
                format_time(r["started_at"]),
                "-" if r["late"] is None else f"{r['late'] * 1000:+.0f}ms",
                r["outcome"],
                (r["error"] or "")[:50],
            ]
            for r in last
        ],
    )


@cli.group()
def singleton() -> None:
    """Continuous work held by exactly one live machine, taken over when that machine dies."""


@singleton.command("add")
@click.argument("name")
@_executor
@_target
@_work_options
@pass_ctx
def singleton_add(ctx: Context, /, name: str, executor: str, target: tuple[str, ...], **work: Any) -> None:
    """Keep EXECUTOR TARGET... running on one machine, e.g. `singleton add feed python myapp.feed:poll`."""
    job_id = ctx.farm.singleton(name, _spec(executor, target, **work))
    click.echo(f"singleton {name} is job {job_id}; the next turn-holder with room starts it")


@singleton.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def singleton_list(ctx: Context, as_json: bool) -> None:
    """Every singleton, the machine holding it and since when."""
    rows = ctx.reader.list_singletons()
    if as_json:
        return print_json({"singletons": rows})
    print_table(
        ["name", "job", "state", "machine", "fence", "since", "work", "last error"],
        [
            [
                r["name"],
                r["id"],
                r["state"],
                machine_label(r["owner_name"], r["owner"]),
                r["fence"],
                format_time(r["started_at"]),
                f"{r['executor']} {r['target']}"[:50],
                (r["last_error"] or "")[:50],
            ]
            for r in rows
        ],
    )


@singleton.command("remove")
@click.argument("name")
@pass_ctx
def singleton_remove(ctx: Context, name: str) -> None:
    """Stop a singleton for good (its machine stops it within a heartbeat)."""
    click.echo(f"singleton {name}: {ctx.farm.remove_singleton(name)}")


@cli.command()
@click.argument("key")
@click.argument("instance")
@_executor
@_target
@_work_options
@click.option("--wait", "wait", is_flag=True, help="Wait for the result (ours, or the winner's if we lost).")
@click.option("--wait-timeout", type=Seconds(min=0), help="Give up waiting after SECONDS.")
@pass_ctx
def grab(
    ctx: Context,
    /,
    key: str,
    instance: str,
    executor: str,
    target: tuple[str, ...],
    wait: bool,
    wait_timeout: float | None,
    **work: Any,
) -> None:
    """Do EXECUTOR TARGET... once for KEY and INSTANCE (e.g. Report-26 2026-11-22).

    A second grab of the same pair is refused, naming the winner and whether it finished (exit code 3),
    or with --wait, waits for the winner's result. With --wait the exit code is 0 only if the work succeeded.
    """
    from .grabs import AlreadyTaken

    try:
        job_id = ctx.farm.grab(key, instance, _spec(executor, target, **work))
        click.echo(f"grabbed {key}@{instance}: job {job_id}")
    except AlreadyTaken as taken:
        click.echo(str(taken))
        if not wait:
            raise click.exceptions.Exit(3) from None
        job_id = taken.holder.job["id"]
    if wait:
        holder = ctx.farm.wait_grab(job_id, wait_timeout)
        click.echo(f"job {job_id} {holder.status()}")
        if holder.output:
            click.echo(holder.output.rstrip("\n"))
        raise click.exceptions.Exit(0 if holder.job["state"] == JobState.SUCCEEDED else 1)


def _parse_time(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise click.BadParameter(
            f"{echoed(text)} is not a time: use ISO 8601 (2026-11-22T18:00:00+00:00) or epoch seconds",
            param_hint="--at",
        ) from None


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def status(ctx: Context, as_json: bool) -> None:
    """Machines with their state and clock offsets, and job counts."""
    report = ctx.reader.status()
    if as_json:
        return print_json(report)
    click.echo(f"database {report['database']}  now {format_time(report['db_now'])}")
    print_table(
        ["id", "name", "host", "status", "queues", "offset", "±", "rtt", "seen", "cap", "run", "done", "fail"],
        [
            [
                m["id"],
                m["name"],
                m["host"],
                m["status"],
                str(Served(m["queues"], tuple(m["caps"].items()))) or "all",
                _ms(m["clock_offset"], signed=True),
                _ms(m["error_bound"]),
                _ms(m["rtt"]),
                f"{report['db_now'] - m['last_seen']:.1f}s ago",
                m["capacity"],
                m["running"],
                m["done_count"],
                m["failed_count"],
            ]
            for m in report["machines"]
        ],
    )
    click.echo("jobs: " + ", ".join(f"{n} {state}" for state, n in report["jobs"].items()))


def _ms(seconds: float | None, signed: bool = False) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:+.1f}ms" if signed else f"{seconds * 1000:.1f}ms"


def _filter_options(command: _Command) -> _Command:
    """The options of a JobFilter (rules/search.py): `jobs` lists what they pick, `retry`, `cancel` and `delete`
    act on it."""
    for option in reversed(
        (
            click.option("--state", type=click.Choice([state.value for state in JobState]), help="Jobs in this state."),
            click.option("--queue", metavar="NAME", help="Jobs of this queue."),
            click.option("--target", help="Jobs with exactly this target (a path, MODULE:FUNCTION or program)."),
            click.option(
                "--older-than",
                type=Seconds(min=0),
                metavar="SECONDS",
                help="Jobs that finished (or, unfinished, were enqueued) more than SECONDS ago.",
            ),
            click.option(
                "--search",
                metavar="EXPR",
                help="Jobs the search matches: field=value, field.sub=value (in the JSON payload), queue:NAME, "
                "key:KEY, or words the id, target, machine or error contains.",
            ),
        )
    ):
        command = option(command)
    return command


@cli.command()
@_filter_options
@click.option("--limit", type=click.IntRange(1, 100_000), default=50)
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def jobs(ctx: Context, /, limit: int, as_json: bool, **where: Any) -> None:
    """Recent jobs, newest first (those the filter picks, if given)."""
    rows = ctx.reader.find_jobs(JobFilter(**where), limit)
    if as_json:
        return print_json({"jobs": rows})
    print_table(
        [
            "id",
            "state",
            "executor",
            "target",
            "schedule",
            "owner",
            "attempt",
            "fence",
            "run at",
            "finished",
            "progress",
            "error",
        ],
        [
            [
                j["id"],
                j["state"],
                j["executor"],
                j["target"],
                made_by(j) or "-",
                machine_label(j["owner_name"], j["owner"]),
                f"{j['attempts']}/{j['max_attempts']}",
                j["fence"],
                format_time(j["run_at"]),
                format_time(j["finished_at"]),
                progress_text(j["progress"], j["progress_message"])[:40] if j["state"] == JobState.RUNNING else "",
                (j["last_error"] or "")[:60],
            ]
            for j in rows
        ],
    )


@cli.command()
@click.argument("job_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def job(ctx: Context, job_id: int, as_json: bool) -> None:
    """One job with every attempt."""
    record = ctx.reader.job(job_id)
    if as_json:
        return print_json(record)
    for key, value in record.items():
        if key == "owner":
            value = machine_label(record["owner_name"], value)
        if key == "after":
            value = ", ".join(f"{p['step'] or p['id']} ({p['id']}, {p['state']})" for p in value) or "-"
        if key == "progress":
            value = progress_text(value, record["progress_message"])
        if key not in ("runs", "owner_name", "progress_message"):
            click.echo(f"{key:>16}: {format_time(value) if key.endswith(('_at', '_until')) else value}")
    print_table(
        ["attempt", "machine", "fence", "started", "finished", "outcome", "progress", "error", "output (end)"],
        [
            [
                r["attempt"],
                machine_label(r["machine_name"], r["machine_id"]),
                r["fence"],
                format_time(r["started_at"]),
                format_time(r["finished_at"]),
                r["outcome"],
                progress_text(r["progress"], r["progress_message"])[:40],
                r["error"] or "",
                _last_line(r["output"]),
            ]
            for r in reversed(record["runs"])
        ],
    )


def _last_line(output: str | None) -> str:
    lines = (output or "").strip().splitlines()
    return lines[-1][-60:] if lines else ""


@cli.command()
@click.option("--since", type=Seconds(min=0), default=60.0, help="Seconds of history.")
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def turns(ctx: Context, since: float, as_json: bool) -> None:
    """The turn log: which machine polled in which slot."""
    rows = ctx.reader.turns(since)
    if as_json:
        return print_json({"turns": rows})
    print_table(
        ["slot", "machine", "taken at", "claimed", "backlog"],
        [
            [
                t["slot"],
                machine_label(t["machine_name"], t["machine_id"]),
                format_time(t["taken_at"]),
                t["claimed"],
                "yes" if t["backlog"] else "",
            ]
            for t in rows
        ],
    )


@cli.command()
@click.option(
    "--since", type=Seconds(min=0, min_open=True), default=3600.0, help="Seconds of history (default: an hour)."
)
@click.option("--queue", "queue_name", metavar="NAME", help="Only this queue.")
@click.option("--step", type=click.IntRange(60), default=60, help="Seconds per row: 60, 300, 3600...")
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def stats(ctx: Context, since: float, queue_name: str | None, step: int, as_json: bool) -> None:
    """The farm's history per queue: jobs enqueued, started, ended by outcome, waiting, and run durations."""
    rows = ctx.reader.stats(since, step=step, queue=queue_name)
    if as_json:
        return print_json({"stats": rows})
    print_table(
        ["at", "queue", *HISTORY_COUNTS, "waiting", "running", "p50", "p95"],
        [
            [format_time(r["at"])[:16], r["queue"], *(r[n] for n in HISTORY_COUNTS)]
            + [_or_dash(r["waiting"]), _or_dash(r["running"]), _seconds(r["p50"]), _seconds(r["p95"])]
            for r in rows
        ],
    )


@cli.command()
@click.option(
    "--since", type=Seconds(min=0, min_open=True), default=86400.0, help="Seconds of the log (default: a day)."
)
@click.option("--kind", metavar="KIND", help="Only this kind (machine.dead), or family (machine, queue, schedule...).")
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def events(ctx: Context, since: float, kind: str | None, as_json: bool) -> None:
    """The farm's log: what happened to machines, queues and schedules, and who did it."""
    rows = ctx.reader.events(since, kind=kind)
    if as_json:
        return print_json({"events": rows})
    print_table(
        ["at", "kind", "subject", "detail", "by"],
        [[format_time(e["at"]), e["kind"], e["subject"], e["detail"] or "", e["actor"] or ""] for e in rows],
    )


def _or_dash(value: object) -> object:
    return "-" if value is None else value


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}s"


class QueueName(click.ParamType[str]):
    """A queue name, checked as the API checks it, refused in click's words for an argument."""

    name = "queue name"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return check_name(value)
        except QPError as error:
            self.fail(error.say(lambda _input: "name"), param, ctx)


@cli.group()
def queue() -> None:
    """Named queues: pause, resume, limit, rate and ordering policy, farm-wide."""


@queue.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def queue_list(ctx: Context, as_json: bool) -> None:
    """Every queue: waiting, running, limit, rate, order keys waiting, paused, the machines serving it."""
    infos = ctx.reader.queues()
    if as_json:
        return print_json({"queues": [asdict(q) | {"rate": q.rate and str(q.rate)} for q in infos]})
    print_table(
        ["queue", "waiting", "running", "limit", "rate", "keys waiting", "state", "on failure", "serving"],
        [
            [
                q.name,
                q.waiting,
                q.running,
                q.limit or "-",
                q.rate or "-",
                q.order_keys_waiting,
                "paused" if q.paused else "active",
                q.on_failure,
                ", ".join(q.serving) or "NOBODY",
            ]
            for q in infos
        ],
    )


def _queue_switch(word: str, text: str, said: str) -> click.Command:
    @queue.command(word, help=text)
    @click.argument("name", type=QueueName())
    @pass_ctx
    def command(ctx: Context, name: str) -> None:
        getattr(ctx.farm, f"{word}_queue")(name)
        click.echo(f"queue {name} {said}")

    return command


_queue_switch(
    "pause",
    "Start no more jobs of queue NAME anywhere (running ones finish) until resumed.",
    "paused: no new job of it starts from the next claim on; running ones finish",
)
_queue_switch("resume", "Let a paused queue's jobs start again.", "resumed")


@queue.command("set")
@click.argument("name", type=QueueName())
@click.option("--limit", type=int, help="At most N of its jobs running at once across the farm.")
@click.option("--no-limit", is_flag=True, help="Remove the limit.")
@click.option("--rate", metavar="N/UNIT", help="At most N starts per s, min or h across the farm, e.g. 10/s.")
@click.option("--no-rate", is_flag=True, help="Remove the rate.")
@click.option(
    "--on-failure",
    type=click.Choice([p.value for p in OnFailure]),
    help="A job of an order key that failed for good: block the key's later jobs until it is retried or "
    "cancelled, or skip it.",
)
@pass_ctx
def queue_set(
    ctx: Context, name: str, limit: int | None, no_limit: bool, rate: str | None, no_rate: bool, on_failure: str | None
) -> None:
    """Change queue NAME's farm-wide limit, rate or ordering policy (the rest stays as it is)."""
    for given, removed, option in ((limit, no_limit, "limit"), (rate, no_rate, "rate")):
        if given is not None and removed:
            raise click.UsageError(f"give --{option} or --no-{option}, not both")
    if limit is None and rate is None and on_failure is None and not (no_limit or no_rate):
        raise click.UsageError("nothing to change: give --limit, --rate, --on-failure, --no-limit or --no-rate")
    ctx.farm.set_queue(
        name,
        limit=None if no_limit else UNCHANGED if limit is None else limit,
        rate=None if no_rate else UNCHANGED if rate is None else rate,
        on_failure=UNCHANGED if on_failure is None else OnFailure(on_failure),
    )
    info = ctx.farm.queue(name)
    click.echo(f"queue {name}: limit {info.limit or 'none'}, rate {info.rate or 'none'}, on failure {info.on_failure}")


def _wish_command(wish: str, text: str) -> click.Command:
    @cli.command(wish, help=text)
    @click.argument("machine")
    @pass_ctx
    def command(ctx: Context, machine: str) -> None:
        row = ctx.farm.steer(machine, wish)
        click.echo(f"asked machine {row['id']} ({row['name']}) to {wish}; it applies this within one heartbeat")

    return command


_wish_command(Wish.PAUSE, "Take MACHINE (name or id) out of the turns; it keeps its running jobs.")
_wish_command(Wish.RESUME, "Put a paused MACHINE back into the turns.")
_wish_command(Wish.DRAIN, "Let MACHINE finish its jobs, then stop.")


def _cancel_one(farm: "Farm", job_id: int) -> str:
    return f"job {job_id}: {farm.cancel(job_id)}"


def _retry_one(farm: "Farm", job_id: int) -> str:
    if farm.retry(job_id) == JobState.WAITING:
        return f"job {job_id} waits again for its parents"
    return f"job {job_id} queued again"


def _delete_one(farm: "Farm", job_id: int) -> str:
    if farm.delete_jobs(JobFilter(ids=(job_id,))):
        return f"job {job_id} deleted"
    raise QPError(f"job {job_id} is {farm.job(job_id)['state']}; only finished jobs can be deleted (cancel it first)")


def _until_ctrl_c(stop: threading.Event, work: Callable[[], "Changed"]) -> "Changed":
    """Run `work` with Ctrl-C setting `stop` (it ends between two batches, and its count is exact); a second
    Ctrl-C interrupts it at once (the batch under way rolls back)."""

    def on_signal(signum: int, _frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, on_signal)
    try:
        return work()
    finally:
        signal.signal(signal.SIGINT, previous)


def _jobs(count: int) -> str:
    return f"{count} job{'' if count == 1 else 's'}"


def _bulk_command(action: str, done: str, one: Callable[["Farm", int], str], text: str) -> None:
    """`action` JOB_ID, or every job a filter picks (in batches: store/bulk.py); says how many it `done`."""

    @cli.command(action, help=text + " Give JOB_ID, or a filter (--all for every job) to act on all it picks.")
    @click.argument("job_id", type=JOB_ID, required=False, metavar="JOB_ID")
    @_filter_options
    @click.option("--all", "everything", is_flag=True, help="With no filter: every job the command can act on.")
    @pass_ctx
    def command(ctx: Context, /, job_id: int | None, everything: bool, **given: Any) -> None:
        where = JobFilter(**given)
        if job_id is not None:
            if everything or not where.is_empty():
                raise click.UsageError("give a job id or a filter, not both")
            return click.echo(one(ctx.farm, job_id))
        if where.is_empty() and not everything:
            raise click.UsageError(f"give a job id, a filter, or --all to {action} every job it can")
        stop = threading.Event()
        changed = _until_ctrl_c(stop, lambda: ctx.farm.act_on_jobs(action, where, everything=True, stop=stop.is_set))
        busy = changed.busy_said()  # rows another transaction held
        if stop.is_set():
            click.echo(f"stopped: {_jobs(changed)} {done} before Ctrl-C{busy}; the rest are untouched", err=True)
            sys.exit(130)
        click.echo(f"{_jobs(changed)} {done}{busy}")


_bulk_command(
    "cancel",
    "cancelled (running ones stop within a heartbeat)",
    _cancel_one,
    "Cancel queued jobs, and stop running ones (their owner stops each within a heartbeat).",
)
_bulk_command("retry", "queued again", _retry_one, "Queue failed or cancelled jobs again for one more attempt.")
_bulk_command("delete", "deleted", _delete_one, "Delete finished jobs (succeeded, failed, cancelled) with their runs.")


@cli.command()
@click.option("--nodes", type=click.IntRange(1, 8), default=3, help="Local node processes to start.")
@click.option("--seconds", type=Seconds(min=0), default=0, help="Stop after this long (0: until Ctrl-C).")
@click.option("--headless", is_flag=True, help="Print live status instead of opening the desktop app.")
@pass_ctx
def demo(ctx: Context, nodes: int, seconds: float, headless: bool) -> None:
    """A demo farm on this machine: local nodes at different clock skews, a web server, jobs flowing.

    Without --db it has a SQLite file of its own (demo.db beside the default farm.db), so a real node
    never runs the demo's work."""
    from .demo import run_demo

    url = ctx.url if ctx.chosen else default_url("demo.db")
    run_demo(url, nodes=nodes, seconds=seconds, headless=headless, fresh=not ctx.chosen)  # its own file: afresh


@cli.command(cls=NodeCommand)
@click.option("--observe", is_flag=True, help="Only watch the farm: run no node on this machine.")
@node_options
@click.option("--theme", type=click.Choice(["auto", "light", "dark"]), help="Colour scheme. Default: as last chosen.")
@click.pass_context
def gui(ctx: click.Context, observe: bool, options: NodeConfig, theme: str | None) -> None:
    """Open the desktop app: it runs this machine's node (unless --observe) and shows the whole farm live.

    Without --db, QP_DB or a db in the config file, the app asks for the database.
    """
    root = ctx.find_root()
    url = root.params.get("db") or _load_config(root.params.get("config")).get("db")
    args = to_argv(options) + (["--observe"] if observe else []) + (["--theme", theme] if theme else [])
    # The app is a separate package the core never imports: run it in place of this process. The URL
    # travels in the environment, so its password never shows in the process list.
    env = {k: v for k, v in os.environ.items() if k != "QP_DB"} | ({"QP_DB": url} if url else {}) | secret_env(options)
    os.execve(sys.executable, [sys.executable, "-m", "ui", *args], env)


def _show_envvars(command: click.Command) -> None:
    """Every option's help names its QP_* variable: QP_ENQUEUE_HTTP_PRIORITY is written nowhere else."""
    for param in command.params:
        if isinstance(param, click.Option) and param.expose_value:
            param.show_envvar = True
    for sub in getattr(command, "commands", {}).values():
        _show_envvars(sub)


@cli.group()
def workflow() -> None:
    """Workflows: graphs of named steps, enqueued in one call from the API (docs/api.md)."""


@workflow.command("show")
@click.argument("workflow_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def workflow_show(ctx: Context, workflow_id: int, as_json: bool) -> None:
    """A workflow's steps, each with its state and the steps it runs after."""
    flow = ctx.reader.workflow_info(workflow_id)
    if as_json:
        return print_json(flow)
    click.echo(_flow_line(flow))
    print_table(
        ["step", "job", "state", "after", "error"],
        [
            [s["name"], s["job_id"], s["state"], ", ".join(map(str, s["after"])) or "-", (s["last_error"] or "")[:60]]
            for s in flow["steps"]
        ],
    )


@cli.group()
def group() -> None:
    """Groups: many jobs enqueued as one from the API, with a callback once all have ended (docs/api.md)."""


@group.command("show")
@click.argument("group_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def group_show(ctx: Context, group_id: int, as_json: bool) -> None:
    """A group's progress (done / total), its jobs by state, those that failed, and its callback."""
    flow = ctx.reader.group_info(group_id)
    if as_json:
        return print_json(flow)
    click.echo(_flow_line(flow))
    progress = flow["progress"]
    click.echo("  " + ", ".join(f"{state} {progress[state]}" for state in JobState))
    if progress["failed_ids"]:
        click.echo(f"  failed or cancelled: {', '.join(map(str, progress['failed_ids']))}")
    callback = flow["callback"]
    click.echo(f"  callback: job {callback['id']}, {callback['state']}" if callback else "  callback: none")


def _flow_line(flow: dict[str, Any]) -> str:
    """'workflow 3 'nightly': 2/4 done'."""
    name = f" {echoed(flow['name'])}" if flow["name"] else ""
    return f"{flow['kind']} {flow['id']}{name}: {flow['progress']['done']}/{flow['progress']['total']} done"


_show_envvars(cli)


# Where to look for what was not found (errors.NotFound.what).
SEE = {
    "job": "see `queueprocessor jobs`",
    "machine": "see `queueprocessor status`",
    "schedule": "see `queueprocessor schedule list`",
    "queue": "see `queueprocessor queue list`",
    "singleton": "see `queueprocessor singleton list`",
    "farm": "or run `queueprocessor init-db`",
}


def in_cli_words(error: QPError) -> str:
    """The core words an error in the API's terms: here the inputs are options (--max-attempts for max_attempts),
    and what was not found comes with the command that lists what there is."""
    text = error.say(flag_of)
    if isinstance(error, NotFound) and error.what in SEE:
        text += (", " if error.what == "farm" else ": ") + SEE[error.what]
    return text


def _qp_variables() -> list[str]:
    return [value for name, value in os.environ.items() if name.startswith("QP_")]


def _cut_inputs(message: str, inputs: list[str]) -> str:
    """Click repeats a refused argument or QP_* value whole: cut each long one as every other error does."""
    for given in inputs:
        message = message.replace(repr(given), echoed(given)).replace(given, echoed(given, quote=False))
    return message


def main(argv: list[str] | None = None) -> None:
    """Entry point: one clear line for every error a user can cause."""
    ctx = None
    args = list(sys.argv[1:] if argv is None else argv)
    for arg in args:
        try:
            arg.encode()
        except UnicodeEncodeError:  # bytes that are not UTF-8 arrive as lone surrogates
            click.echo(f"error: argument {echoed(mask(arg))} is not valid UTF-8 text", err=True)
            sys.exit(2)
    try:
        ctx = cli.make_context("queueprocessor", args)
        with ctx:
            cli.invoke(ctx)
        sys.stdout.flush()  # a reader that left (`| head -1`) shows here, not at exit
    except BrokenPipeError:
        # As Python's documentation advises: nothing more can be written, and flushing at exit must not fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.exceptions.NoArgsIsHelpError as error:  # a command group alone: its help is the answer
        error.show()
        sys.exit(error.exit_code)
    except click.ClickException as error:
        # One line like every other error; a usage error names the help that explains the option.
        hint = f" (see `{error.ctx.command_path} --help`)" if isinstance(error, click.UsageError) and error.ctx else ""
        message = _cut_inputs(error.format_message(), [*args, *_qp_variables()])
        click.echo(f"error: {' '.join(message.split())}{hint}", err=True)
        sys.exit(error.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except QPError as error:
        click.echo(f"error: {in_cli_words(error)}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as error:
        click.echo(f"error: {_database_failure(error, ctx)}", err=True)
        sys.exit(1)


def _database_failure(error: Exception, ctx: click.Context | None) -> str:
    """A database error in one line; anything else goes on up. SQLAlchemy is loaded here, on the way out: if it
    was not loaded before, the error is not its own."""
    from sqlalchemy import exc

    from .store.database import describe_failure

    if isinstance(error, exc.DBAPIError):
        return str(describe_failure(error, ctx.obj.url if ctx is not None and isinstance(ctx.obj, Context) else ""))
    if isinstance(error, exc.SQLAlchemyError):
        return f"database problem: {mask(str(error).splitlines()[0])}"
    raise error


if __name__ == "__main__":
    main()
