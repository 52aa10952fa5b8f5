"""`schedule`: recurring work, each occurrence run once on the farm, and how an operator steers it."""

from collections.abc import Callable
from typing import Any

import click

from ..nodeoptions import Seconds
from ..rules.kinds import HTTP, KINDS
from ..rules.output import format_time, machine_label, print_json, print_table
from ..rules.schedules import DEFAULT_GRACE, DEFAULT_MISFIRE
from .context import Context, pass_ctx
from .options import EXECUTOR, TARGET, Decorated, job_spec, target_of, work_options


@click.group()
def schedule() -> None:
    """Recurring work: each occurrence runs once on the farm, however many machines see it."""


def _when_recurring(misfire: str | None, grace: float | None) -> Callable[[Decorated], Decorated]:
    """The options that say when a schedule recurs, for `schedule add` (with the defaults) and `set` (None: keep)."""

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
    executor: str,
    target: tuple[str, ...],
    **work: Any,
) -> None:
    """Run EXECUTOR TARGET... on a schedule, e.g. `schedule add nightly --cron '0 3 * * *' command -- backup`."""
    row = ctx.farm.schedule(
        name, job_spec(executor, target, **work), cron=cron, tz=tz, every=every, misfire=misfire, grace=grace
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
@click.argument("executor", type=click.Choice(list(KINDS)), metavar="[EXECUTOR", required=False)
@click.argument("target", nargs=-1, metavar="TARGET...]")
@pass_ctx
def schedule_set(ctx: Context, /, name: str, executor: str | None, target: tuple[str, ...], **given: Any) -> None:
    """Change what is given of schedule NAME, e.g. `schedule set nightly --cron '0 4 * * *'` or `schedule set
    nightly http /backup`; the rest stays. A new recurrence starts at its next occurrence, none it missed runs;
    a paused schedule stays paused."""
    changes = {key: value for key, value in given.items() if value is not None}
    if executor is not None:
        changes |= dict(executor=executor, target=target_of(executor, target))
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
    work = f"{row['executor']} {row['method'] + ' ' if row['executor'] == HTTP.name else ''}{row['target']}"
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


COMMANDS = (schedule,)
