"""The farm as a whole: its tables (`init-db`), its machines and their state (`status`, `pause`, `resume`,
`drain`), its queues (`queue`), and its past (`turns`, `stats`, `events`)."""

from dataclasses import asdict
from typing import Any

import click

from ..nodeoptions import Seconds, node_options
from ..rules.breaker import rate_text
from ..rules.output import format_time, machine_label, print_json, print_table
from ..rules.queues import OnFailure, QueueInfo, Served, keep_text
from ..rules.states import HISTORY_COUNTS, Wish
from .context import Context, pass_ctx
from .options import QueueName


@click.command("init-db")
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


@click.command()
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


@click.command()
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


@click.command()
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


@click.command()
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


@click.group()
def queue() -> None:
    """Named queues: pause, resume, limit, rate, ordering policy, retention, breaker and adaptive rate, farm-wide."""


@queue.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def queue_list(ctx: Context, as_json: bool) -> None:
    """Every queue: waiting, running, limit, rate (configured, and what its claims allow now), breaker (its
    state and failures counted), order keys waiting, paused, how long its finished jobs are kept, the machines
    serving it."""
    infos = ctx.reader.queues()
    if as_json:
        shown = [
            asdict(q) | {"rate": q.rate and str(q.rate), "key_rate": q.key_rate and str(q.key_rate)} for q in infos
        ]
        return print_json({"queues": shown})
    print_table(
        [
            "queue",
            "waiting",
            "running",
            "limit",
            "rate",
            "rate now",
            "breaker",
            "per key",
            "keys waiting",
            "state",
            "on failure",
            "keep",
            "serving",
        ],
        [
            [
                q.name,
                q.waiting,
                q.running,
                q.limit or "-",
                q.rate or "-",
                _rate_now(q),
                _breaker_text(q) if q.breaker else "-",
                _per_key(q),
                q.order_keys_waiting,
                "paused" if q.paused else "active",
                q.on_failure,
                "-" if q.keep is None else keep_text(q.keep),
                ", ".join(q.serving) or "NOBODY",
            ]
            for q in infos
        ],
    )


@queue.command("keys")
@click.argument("name", type=QueueName())
@click.option("--most", type=click.IntRange(min=1), default=10, show_default=True, help="How many keys to show.")
@click.option("--json", "as_json", is_flag=True, help="Print a stable JSON document.")
@pass_ctx
def queue_keys(ctx: Context, name: str, most: int, as_json: bool) -> None:
    """The busiest fairness keys of queue NAME: units running (job costs), jobs waiting, and, with a rate per key,
    the tokens left in each key's bucket."""
    keys = ctx.reader.queue_keys(name, most)
    if as_json:
        return print_json({"queue": name, "keys": [asdict(k) for k in keys]})
    info = ctx.reader.queue(name)
    print_table(
        ["key", "running", "waiting", "tokens"],
        [
            [k.key, _of(k.running, info.key_limit), k.waiting, "-" if k.tokens is None else f"{k.tokens:.1f}"]
            for k in keys
        ],
    )
    if not keys:
        click.echo(f"no job of queue {name} has a fairness key running or waiting")


def _of(used: int, limit: int | None) -> str:
    """`used` units, out of the limit per key if there is one ("2/3")."""
    return f"{used}/{limit}" if limit else str(used)


