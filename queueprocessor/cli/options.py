"""What several commands share: the kinds of work, the options every kind takes, the arguments that name work
(`EXECUTOR TARGET...`), and the click types of a job id, a queue name and a time."""

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

import click

from ..nodeoptions import Seconds
from ..rules.errors import QPError, echoed
from ..rules.kinds import HTTP, KINDS, WorkKind
from ..rules.limits import MAX_ATTEMPTS
from ..rules.queues import DEFAULT, check_name

if TYPE_CHECKING:
    from ..rules.job import JobOptions, JobSpec

Decorated = TypeVar("Decorated", bound=Callable[..., Any])  # a command's function, given more options
JOB_ID = click.IntRange(1, 2**63 - 1)  # ids are 64-bit: a larger number names no job, and no driver takes it
JOB_ID.name = "integer"  # "'abc' is not a valid integer", not "... integer range"


def _method_option(kind: WorkKind | None) -> Callable[[Decorated], Decorated]:
    """--method: shown for HTTP work alone. `enqueue KIND` of another kind hides it and refuses it given; a command
    naming its EXECUTOR refuses it with another kind in job_spec."""
    if kind is None or kind is HTTP:
        return click.option(
            "--method",
            type=click.Choice(["GET", "POST"], case_sensitive=False),
            help="GET (the default) or POST." if kind else "HTTP work only: GET (the default) or POST.",
        )

    def refuse(_ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
        check_method(kind.name, value)

    return click.option("--method", hidden=True, expose_value=False, callback=refuse)


def check_method(executor: str, method: str | None) -> None:
    """A method names how an HTTP job calls its target: any other kind of work refuses one, even GET."""
    if method is not None and executor != HTTP.name:
        raise click.UsageError(f"--method is for http work only: {executor} work takes no method")


def work_options(command: Decorated, kind: WorkKind | None = None) -> Decorated:
    """What work takes besides its target: of one `kind` (enqueue KIND), or of every kind (schedule, singleton,
    grab: --method is refused there with another kind)."""
    for option in reversed(
        (
            _method_option(kind),
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


EXECUTOR = click.argument("executor", type=click.Choice(list(KINDS)), metavar="EXECUTOR")
TARGET = click.argument("target", nargs=-1, required=True)


def job_spec(executor: str, words: Sequence[str], *, payload: str | None, **options: Unpack["JobOptions"]) -> "JobSpec":
    """A JobSpec from `EXECUTOR TARGET...` on the command line, with the options work_options gave."""
    from ..rules.job import work_spec

    check_method(executor, options.get("method"))
    return work_spec(executor, target_of(executor, words), payload=payload, **options)


def target_of(executor: str, words: Sequence[str]) -> str:
    """The target `EXECUTOR TARGET...` names on the command line: a command's argv as JSON."""
    kind = KINDS[executor]
    target = kind.target_of(words)
    if target is None:
        raise click.UsageError(f"{executor} work takes one target, e.g. {kind.example} (got {len(words)})")
    return target


class QueueName(click.ParamType[str]):
    """A queue name, checked as the API checks it, refused in click's words for an argument."""

    name = "queue name"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return check_name(value)
        except QPError as error:
            self.fail(error.say(lambda _input: "name"), param, ctx)


def parse_time(text: str, hint: str) -> float:
    """A time as epoch seconds, given as epoch seconds or ISO 8601 (without a zone: this machine's local time);
    one line naming `hint` if it is neither."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise click.BadParameter(
            f"{echoed(text)} is not a time: use ISO 8601 (2026-11-22T18:00:00+00:00) or epoch seconds", param_hint=hint
        ) from None


class Time(click.ParamType[float]):
    """An option's or argument's time (parse_time)."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        hint = param.get_error_hint(ctx) if param is not None and ctx is not None else "TIME"
        return parse_time(str(value), hint)
