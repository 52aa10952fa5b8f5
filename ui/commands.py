"""What an operator can do to the farm from the app, each one public `Farm` call.

Views and menus call these methods and never build a farm call themselves.
Each command hands `run` a label and a function of the farm that returns the
one-line message the status bar shows; `run` (Connection.act) runs it on the
worker thread, so the window never waits on the database, and an error comes
back as that command's failure.
"""

from collections.abc import Callable
from typing import Any

from queueprocessor import JobFilter, JobSpec
from queueprocessor.farm import Farm
from queueprocessor.rules.fairness import KeyUse
from queueprocessor.rules.output import format_time
from queueprocessor.rules.search import BulkAction
from queueprocessor.rules.states import Wish

Run = Callable[[str, Callable[[Farm], str]], None]
# What an enqueue whose key was held did (Enqueued.settled), said of the job holding it.
SETTLED = {
    "existing": "key {key} is held by job {job}: answered with it, nothing enqueued",
    "replaced": "key {key} is held by job {job}, waiting: its payload and time replaced",
    "debounced": "key {key} is held by job {job}, waiting: its time moved by the debounce",
}
Fetch = Callable[[str, Callable[[Farm], Any], Callable[[Any], None]], None]


class Commands:
    """The operator's commands; `run(label, call)` runs `call(farm)` off the GUI thread (Connection.act)."""

    def __init__(self, run: Run, fetch: Fetch | None = None):
        """`fetch(label, read, then)`: `read(farm)` on the worker, what it returns to `then` here (Connection.fetch)."""
        self.run = run
        self.fetch = fetch or (lambda _label, _read, _then: None)

    def read_history(self, span: float, step: int, then: Callable[[list[dict]], None]) -> None:
        """The farm's history per queue over the last `span` seconds in rows of `step` (Farm.stats), to `then`."""
        self.fetch("Read the queues' history", lambda farm: farm.stats(span, step=step), then)

    def read_queue_keys(self, name: str, then: Callable[[list[KeyUse]], None]) -> None:
        """The busiest fairness keys of queue `name` with their use (Farm.queue_keys), to `then`."""
        self.fetch(f"Read the keys of queue {name}", lambda farm: farm.queue_keys(name), then)

    def read_events(self, since: float, kind: str | None, then: Callable[[list[dict]], None]) -> None:
        """The farm's events of the last `since` seconds, of `kind` (a family; None: all) (Farm.events), to `then`."""
        self.fetch("Read the event log", lambda farm: farm.events(since, kind=kind), then)

    def steer(self, machine_id: int, name: str, wish: Wish) -> None:
        """Ask a machine to pause, resume or drain; the machine applies it itself."""

        def steer(farm: Farm) -> str:
            farm.steer(str(machine_id), wish)
            return f"asked {name} to {wish}; it applies this within one heartbeat"

        self.run(f"{wish.capitalize()} {name}", steer)

    def enqueue(self, spec: JobSpec, *, delay: float = 0.0, count: int = 1) -> None:
        """Queue `count` copies of `spec` (the enqueue dialog's `options`)."""

        def enqueue(farm: Farm) -> str:
            done = farm.submit(spec, delay=delay, count=count)
            ids = done.ids
            said = f"enqueued job {ids[0]}" if len(ids) == 1 else f"enqueued {len(ids)} jobs ({ids[0]}..{ids[-1]})"
            if done.settled is not None:  # its key was held: what became of the holder
                said = SETTLED[done.settled].format(job=ids[0], key=spec.key)
            # Accepted, but said: like `enqueue`'s warning, the Queues tab shows the queue as unserved too.
            return said if done.served else f"{said}; no live machine serves queue {spec.queue} yet: it waits"

        self.run("Enqueue", enqueue)

    def retry(self, job_id: int) -> None:
        def retry(farm: Farm) -> str:
            farm.retry(job_id)
            return "queued again"

        self.run(f"Retry job {job_id}", retry)

    def cancel(self, job_id: int) -> None:
        self.run(f"Cancel job {job_id}", lambda farm: farm.cancel(job_id))

    def act_on_jobs(self, action: BulkAction, ids: list[int]) -> None:
        """Retry, cancel or delete these jobs (the table's selection), those of them the action can change."""

        def act(farm: Farm) -> str:
            changed = farm.act_on_jobs(action, JobFilter(ids=tuple(ids)))
            return f"{changed} of {len(ids)} selected jobs changed"

        self.run(f"{action.capitalize()} {len(ids)} jobs", act)

    def pause_schedule(self, name: str, until: float | None = None) -> None:
        """Pause a schedule, for good or `until` an epoch time (then the farm resumes it itself)."""
        said = "" if until is None else f" until {format_time(until)} UTC"
        self.run(
            f"Pause schedule {name}{said}",
            lambda farm: f"paused{said} ({_waiting(farm.pause_schedule(name, until=until))})",
        )

    def resume_schedule(self, name: str) -> None:
        self.run(
            f"Resume schedule {name}",
            lambda farm: f"active, next at {format_time(farm.resume_schedule(name)['next_run'])} UTC",
        )

    def remove_schedule(self, name: str) -> None:
        self.run(f"Remove schedule {name}", lambda farm: f"removed ({_waiting(farm.remove_schedule(name))})")

    def run_schedule(self, name: str, request: str, then: Callable[[], None]) -> None:
        """Run a schedule once now. `request` keys it (Farm.run_schedule): sent again, it makes no second job.
        `then()` runs on the worker once the farm has answered, whatever it answered."""

        def run_now(farm: Farm) -> str:
            try:
                return f"run now as job {farm.run_schedule(name, request)}; the next turn starts it"
            finally:
                then()

        self.run(f"Run schedule {name} now", run_now)

    def edit_schedule(self, name: str, changes: dict) -> None:
        """`changes`: Farm.edit_schedule's keywords for what the operator changed (the schedule dialog's)."""

        def edit(farm: Farm) -> str:
            row = farm.edit_schedule(name, **changes)
            return "saved; paused" if row["paused"] else f"saved; next at {format_time(row['next_run'])} UTC"

        self.run(f"Edit schedule {name}", edit)

    def remove_singleton(self, name: str) -> None:
        self.run(f"Remove singleton {name}", lambda farm: farm.remove_singleton(name))

    def pause_queue(self, name: str) -> None:
        self.run(
            f"Pause queue {name}",
            _saying(
                lambda farm: farm.pause_queue(name),
                "paused: its running jobs finish, nothing new of it starts (within a heartbeat)",
            ),
        )

    def resume_queue(self, name: str) -> None:
        self.run(
            f"Resume queue {name}",
            _saying(lambda farm: farm.resume_queue(name), "resumed: its jobs start again (within a heartbeat)"),
        )

    def reset_breaker(self, name: str) -> None:
        self.run(
            f"Reset the breaker of queue {name}",
            _saying(lambda farm: farm.reset_breaker(name), "breaker closed: its jobs start at its configured rate"),
        )

    def set_queue(self, name: str, changes: dict) -> None:
        """`changes`: Farm.set_queue's keywords for what the operator changed (None lifts a limit or rate)."""

        def set_queue(farm: Farm) -> str:
            farm.set_queue(name, **changes)
            return ", ".join(f"{key.replace('_', ' ')} {_setting(value)}" for key, value in changes.items())

        self.run(f"Set queue {name}", set_queue)


def _saying(call: Callable[[Farm], None], message: str) -> Callable[[Farm], str]:
    """A farm call that returns nothing, as a command: it reports `message` once done."""

    def command(farm: Farm) -> str:
        call(farm)
        return message

    return command


def _setting(value: object) -> str:
    """A queue setting as the status bar says it: none, on, off or its text."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else str(value)


def _waiting(cancelled: int) -> str:
    return f"{cancelled} waiting occurrence{'' if cancelled == 1 else 's'} cancelled"
