"""What a dashboard shows: the farm's machines judged, whose turn comes next, its schedules' last and next
occurrences, and everything one poll reads (`Dashboard.read()`), composed from the read statements in
store/views.py.

The desktop app draws these, but they are plain data (lists of dicts, no Qt)
so the CLI, scripts and benchmarks can use them too.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from . import singletons
from .node.config import FarmTiming as FarmTiming  # what Dashboard takes: the app and benchmarks name it here
from .rules.errors import NotFound
from .rules.roster import machine_status, roster, slot_of, slot_owner
from .rules.schedules import Recurrence, settling
from .rules.states import SERVING, MachineState
from .store.stores import Store

_T = TypeVar("_T")
# read_schedules' memory: (name, cron, tz, every, next_run) -> (last occurrence, next one)
Occurrences = dict[tuple[Any, ...], tuple[float | None, float]]

# A machine whose clock estimate is this loose (as a share of the period) cannot
# place itself inside its slots reliably: operators should see it.
SYNC_SHARE = 0.1
# Stopped or dead machines drop off the dashboard after this long.
GONE_AFTER = 600.0
# A text search of the jobs scans the table when few jobs match (0.5-0.8 s for 500,000 jobs on PostgreSQL,
# bench/bench_gui.py): polls repeat it at most this share of the time, and show its last result in between.
SEARCH_SHARE = 0.1


def judge_machines(
    rows: list[dict[str, Any]], now: float, timing: FarmTiming, keep_gone: float = GONE_AFTER
) -> list[dict[str, Any]]:
    """Machines as an operator sees them: judged status, whose slot it is now, clock sync.

    Adds `status` (active, paused, draining, stopped, dead), `leader` (it owns
    the current slot) and `synced` (its clock estimate is tight enough to take
    turns); leaves out machines that stopped or died more than `keep_gone` ago.
    """
    liveness = timing.liveness()
    owner = slot_owner(roster(rows, now, liveness, timing.join_delay), slot_of(now, timing.period))
    judged = []
    for row in rows:
        status = machine_status(row, now, liveness)
        if status in (MachineState.STOPPED, MachineState.DEAD) and now - row["last_seen"] > keep_gone:
            continue
        bound = row["error_bound"]
        judged.append(
            row
            | {
                "status": status,
                "leader": row["id"] == owner,
                "synced": bound is not None and bound <= SYNC_SHARE * timing.period,
            }
        )
    return judged


def upcoming_slots(
    rows: list[dict[str, Any]], now: float, timing: FarmTiming, horizon: float
) -> list[tuple[int, int | None]]:
    """(slot, machine id) for the slots from now to `horizon` seconds ahead, under today's roster."""
    ids = roster(rows, now, timing.liveness(), timing.join_delay)
    first = slot_of(now, timing.period)
    last = slot_of(now + horizon, timing.period)
    return [(slot, slot_owner(ids, slot)) for slot in range(first, last + 1)] if ids else []


def read_schedules(
    store: Store, now: float, known: Occurrences | None = None, period: float = 0.0
) -> list[dict[str, Any]]:
    """Every schedule by name, with `recurrence` (as text), `next_at` (its next occurrence after `now`, None
    while paused) and its last occurrence: `last_at`, and that job's `last_job`, `last_state`, `last_machine`,
    `last_finished` and `last_error` (all None before its first occurrence; the job's fields None if that
    occurrence made no job, e.g. its misfire policy skipped it).

    The last occurrence is the last one before both `now` and the first not yet made into a job; its job is
    found by its unique key (name@occurrence), not by scanning the jobs. `known`, a dict kept between calls,
    keeps each schedule's occurrences until the next one comes, so a poll does not ask croniter again. `period`:
    the farm's: for two of them after its creation a schedule makes no occurrence (rules.schedules.settling).
    """
    rows = store.views.schedule_rows()
    known = {} if known is None else known
    fresh: Occurrences = {}
    by_key: dict[str, dict[str, Any]] = {}
    for row in rows:
        recurrence = Recurrence.of(row)
        what = (row["name"], row["cron"], row["tz"], row["every"], row["next_run"])
        last, upcoming = known.get(what) or (None, -math.inf)
        if now >= upcoming:
            upcoming = recurrence.after(max(now, row["created_at"] + settling(period)))
            last = recurrence.before(min(row["next_run"], upcoming))
        fresh[what] = (last, upcoming)
        row.update(
            recurrence=recurrence.describe(),
            next_at=None if row["paused"] else upcoming,
            last_at=last,
            last_job=None,
            last_state=None,
            last_machine=None,
            last_finished=None,
            last_error=None,
        )
        if last is not None:  # the key store/schedules.py gives each occurrence's job
            by_key[f"{row['name']}@{recurrence.label(last)}"] = row
    known.clear()
    known.update(fresh)
    for key, *job in store.views.jobs_by_key(list(by_key)):
        by_key[key].update(zip(("last_job", "last_state", "last_machine", "last_finished", "last_error"), job))
    for row in by_key.values():
        if row["last_job"] is None and row["last_at"] <= row["created_at"] + settling(period):
            row["last_at"] = None  # an occurrence from before the schedule's first
    return rows