def _per_key(q: QueueInfo) -> str:
    """A queue's flow control per fairness key, in the `queue list` table: fair share, a limit, a rate."""
    said = ["fair"] if q.fair else []
    said += [f"at most {q.key_limit}"] if q.key_limit else []
    said += [str(q.key_rate)] if q.key_rate else []
    return ", ".join(said) or "-"


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
@click.option("--keep", metavar="TIME", help="Keep its finished jobs this long, e.g. 3d, 12h, 90min (or seconds).")
@click.option("--no-keep", is_flag=True, help="Keep its finished jobs as long as the farm's default (keep_jobs).")
@click.option(
    "--fair/--no-fair",
    default=None,
    help="Share its claims across the jobs' fairness keys by weight (--fair-key), or go by priority, then age.",
)
@click.option("--key-limit", type=int, help="At most N units (job costs) running at once per fairness key.")
@click.option("--no-key-limit", is_flag=True, help="Remove the limit per key.")
@click.option(
    "--key-rate", metavar="N/UNIT", help="At most N units (job costs) started per fairness key per s, min or h."
)
@click.option("--no-key-rate", is_flag=True, help="Remove the rate per key.")
@click.option(
    "--fair-from",
    metavar="SOURCE",
    help="Where a job enqueued without --fair-key takes its key: order_key, or payload.FIELD (e.g. payload.tenant).",
)
@click.option("--no-fair-from", is_flag=True, help="Jobs enqueued without a fairness key have none.")
@click.option("--breaker", metavar="N/TIME", help="Stop its claims after N failures within TIME, e.g. 5/60s.")
@click.option("--no-breaker", is_flag=True, help="Remove the breaker.")
@click.option("--cool-down", metavar="TIME", help="How long an open breaker waits before each canary (default 30s).")
@click.option(
    "--adaptive",
    metavar="N/UNIT",
    help="Throttled jobs (429, 503) lower its rate down to this floor, successes raise it back, e.g. 1/s.",
)
@click.option("--no-adaptive", is_flag=True, help="Keep its rate fixed.")
@pass_ctx
def queue_set(ctx: Context, /, name: str, **given: Any) -> None:
    """Change queue NAME's farm-wide limit, rate, ordering policy, retention, fair share, limit and rate per key, the
    source of keyless jobs' keys, breaker or adaptive rate (the rest stays as it is)."""
    settings: dict[str, Any] = {setting: given[setting] for setting in _PLAIN if given[setting] is not None}
    for setting in _REMOVABLE:
        option = setting.replace("_", "-")
        if given[setting] is not None and given[f"no_{setting}"]:
            raise click.UsageError(f"give --{option} or --no-{option}, not both")
        if given[f"no_{setting}"] or given[setting] is not None:
            settings[setting] = None if given[f"no_{setting}"] else given[setting]
    if not settings:
        named = ", ".join(f"--{s.replace('_', '-')}" for s in (*_REMOVABLE, *_PLAIN))
        raise click.UsageError(f"nothing to change: give {named}, or a --no- form of one")
    ctx.farm.set_queue(name, **settings)
    info = ctx.farm.queue(name)
    click.echo(
        f"queue {name}: limit {info.limit or 'none'}, rate {info.rate or 'none'}, on failure {info.on_failure}, "
        f"{'fair share by key' if info.fair else 'priority, then age'}, limit per key {info.key_limit or 'none'}, "
        f"rate per key {info.key_rate or 'none'}, keys from {info.fair_from or 'the jobs'}, "
        f"breaker {_breaker_text(info)}, adaptive "
        f"{'off' if info.adaptive_floor is None else 'floor ' + rate_text(info.adaptive_floor)}, "
        f"finished jobs kept {keep_text(info.keep)}"
    )


# `queue set`'s settings with a --no- form that removes them, and those without.
_REMOVABLE = ("limit", "rate", "keep", "key_limit", "key_rate", "fair_from", "breaker", "adaptive")
_PLAIN = ("on_failure", "fair", "cool_down")


@queue.command("reset-breaker")
@click.argument("name", type=QueueName())
@pass_ctx
def queue_reset_breaker(ctx: Context, name: str) -> None:
    """Close queue NAME's breaker now and give it its configured rate back."""
    ctx.farm.reset_breaker(name)
    info = ctx.farm.queue(name)
    click.echo(f"queue {name}: breaker {_breaker_text(info)}, rate {info.rate or 'none'}")


def _breaker_text(info: QueueInfo) -> str:
    """A queue's breaker as the CLI shows it: "5/60s closed (2 failures)", "none"."""
    if info.breaker is None:
        return "none"
    return f"{info.breaker} {info.breaker_state} ({info.failures} failures)"


def _rate_now(info: QueueInfo) -> str:
    """The rate its claims allow now, marked when lowered below the configured one."""
    if info.current_rate is None or info.rate is None:
        return "-"
    lowered = info.current_rate < info.rate.per_second * (1 - 1e-9)
    return rate_text(info.current_rate) + (" (adapted)" if lowered else "")


def _wish_command(wish: str, text: str) -> click.Command:
    @click.command(wish, help=text)
    @click.argument("machine")
    @pass_ctx
    def command(ctx: Context, machine: str) -> None:
        row = ctx.farm.steer(machine, wish)
        click.echo(f"asked machine {row['id']} ({row['name']}) to {wish}; it applies this within one heartbeat")

    return command


pause = _wish_command(Wish.PAUSE, "Take MACHINE (name or id) out of the turns; it keeps its running jobs.")
resume = _wish_command(Wish.RESUME, "Put a paused MACHINE back into the turns.")
drain = _wish_command(Wish.DRAIN, "Let MACHINE finish its jobs, then stop.")


COMMANDS = (init_db, status, turns, stats, events, queue, pause, resume, drain)
