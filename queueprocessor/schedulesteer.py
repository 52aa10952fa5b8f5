"""Schedules as the Farm adds and steers them: add one, pause, resume or remove it, run it now, edit it, read its
last runs. What is given is checked as `schedule add` checks it (the recurrence by rules.schedules, the work by
rules.job and the live machines' allow-lists); the statements are store.schedules' (the run-now key, the guarded
edit, the runs read): docs/design.md §6.
"""

import json
import uuid
from collections.abc import Callable
from typing import Any, TypedDict, Unpack

from . import grabs
from .machines import Machines
from .rules.errors import BadJobInput
from .rules.job import JobSpec, work_spec
from .rules.kinds import HTTP
from .rules.limits import MAX_INT, MAX_WAIT
from .rules.queues import UNCHANGED
from .rules.schedules import Recurrence, check_overlap, check_policy, edited
from .store.schedules import MADE_WITH, POLICY, RECURRENCE, WORK
from .store.stores import Store
from .timing import SharedTiming


class SchedulePolicy(TypedDict, total=False):
    """How a schedule treats its occurrences (Farm.schedule; each left out takes its default, docs/design.md §6):
    `misfire` (skip, once, all; default once) and `grace` (seconds, 3600) for those the farm noticed late; `overlap`
    (allow, the default, skip, buffer-one, cancel-previous) for one that falls due while a run goes on: all but
    allow never let two runs be at once; `jitter`: seconds of a delay fixed per occurrence by a hash of its key (0);
    `pause_on_failure`: pause after that many runs in a row failed for good (None: never)."""

    misfire: str
    grace: float
    overlap: str
    jitter: float
    pause_on_failure: int | None


class ScheduleChanges(TypedDict, total=False):
    """What Farm.edit_schedule may change of a schedule: its recurrence, its misfire, overlap and failure policies,
    its jitter, and its work."""

    cron: str | None
    tz: str | None
    every: float | None
    misfire: str
    grace: float
    overlap: str
    jitter: float
    pause_on_failure: int | None
    executor: str
    target: str | list[str]
    method: str
    payload: str | None
    queue: str


def within_reach(recurrence: Recurrence) -> Recurrence:
    """A recurrence whose interval the farm can wait out."""
    if recurrence.every is not None and recurrence.every > MAX_WAIT:
        raise BadJobInput.out_of("every", recurrence.every, f"at most {MAX_WAIT:.0f} seconds, ten years")
    return recurrence


def _checked_work(
    row: dict[str, Any], given: dict[str, Any], check_allowed: Callable[[JobSpec], object]
) -> dict[str, Any]:
    """The work columns an edit gives (`given`, UNCHANGED where it keeps the row's), checked as new work is."""
    if given["executor"] is not UNCHANGED and given["target"] is UNCHANGED:
        raise BadJobInput("give {0} with {1}: what a target means depends on its executor", "target", "executor")
    if isinstance(given["target"], list | tuple):
        given["target"] = json.dumps(list(given["target"]))
    work = {key: row[key] if value is UNCHANGED else value for key, value in given.items()}
    if given["method"] is UNCHANGED and work["executor"] != HTTP.name:
        # a method kept from HTTP work, or stored before work_spec refused one for other work: the default again
        work["method"] = "GET"
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
    """The schedules of one farm: each call takes the farm's timing as it is when called (how far ahead a
    schedule's occurrences are made)."""

    def __init__(self, store: Store, shared: SharedTiming, machines: Machines):
        self._schedules = store.schedules
        self._shared = shared
        self._machines = machines

    def _ahead(self) -> dict[str, Any]:
        timing = self._shared.timing()
        return dict(ahead=timing.schedule_ahead, period=timing.period)

    def add(self, name: str, spec: JobSpec, recurrence: Recurrence, **policy: Unpack[SchedulePolicy]) -> dict[str, Any]:
        recurrence = within_reach(recurrence)
        self._machines.allowing(spec)
        return self._schedules.add(name, recurrence, grabs.signed(spec), **policy, **self._ahead())

    def resume(self, name: str) -> dict[str, Any]:
        return self._schedules.resume(name, **self._ahead())

    def pause(self, name: str, until: float | None) -> int:
        return self._schedules.pause(name, until)

    def backfill(self, name: str, start: float, end: float) -> int:
        return self._schedules.backfill(name, start, end)

    def remove(self, name: str) -> int:
        return self._schedules.remove(name)

    def all(self) -> list[dict[str, Any]]:
        return self._schedules.all()

    def get(self, name: str) -> dict[str, Any]:
        return self._schedules.get(name)

    def run_now(self, name: str, request: str | None) -> int:
        return self._schedules.run_now(name, request or uuid.uuid4().hex)

    def edit(self, name: str, given: ScheduleChanges) -> dict[str, Any]:
        """Change what is given (a key left out, or UNCHANGED: keep it), as Farm.edit_schedule says."""
        unknown = sorted(set(given) - {*RECURRENCE, *POLICY, *MADE_WITH, *WORK})
        if unknown:
            raise TypeError(f"edit_schedule() got an unexpected keyword argument {unknown[0]!r}")
        when = {key: given.get(key, UNCHANGED) for key in (*RECURRENCE, *POLICY, *MADE_WITH)}
        work = {key: given.get(key, UNCHANGED) for key in WORK}
        row = self._schedules.get(name)
        changes: dict[str, Any] = {}
        if not all(when[key] is UNCHANGED for key in RECURRENCE):
            recurrence = within_reach(edited(row, cron=when["cron"], tz=when["tz"], every=when["every"]))
            changes |= dict(cron=recurrence.cron, tz=recurrence.tz, every=recurrence.every)
        if when["misfire"] is not UNCHANGED or when["grace"] is not UNCHANGED:
            changes |= {key: row[key] if when[key] is UNCHANGED else when[key] for key in ("misfire", "grace")}
            check_policy(changes["misfire"], changes["grace"])
        overlapping = ("overlap", "jitter", "pause_on_failure")
        if any(when[key] is not UNCHANGED for key in overlapping):
            changes |= {key: row[key] if when[key] is UNCHANGED else when[key] for key in overlapping}
            check_overlap(changes["overlap"], changes["jitter"], changes["pause_on_failure"])
        if any(value is not UNCHANGED for value in work.values()):
            changes |= _checked_work(row, work, self._machines.allowing)
        return self._schedules.edit(name, changes, **self._ahead())

    def runs(self, name: str, limit: int) -> list[dict[str, Any]]:
        if not 1 <= limit <= MAX_INT:
            raise BadJobInput.out_of("limit", limit, f"from 1 to {MAX_INT}")
        return self._schedules.last_runs(name, limit)
