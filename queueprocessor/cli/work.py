"""Work given to the farm now: `enqueue` (each kind of work), `grab` (keyed work done once) and `singleton`
(continuous work one live machine holds)."""

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from ..nodeoptions import Seconds
from ..rules.errors import echoed
from ..rules.keys import NAMED, OnConflict, key_terms
from ..rules.kinds import COMMAND, HTTP, PYTHON, WorkKind
from ..rules.output import format_time, machine_label, print_json, print_table
from ..rules.states import JobState
from .context import Context, pass_ctx
from .options import EXECUTOR, TARGET, Decorated, job_spec, parse_time, work_options

if TYPE_CHECKING:
    from ..rules.job import JobSpec


@click.group()
def enqueue() -> None:
    """Add jobs to the queue."""


def _job_ids(_ctx: click.Context, _param: click.Parameter, text: str | None) -> tuple[int, ...]:
    """--after 12,13: job ids, separated by commas. An empty list (an empty shell variable) names no job: refused,
    or the job would run at once instead of after the jobs meant."""
    if text is None:
        return ()
    if not text.strip():
        raise click.BadParameter("an empty list names no job: give job ids separated by commas, e.g. 12,13")
    try:
        return tuple(int(word) for word in text.split(","))
    except ValueError:
        raise click.BadParameter(
            f"{echoed(text)} is not a list of job ids: give them separated by commas, e.g. 12,13"
        ) from None


def _when_options(command: Decorated) -> Decorated:
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
                "--key-scope",
                type=click.Choice([str(scope) for scope in NAMED]),
                help="With --key: how long the job holds it: kept (while its row is; the default), waiting "
                "(until it starts), unfinished (until it ends).",
            ),
            click.option(
                "--key-until",
                metavar="TIME",
                help="With --key: held until the job ends and, if it succeeded, until TIME.",
            ),
            click.option(
                "--key-for",
                type=Seconds(min=0, min_open=True),
                help="With --key: held until the job ends and, if it succeeded, this many seconds more.",
            ),
            click.option(
                "--on-conflict",
                type=click.Choice([str(how) for how in OnConflict]),
                help="With --key, if another job holds it: reject (the default), existing (answer with that job), "
                "replace (give that waiting job this payload and time).",
            ),
            click.option(
                "--debounce",
                type=Seconds(min=0, min_open=True),
                help="With --key: due this many seconds after the last enqueue of the key; one job, the last payload.",
            ),
            click.option(
                "--max-delay",
                type=Seconds(min=0, min_open=True),
                help="With --debounce: never due later than this many seconds after the key's first enqueue.",
            ),
            click.option(
                "--after",
                metavar="IDS",
                callback=_job_ids,
                help="Run once these jobs (ids, e.g. 12,13) have succeeded; until then it waits.",
            ),
            click.option(
                "--after-ended", is_flag=True, help="With --after: run once they have ended, whatever the outcome."
            ),
            click.option(
                "--fair-key",
                metavar="KEY",
                help="Whose share of a fair queue it takes (e.g. a tenant), and whose limit per key it counts in.",
            ),
            click.option("--fair-weight", type=float, help="With --fair-key: that key's weight (default 1)."),
            click.option("--cost", type=int, help="Units of its key's limit it holds while it runs (default 1)."),
            click.option(
                "--traceparent",
                envvar="TRACEPARENT",
                metavar="W3C",
                help="The trace its runs join (W3C traceparent; default: $TRACEPARENT). docs/design.md §12.",
            ),
        )
    ):
        command = option(command)
    return command


def _enqueue(
    ctx: Context,
    spec: "JobSpec",
    *,
    delay: float,
    at: str | None,
    count: int,
    key: str | None,
    instance: str | None,
    key_until: str | None,
    **terms: Any,
) -> None:
    if at is not None and delay:
        raise click.UsageError("give --delay or --at, not both")
    if instance is not None and key is None:
        raise click.UsageError("--instance needs --key")
    if key is not None:
        from ..grabs import grab_key

        key = grab_key(key, instance) if instance is not None else key
    until = _parse_time(key_until, "--key-until")
    spec = replace(spec, key=key, terms=key_terms(key, key_until=until, **terms))
    done = ctx.farm.submit(spec, delay=delay, at=_parse_time(at, "--at"), count=count)
    ids = done.ids
    if done.settled is not None:
        click.echo(f"job {ids[0]} holds key {echoed(key)}: {SETTLED[done.settled]}")
        return
    click.echo(f"enqueued job {ids[0]}" if len(ids) == 1 else f"enqueued {len(ids)} jobs ({ids[0]}..{ids[-1]})")
    if not done.served:
        click.echo(
            f"warning: no live machine serves queue {echoed(spec.queue)} yet: its jobs wait until one does "
            "(node --queues)",
            err=True,
        )


def _enqueue_kind(kind: WorkKind, name: str, doc: str, **argument: Any) -> None:
    """`enqueue KIND`: work of one kind, its target given as the argument `name` (one word, or with `nargs=-1` an
    argv), with the options every kind takes."""

    def run(ctx: Context, /, delay: float, at: str | None, count: int, **work: Any) -> None:
        words = work.pop(name)
        terms = {option: work.pop(option) for option in TERMS}
        spec = job_spec(kind.name, words if kind.argv else [words], **work)
        _enqueue(ctx, spec, delay=delay, at=at, count=count, **terms)

    enqueue.command(kind.name, help=doc)(
        click.argument(name, **argument)(work_options(_when_options(pass_ctx(run)), kind))
    )


_enqueue_kind(
    HTTP, "path", "Enqueue an HTTP GET/POST to PATH on each node's --http-base (or a URL on an allowed host)."
)
_enqueue_kind(
    PYTHON,
    "target",
    "Enqueue a call of MODULE:FUNCTION(payload, context) on a node that allows the module.",
    metavar="MODULE:FUNCTION",
)
_enqueue_kind(
    COMMAND,
    "argv",
    "Enqueue a program run without a shell: `enqueue command -- backup --full` (exit code 0 is success).",
    nargs=-1,
    required=True,
)


# What `enqueue` says when the key was held (jobs.Enqueued.settled), and the options that say how.
SETTLED = {
    "existing": "nothing enqueued (--on-conflict existing)",
    "replaced": "it waits with this payload and time instead (--on-conflict replace)",
    "debounced": "its time moved (--debounce)",
}
TERMS = ("key", "instance", "key_scope", "key_until", "key_for", "on_conflict", "debounce", "max_delay")


def _parse_time(text: str | None, option: str) -> float | None:
    return None if text is None else parse_time(text, option)


@click.group()
def singleton() -> None:
    """Continuous work held by exactly one live machine, taken over when that machine dies."""


@singleton.command("add")
@click.argument("name")
@EXECUTOR
@TARGET
@work_options
@pass_ctx
def singleton_add(ctx: Context, /, name: str, executor: str, target: tuple[str, ...], **work: Any) -> None:
    """Keep EXECUTOR TARGET... running on one machine, e.g. `singleton add feed python myapp.feed:poll`."""
    job_id = ctx.farm.singleton(name, job_spec(executor, target, **work))
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


@click.command()
@click.argument("key")
@click.argument("instance")
@EXECUTOR
@TARGET
@work_options
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
    from ..grabs import AlreadyTaken

    try:
        job_id = ctx.farm.grab(key, instance, job_spec(executor, target, **work))
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


COMMANDS = (enqueue, grab, singleton)
