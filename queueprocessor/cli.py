"""The `queueprocessor` command.

Options come from the command line, then QP_* environment variables, then the
TOML config file (`--config`, a `[node]`-style table per command and a
top-level `db`), then defaults. Every error a user can cause is one line on
stderr and a non-zero exit code, never a traceback.
"""

import json
import logging
import signal
import sys
import threading
import tomllib
from datetime import datetime

import click
from sqlalchemy import exc

from . import __version__
from .clock import SystemClock
from .database import default_url, describe_failure, mask
from .errors import ConfigError, QPError
from .farm import Farm
from .output import format_time, print_json, print_table

log = logging.getLogger("queueprocessor")


def _load_config(path: str | None) -> dict:
    if not path:
        return {}
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist: check the --config path or QP_CONFIG") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from None


def _check_config_keys(group: click.Group, config: dict, path: str, prefix: str = "") -> dict:
    """The config's tables become Click's default_map; unknown keys are refused, not ignored."""
    defaults = {}
    for key, value in config.items():
        if key == "db" and not prefix:
            continue
        command = group.commands.get(key)
        if command is None or not isinstance(value, dict):
            raise ConfigError(f"config file {path}: unknown key {prefix + key!r}: use 'db' or a table named after "
                              f"a command ({', '.join(sorted(group.commands))})")
        if isinstance(command, click.Group):
            defaults[key] = _check_config_keys(command, value, path, prefix=f"{prefix}{key}.")
            continue
        names = {p.name for p in command.params}
        for option in value:
            if option.replace("-", "_") not in names:
                raise ConfigError(f"config file {path}: [{prefix}{key}] has no option {option!r}: "
                                  f"see `queueprocessor {(prefix + key).replace('.', ' ')} --help`")
        defaults[key] = {k.replace("-", "_"): v for k, v in value.items()}
    return defaults


class Context:
    """Opens the farm lazily, so `--help` and bad options never touch the database."""

    def __init__(self, url: str):
        self.url = url
        self._farm: Farm | None = None

    @property
    def farm(self) -> Farm:
        if self._farm is None:
            self._farm = Farm(self.url)
        return self._farm

    def close(self) -> None:
        if self._farm is not None:
            self._farm.close()


@click.group(context_settings={"auto_envvar_prefix": "QP", "help_option_names": ["-h", "--help"],
                               "show_default": True})
@click.option("--db", envvar="QP_DB", metavar="URL",
              help="Farm database, e.g. postgresql://user:pw@host/farm. Default: a SQLite file in your data folder.")
@click.option("--config", envvar="QP_CONFIG", metavar="FILE", help="TOML file with defaults for any option.")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.version_option(__version__, prog_name="queueprocessor")
@click.pass_context
def cli(ctx: click.Context, db: str | None, config: str | None, verbose: int) -> None:
    """A farm of machines sharing one SQL database drains a job queue together."""
    settings = _load_config(config)
    ctx.default_map = _check_config_keys(cli, settings, config)
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctx.obj = Context(db or settings.get("db") or default_url())
    ctx.call_on_close(ctx.obj.close)


pass_ctx = click.make_pass_decorator(Context)


def _farm_timing_options(command):
    for name, kind, text in (
        ("misses", int, "Missed heartbeats after which a machine is dead."),
        ("heartbeat", float, "Seconds between check-ins."),
        ("period", float, "Seconds per turn slot (one queue poll per period for the whole farm)."),
    ):
        command = click.option(f"--{name}", type=kind, envvar=f"QP_{name.upper()}", help=text + " Farm-wide.")(command)
    return command


@cli.command("init-db")
@_farm_timing_options
@pass_ctx
def init_db(ctx: Context, period, heartbeat, misses) -> None:
    """Create the tables (a node also does this on first start)."""
    farm = ctx.farm
    settings = farm.settings(period=period, heartbeat=heartbeat, misses=misses)
    verb = "created" if farm.created else "is up to date"
    click.echo(f"schema {verb} in {farm.masked_url}; period {settings['period']:g} s, "
               f"heartbeat {settings['heartbeat']:g} s, dead after {settings['misses']:g} misses")


@cli.command()
@click.option("--name", envvar="QP_NAME", help="Machine name shown to operators. Default: host name.")
@click.option("--capacity", type=click.IntRange(min=1), default=4, envvar="QP_CAPACITY",
              help="Jobs this machine runs at once.")
