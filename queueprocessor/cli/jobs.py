"""Jobs one by one or by a filter: `jobs` lists, `job` shows one, `cancel`, `retry` and `delete` act on one or on
all a filter picks; `workflow show` and `group show` show the jobs enqueued as one."""

import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from ..nodeoptions import Seconds
from ..rules.errors import QPError, echoed
from ..rules.output import format_time, machine_label, print_json, print_table, progress_text
from ..rules.schedules import made_by
from ..rules.search import JobFilter
from ..rules.states import JobState
from .context import Context, pass_ctx
from .options import JOB_ID, Decorated

if TYPE_CHECKING:
    from ..farm import Farm
    from ..store.bulk import Changed


def _filter_options(command: Decorated) -> Decorated:
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


@click.command()
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


@click.command()
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


def _bulk_command(action: str, done: str, one: Callable[["Farm", int], str], text: str) -> click.Command:
    """`action` JOB_ID, or every job a filter picks (in batches: store/bulk.py); says how many it `done`."""

    @click.command(action, help=text + " Give JOB_ID, or a filter (--all for every job) to act on all it picks.")
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

    return command


cancel = _bulk_command(
    "cancel",
    "cancelled (running ones stop within a heartbeat)",
    _cancel_one,
    "Cancel queued jobs, and stop running ones (their owner stops each within a heartbeat).",
)
retry = _bulk_command("retry", "queued again", _retry_one, "Queue failed or cancelled jobs again for one more attempt.")
delete = _bulk_command(
    "delete", "deleted", _delete_one, "Delete finished jobs (succeeded, failed, cancelled) with their runs."
)


@click.group()
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


@click.group()
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


COMMANDS = (jobs, job, cancel, retry, delete, workflow, group)