class Paced:
    """A read whose result is kept until `share` of the time since it began went into it: a slow read is
    repeated less often (a 1 s read at share 0.1 every 10 s), a fast one at every call. Asking for
    something else (`what`) reads at once."""

    def __init__(self, clock: Callable[[], float], share: float):
        self.clock = clock
        self.share = share
        self._last: tuple[object, float, Any] | None = None  # (what, when to repeat, result)

    def read(self, what: object, read: Callable[[], _T]) -> _T:
        began = self.clock()
        if self._last is not None and self._last[0] == what and began < self._last[1]:
            repeated: _T = self._last[2]
            return repeated
        result = read()
        self._last = (what, began + (self.clock() - began) / self.share, result)
        return result


@dataclass
class Query:
    """What a dashboard wants to see; the GUI changes it as the user scrolls and filters."""

    since: float | None = None  # None: the last `span` seconds
    until: float | None = None
    span: float = 60.0
    ahead: float = 10.0
    jobs_state: str | None = None
    jobs_text: str | None = None  # only jobs whose id, target, machine name or error contains this
    jobs_queue: str | None = None  # only jobs of this queue
    jobs_limit: int = 500
    job_id: int | None = None
    flow_id: int | None = None  # a workflow or group to read with its steps (the app's graph of it)
    schedule: str | None = None  # the schedule whose definition and last runs to read (Dashboard.schedule)
    bucket: float = 5.0
    history: float = 600.0
    keep_gone: float = GONE_AFTER


class Dashboard:
    """Everything one poll reads, as one plain dict. Settings are read once: they never change.

    `clock` (seconds, monotonic) paces text searches, which scan the jobs (see SEARCH_SHARE).
    """

    def __init__(self, store: Store, timing: FarmTiming, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.timing = timing
        self._search = Paced(clock, SEARCH_SHARE)
        self._occurrences: Occurrences = {}  # read_schedules' memory
        self._schedule_runs = Paced(clock, SEARCH_SHARE)

    def jobs(self, query: Query) -> list[dict[str, Any]]:
        """The jobs list: the newest in the state asked for, or found by the text asked for."""
        text = query.jobs_text
        if not text:
            return self.store.jobs.newest(query.jobs_state, query.jobs_limit, queue=query.jobs_queue)
        return self._search.read(
            (text, query.jobs_state, query.jobs_limit, query.jobs_queue),
            lambda: self.store.views.find_jobs(text, query.jobs_state, query.jobs_limit, queue=query.jobs_queue),
        )

    def schedule(self, name: str | None) -> dict[str, Any] | None:
        """Schedule `name`'s row with its last runs (`runs`, ScheduleStore.last_runs), or None (none asked for, or
        gone). Its runs are found among its jobs by key and origin, a scan where few jobs are its own: polls
        repeat it at most SEARCH_SHARE of the time, as a text search."""
        if name is None:
            return None
        schedules = self.store.schedules
        try:
            return schedules.get(name) | {"runs": self._schedule_runs.read(name, lambda: schedules.last_runs(name))}
        except NotFound:
            return None

    def machines(self, keep_gone: float = GONE_AFTER) -> list[dict[str, Any]]:
        """The machines judged (see judge_machines) without the rest of a poll: what a status line shows."""
        now, _, rows = self.store.machines.read()
        return judge_machines(rows, now, self.timing, keep_gone)

    def read(self, query: Query) -> dict[str, Any]:
        store = self.store
        now, _, rows = store.machines.read()
        until = now if query.until is None else query.until
        since = until - query.span if query.since is None else query.since
        machines = judge_machines(rows, now, self.timing, query.keep_gone)
        job = None
        if query.job_id is not None:
            try:
                job = store.jobs.get(query.job_id) | {"runs": store.runs.read(job_id=query.job_id)}
                job |= store.lineage.links(query.job_id)
            except NotFound:  # deleted, or from another farm: nothing to show
                job = None
        return {
            "db_now": now,
            "since": since,
            "until": until,
            "period": self.timing.period,
            "machines": machines,
            "names": {row["id"]: row["name"] for row in rows},
            "leader": next((m["id"] for m in machines if m["leader"]), None),
            "turns": store.views.turns_between(since, until),
            "upcoming": upcoming_slots(rows, now, self.timing, query.ahead),
            "runs": store.views.runs_between(since, until),
            "job_counts": store.jobs.counts(),
            "throughput": store.views.throughput(now - query.history, now, query.bucket),
            "bucket": query.bucket,
            "history": query.history,
            "machine_throughput": store.views.machine_throughput(now - query.history, now),
            "jobs": store.lineage.with_waits(self.jobs(query)),
            "flow": store.lineage.flow(query.flow_id),
            "job": job,
            "schedule": self.schedule(query.schedule),
            "schedules": read_schedules(store, now, self._occurrences, self.timing.period),
            "singletons": singletons.list_all(store),
            "queues": store.queues.infos([m for m in machines if m["status"] in SERVING]),
        }