@_farm_timing_options
@click.option("--http-base", default="http://localhost/", envvar="QP_HTTP_BASE",
              help="Base URL that HTTP job paths are relative to.")
@click.option("--clock-skew", type=float, default=0.0, envvar="QP_CLOCK_SKEW",
              help="Pretend this machine's clock is off by SECONDS (to see skew handled).")
@click.option("--turn-keep", type=float, default=86400.0, envvar="QP_TURN_KEEP",
              help="Seconds of turn history to keep.")
@pass_ctx
def node(ctx: Context, name, capacity, period, heartbeat, misses, http_base, clock_skew, turn_keep) -> None:
    """Run this machine's node until stopped (SIGTERM or Ctrl-C drains; a second Ctrl-C exits at once)."""
    logging.getLogger("queueprocessor").setLevel(min(logging.INFO, logging.getLogger().level))
    logging.getLogger().setLevel(min(logging.INFO, logging.getLogger().level))
    the_node = ctx.farm.node(name=name, capacity=capacity, period=period, heartbeat=heartbeat, misses=misses,
                             http_base=http_base, clock=SystemClock(clock_skew), turn_keep=turn_keep)
    run_until_signalled(the_node)


def run_until_signalled(the_node) -> None:
    """SIGTERM or the first SIGINT drains the node; a second SIGINT leaves at once."""
    stopping = threading.Event()

    def on_signal(signum, _frame):
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
    while not the_node.stopped.wait(0.2):
        pass


@cli.group()
def enqueue() -> None:
    """Add jobs to the queue."""


@enqueue.command("http")
@click.argument("path")
@click.option("--method", type=click.Choice(["GET", "POST"], case_sensitive=False), default="GET")
@click.option("--payload", metavar="JSON", help="JSON body (sent with POST).")
@click.option("--delay", type=click.FloatRange(min=0), default=0.0, help="Seconds from now (database time).")
@click.option("--at", "at", metavar="TIME", help="Run at an ISO 8601 time or epoch seconds.")
@click.option("--priority", type=int, default=0, help="Higher runs first.")
@click.option("--max-attempts", type=click.IntRange(min=1), default=3)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds before the run is stopped.")
@click.option("--count", type=click.IntRange(min=1, max=1_000_000), default=1, help="Enqueue this many copies.")
@click.option("--key", help="Unique key: a second job with the same key is refused.")
@pass_ctx
def enqueue_http(ctx: Context, path, method, payload, delay, at, priority, max_attempts, timeout, count, key):
    """Enqueue an HTTP GET/POST to PATH on each node's --http-base."""
    if at is not None and delay:
        raise click.UsageError("give --delay or --at, not both")
    ids = ctx.farm.enqueue_http(path, method=method, payload=payload, delay=delay, at=_parse_time(at),
                                priority=priority, max_attempts=max_attempts, timeout=timeout, count=count, key=key)
    click.echo(f"enqueued job {ids[0]}" if len(ids) == 1 else f"enqueued {len(ids)} jobs ({ids[0]}..{ids[-1]})")


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
        raise click.BadParameter(f"{text!r} is not a time: use ISO 8601 (2026-11-22T18:00:00+00:00) "
                                 "or epoch seconds", param_hint="--at") from None


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def status(ctx: Context, as_json: bool) -> None:
    """Machines with their state and clock offsets, and job counts."""
    report = ctx.farm.status()
    if as_json:
        return print_json(report)
    click.echo(f"database {report['database']}  now {format_time(report['db_now'])}")
    print_table(
        ["id", "name", "host", "status", "offset", "±", "rtt", "seen", "cap", "run", "done", "fail"],
        [[m["id"], m["name"], m["host"], m["status"],
          _ms(m["clock_offset"], signed=True), _ms(m["error_bound"]), _ms(m["rtt"]),
          f"{report['db_now'] - m['last_seen']:.1f}s ago", m["capacity"], m["running"], m["done_count"],
          m["failed_count"]] for m in report["machines"]],
    )
    click.echo("jobs: " + ", ".join(f"{n} {state}" for state, n in report["jobs"].items()))


def _ms(seconds: float | None, signed: bool = False) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:+.1f}ms" if signed else f"{seconds * 1000:.1f}ms"


