"""`schedule`: recurring work, each occurrence run once on the farm, and how an operator steers it."""

import time
from collections.abc import Callable
from typing import Any

import click

from ..nodeoptions import Seconds
from ..rules.errors import echoed
from ..rules.kinds import KINDS, work_said
from ..rules.output import format_time, machine_label, print_json, print_table
from ..rules.queues import seconds_in
from ..rules.schedules import DEFAULT_GRACE, DEFAULT_MISFIRE, DEFAULT_OVERLAP, OVERLAP
from .context import Context, pass_ctx
from .options import EXECUTOR, TARGET, Decorated, Time, check_method, job_spec, target_of, work_options


class Duration(click.ParamType[float]):
    """Seconds, as a number or with a unit: 30, 30s, 5min, 2h (rules.queues.seconds_in)."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        seconds = value if isinstance(value, float) else seconds_in(value if value[-1:].isalpha() else _number(value))
        if seconds is None:
            self.fail(f"{echoed(value)} is not a duration: give seconds, or a number and s, min, h or d", param, ctx)
        return seconds


def _number(text: str) -> object:
    try:
        return float(text)
    except ValueError:
        return text


@click.group()
def schedule() -> None:
    """Recurring work: each occurrence runs once on the farm, however many machines see it."""


def _when_recurring(misfire: str | None, grace: float | None) -> Callable[[Decorated], Decorated]:
    """The options that say when a schedule recurs and what its runs may do, for `schedule add` (with the
    defaults) and `set` (None: keep)."""
    adding = misfire is not None

    def add_options(command: Decorated) -> Decorated:
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
                click.option(
                    "--overlap",
                    type=click.Choice(OVERLAP),
                    default=DEFAULT_OVERLAP if adding else None,
                    help="An occurrence due while a run goes on: run beside it (allow), skip it, keep one waiting "
                    "(buffer-one), or stop the run (cancel-previous). All but allow: never two runs at once.",
                ),
                click.option(
                    "--jitter",
                    type=Duration(),
                    default=0.0 if adding else None,
                    help="Delay each occurrence by up to this (e.g. 30s), the same on every machine.",
                ),
                click.option(
                    "--pause-on-failure",
                    type=click.IntRange(0),
                    metavar="N",
                    help="Pause it after N runs in a row failed for good (0 with `set`: never).",
                ),
            )
        ):
            command = option(command)
        return command

    return add_options


@schedule.command("add")
@click.argument("name")
@_when_recurring(DEFAULT_MISFIRE, DEFAULT_GRACE)
@EXECUTOR
@TARGET
@work_options
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
    overlap: str,
    jitter: float,
    pause_on_failure: int | None,
    executor: str,
    target: tuple[str, ...],
    **work: Any,
) -> None:
    """Run EXECUTOR TARGET... on a schedule, e.g. `schedule add nightly --cron '0 3 * * *' command -- backup`."""
    spec = job_spec(executor, target, **work)
    when: dict[str, Any] = dict(cron=cron, tz=tz, every=every, misfire=misfire, grace=grace)
    row = ctx.farm.schedule(name, spec, **when, overlap=overlap, jitter=jitter, pause_on_failure=pause_on_failure)
    _say_schedule(row)


def _say_schedule(row: dict[str, Any]) -> None:
    click.echo(f"schedule {row['name']}: {_recurrence(row)}, {_state(row)}")


def _state(row: dict[str, Any]) -> str:
    """Active with its next occurrence, or paused (until when, or why, if it paused itself)."""
    if not row["paused"]:
        return f"next at {format_time(row['next_run'])} UTC"
    if row["paused_until"] is not None:
        return f"paused until {format_time(row['paused_until'])} UTC"
    return f"paused ({row['paused_why']})" if row["paused_why"] else "paused"


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
    from ..rules.schedules import Recurrence

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
@click.option("--until", type=Time(), metavar="TIME", help="Resumed by the farm itself then (ISO 8601 or epoch s).")
@pass_ctx
def schedule_pause(ctx: Context, name: str, until: float | None) -> None:
    """Stop making occurrences until resumed (those in between are not run)."""
    cancelled = ctx.farm.pause_schedule(name, until)
    then = "" if until is None else f" until {format_time(until)} UTC"
    click.echo(f"schedule {name} paused{then} ({cancelled} waiting occurrence(s) cancelled)")


@schedule.command("backfill")
@click.argument("name")
@click.argument("start", type=Time(), metavar="FROM")
@click.argument("end", type=Time(), metavar="TO")
@pass_ctx
def schedule_backfill(ctx: Context, name: str, start: float, end: float) -> None:
    """Run each occurrence of schedule NAME from FROM to TO (a past range; ISO 8601 or epoch seconds) that has no
    job yet, once, due now: asked again, it makes none twice."""
    made = ctx.farm.backfill_schedule(name, start, end)
    click.echo(f"schedule {name}: {made} occurrence(s) from {format_time(start)} to {format_time(end)} UTC backfilled")


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
@click.argument("executor", type=click.Choice(list(KINDS)), metavar="[EXECUTOR", required=False)
@click.argument("target", nargs=-1, metavar="TARGET...]")
@pass_ctx
def schedule_set(ctx: Context, /, name: str, executor: str | None, target: tuple[str, ...], **given: Any) -> None:
    """Change what is given of schedule NAME, e.g. `schedule set nightly --cron '0 4 * * *'` or `schedule set
    nightly http /backup`; the rest stays. A new recurrence starts at its next occurrence, none it missed runs;
    a paused schedule stays paused."""
    changes = {key: value for key, value in given.items() if value is not None}
    if changes.get("pause_on_failure") == 0:
        changes["pause_on_failure"] = None  # never
    if executor is not None:
        check_method(executor, changes.get("method"))
        changes |= dict(executor=executor, target=target_of(executor, target))
    if not changes:
        raise click.UsageError(
            "nothing to change: give --cron, --tz, --every, --misfire, --grace, --overlap, --jitter, "
            "--pause-on-failure, --queue, --payload, --method or EXECUTOR TARGET..."
        )
    _say_schedule(ctx.farm.edit_schedule(name, **changes))


@schedule.command("show")
@click.argument("name")
@click.option("--runs", type=click.IntRange(1, 1000), default=10, help="How many of its last occurrences to show.")
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def schedule_show(ctx: Context, name: str, runs: int, as_json: bool) -> None:
    """Schedule NAME, its policies, its next five runs (jitter applied), and its last runs: when each was due, how
    late it started, how it ended (a skipped occurrence: cancelled, and why)."""
    from ..rules.schedules import upcoming_runs

    row, last = ctx.reader.get_schedule(name), ctx.reader.schedule_runs(name, runs)
    upcoming = upcoming_runs(row, time.time())  # shown, not acted on: this machine's clock will do
    if as_json:
        return print_json({"schedule": row, "upcoming": upcoming, "runs": last})
    _say_schedule(row)
    click.echo(f"work: {row['executor']} {work_said(row)} in queue {row['queue']}, payload {row['payload'] or 'none'}")
    click.echo(f"misfire: {row['misfire']}, grace {row['grace']:g} s")
    failures = "never" if row["pause_on_failure"] is None else f"after {row['pause_on_failure']} failed in a row"
    failed = f", {row['failures']} failed in a row now" if row["failures"] else ""
    click.echo(f"overlap: {row['overlap']}, jitter {row['jitter']:g} s, pause on failure: {failures}{failed}")
    click.echo("next runs (UTC): " + (", ".join(format_time(t) for t in upcoming) or "none while paused"))
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
                (r["error"] or "")[:72],
            ]
            for r in last
        ],
    )


COMMANDS = (schedule,)
