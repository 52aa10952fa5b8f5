"""An operator steers a schedule through the Farm: pause, resume or remove it, run it now, edit it, read its
last runs.

Farm takes these methods from ScheduleSteering; they check what they are given as `schedule add` does (the
recurrence by rules.schedules, the work by rules.job) and leave the statements to store.schedules (the run-now
key, the guarded edit, the runs read): docs/design.md §6.
"""

import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .rules.errors import BadJobInput
from .rules.job import work_spec
from .rules.limits import MAX_INT, MAX_WAIT
from .rules.queues import UNCHANGED
from .rules.schedules import Recurrence, check_policy, edited

if TYPE_CHECKING:
    from .rules.job import JobSpec
    from .store.schedules import ScheduleStore


class SteeredFarm(Protocol):
    """What these methods need of the Farm they are part of."""

    _schedules: "ScheduleStore"

    def check_allowed(self, spec: "JobSpec") -> None: ...

    def _ahead(self) -> dict[str, Any]: ...


def within_reach(recurrence: Recurrence) -> Recurrence:
    """A recurrence whose interval the farm can wait out."""
    if recurrence.every is not None and recurrence.every > MAX_WAIT:
        raise BadJobInput.out_of("every", recurrence.every, f"at most {MAX_WAIT:.0f} seconds, ten years")
    return recurrence


def _checked_work(
    row: dict[str, Any], given: dict[str, Any], check_allowed: Callable[["JobSpec"], None]
) -> dict[str, Any]:
    """The work columns an edit gives (`given`, UNCHANGED where it keeps the row's), checked as new work is."""
    if given["executor"] is not UNCHANGED and given["target"] is UNCHANGED:
        raise BadJobInput("give {0} with {1}: what a target means depends on its executor", "target", "executor")
    if isinstance(given["target"], list | tuple):
        given["target"] = json.dumps(list(given["target"]))
    work = {key: row[key] if value is UNCHANGED else value for key, value in given.items()}
    spec = work_spec(
        work.pop("executor"),
        work.pop("target"),
        **work,
        priority=row["priority"],
        max_attempts=row["max_attempts"],
        timeout=row["timeout"],
        order_key=row["order_key"],
    )
    check_allowed(spec)
    return {key: getattr(spec, key) for key in given}


class ScheduleSteering:
    """The Farm's schedule steering (see the module docstring)."""

    def resume_schedule(self: "SteeredFarm", name: str) -> dict[str, Any]:
        """Start a paused schedule again from its next occurrence (those in the pause are not run)."""
        return self._schedules.resume(name, **self._ahead())

    def pause_schedule(self: "SteeredFarm", name: str) -> int:
        """Stop making occurrences until resumed; returns how many waiting ones were cancelled."""
        return self._schedules.pause(name)

    def remove_schedule(self: "SteeredFarm", name: str) -> int:
        """Delete a schedule; returns how many of its waiting occurrences were cancelled."""
        return self._schedules.remove(name)

    def list_schedules(self: "SteeredFarm") -> list[dict[str, Any]]:
        """Every schedule's row, by name."""
        return self._schedules.all()

    def get_schedule(self: "SteeredFarm", name: str) -> dict[str, Any]:
        return self._schedules.get(name)

    def run_schedule(self: "SteeredFarm", name: str, request: str | None = None) -> int:
        """Run a schedule once now, beside its regular occurrences (which stay as they are); returns the job's id.
        `request` keys it: the same request sent again (a retry, a second click, another machine) returns the
        same job instead of making another. Default: a new request each call. Its job's key says `run now`."""
        return self._schedules.run_now(name, request or uuid.uuid4().hex)

    def edit_schedule(
        self: "SteeredFarm",
        name: str,
        *,
        cron: Any = UNCHANGED,
        tz: Any = UNCHANGED,
        every: Any = UNCHANGED,
        misfire: Any = UNCHANGED,
        grace: Any = UNCHANGED,
        executor: Any = UNCHANGED,
        target: Any = UNCHANGED,
        method: Any = UNCHANGED,
        payload: Any = UNCHANGED,
        queue: Any = UNCHANGED,
    ) -> dict[str, Any]:
        """Change what is given of a schedule, checked as schedule() checks it; the rest stays. A new recurrence
        (cron, tz or every; see rules.schedules.edited) starts at its next occurrence more than two periods from now,
        with no burst of those it would have had; a paused schedule stays paused. `payload` is JSON text (None:
        none); a command's `target` may be its argv as a list. New work applies to the occurrences still waiting."""
        row = self._schedules.get(name)
        changes: dict[str, Any] = {}
        if not all(given is UNCHANGED for given in (cron, tz, every)):
            recurrence = within_reach(edited(row, cron=cron, tz=tz, every=every))
            changes |= dict(cron=recurrence.cron, tz=recurrence.tz, every=recurrence.every)
        if misfire is not UNCHANGED or grace is not UNCHANGED:
            changes |= dict(misfire=row["misfire"] if misfire is UNCHANGED else misfire)
            changes |= dict(grace=row["grace"] if grace is UNCHANGED else grace)
            check_policy(changes["misfire"], changes["grace"])
        work = dict(executor=executor, target=target, method=method, payload=payload, queue=queue)
        if any(value is not UNCHANGED for value in work.values()):
            changes |= _checked_work(row, work, self.check_allowed)
        return self._schedules.edit(name, changes, **self._ahead())

    def schedule_runs(self: "SteeredFarm", name: str, limit: int = 10) -> list[dict[str, Any]]:
        """A schedule's last `limit` occurrences that ran (or ended without running), newest first, as their runs:
        outcome, machine, start, due time, lateness (`late`: start minus due) and whether it was a run-now
        (`manual`). See store.schedules.ScheduleStore.last_runs."""
        if not 1 <= limit <= MAX_INT:
            raise BadJobInput.out_of("limit", limit, f"from 1 to {MAX_INT}")
        return self._schedules.last_runs(name, limit)