@cli.command()
@click.option("--state", type=click.Choice(["queued", "running", "succeeded", "failed", "cancelled"]))
@click.option("--limit", type=click.IntRange(min=1), default=50)
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def jobs(ctx: Context, state, limit, as_json) -> None:
    """Recent jobs, newest first."""
    rows = ctx.farm.store.list_jobs(state, limit)
    if as_json:
        return print_json({"jobs": rows})
    print_table(
        ["id", "state", "executor", "target", "owner", "attempt", "fence", "run at", "finished", "error"],
        [[j["id"], j["state"], j["executor"], j["target"], j["owner"] or "-", f"{j['attempts']}/{j['max_attempts']}",
          j["fence"], format_time(j["run_at"]), format_time(j["finished_at"]), (j["last_error"] or "")[:60]]
         for j in rows],
    )


@cli.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def job(ctx: Context, job_id: int, as_json: bool) -> None:
    """One job with every attempt."""
    record = ctx.farm.store.get_job(job_id)
    record["runs"] = ctx.farm.store.list_runs(job_id=job_id)
    if as_json:
        return print_json(record)
    for key, value in record.items():
        if key != "runs":
            click.echo(f"{key:>16}: {format_time(value) if key.endswith(('_at', '_until')) else value}")
    print_table(["attempt", "machine", "fence", "started", "finished", "outcome", "error"],
                [[r["attempt"], r["machine_id"], r["fence"], format_time(r["started_at"]),
                  format_time(r["finished_at"]), r["outcome"], r["error"] or ""] for r in reversed(record["runs"])])


@cli.command()
@click.option("--since", type=click.FloatRange(min=0), default=60.0, help="Seconds of history.")
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def turns(ctx: Context, since: float, as_json: bool) -> None:
    """The turn log: which machine polled in which slot."""
    store = ctx.farm.store
    rows = store.read_turns(store.ask_time() - since)
    if as_json:
        return print_json({"turns": rows})
    print_table(["slot", "machine", "taken at", "claimed", "backlog"],
                [[t["slot"], t["machine_id"], format_time(t["taken_at"]), t["claimed"], "yes" if t["backlog"] else ""]
                 for t in rows])


def _wish_command(wish: str, text: str):
    @cli.command(wish, help=text)
    @click.argument("machine")
    @pass_ctx
    def command(ctx: Context, machine: str) -> None:
        row = ctx.farm.steer(machine, wish)
        click.echo(f"asked machine {row['id']} ({row['name']}) to {wish}; it applies this within one heartbeat")

    return command


_wish_command("pause", "Take MACHINE (name or id) out of the turns; it keeps its running jobs.")
_wish_command("resume", "Put a paused MACHINE back into the turns.")
_wish_command("drain", "Let MACHINE finish its jobs, then stop.")


@cli.command()
@click.argument("job_id", type=int)
@pass_ctx
def cancel(ctx: Context, job_id: int) -> None:
    """Cancel a queued job, or stop a running one (its owner stops it within a heartbeat)."""
    click.echo(f"job {job_id}: {ctx.farm.store.cancel(job_id)}")


@cli.command()
@click.argument("job_id", type=int)
@pass_ctx
def retry(ctx: Context, job_id: int) -> None:
    """Queue a failed or cancelled job again for one more attempt."""
    ctx.farm.store.retry(job_id)
    click.echo(f"job {job_id} queued again")


@cli.command()
@click.option("--nodes", type=click.IntRange(1, 8), default=3, help="Local node processes to start.")
@click.option("--seconds", type=click.FloatRange(min=0), default=0, help="Stop after this long (0: until Ctrl-C).")
@click.option("--headless", is_flag=True, help="Print live status instead of opening the desktop app.")
@pass_ctx
def demo(ctx: Context, nodes: int, seconds: float, headless: bool) -> None:
    """A demo farm on this machine: local nodes at different clock skews, a web server, jobs flowing."""
    from .demo import run_demo

    run_demo(ctx.url, nodes=nodes, seconds=seconds, headless=headless)


def main(argv: list[str] | None = None) -> None:
    """Entry point: one clear line for every error a user can cause."""
    ctx = None
    try:
        ctx = cli.make_context("queueprocessor", list(sys.argv[1:] if argv is None else argv))
        with ctx:
            cli.invoke(ctx)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except QPError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    except exc.DBAPIError as error:
        url = ctx.obj.url if ctx is not None and isinstance(ctx.obj, Context) else ""
        click.echo(f"error: {describe_failure(error, url)}", err=True)
        sys.exit(1)
    except exc.SQLAlchemyError as error:
        click.echo(f"error: database problem: {mask(str(error).splitlines()[0])}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
