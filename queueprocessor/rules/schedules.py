"""Recurring schedules as pure functions: when they recur, and which occurrences a turn makes jobs of.

A schedule recurs by a cron expression in a time zone (croniter does the
calendar) or at a fixed interval (occurrences at whole multiples of the
interval since the epoch, so every machine computes the same instants).
Each occurrence becomes a job keyed `name@occurrence`; the database's unique
key is what makes it run once however many machines see it (see
store/schedules.py for the statements).

Daylight saving: when clocks go forward, a time in the skipped hour runs at
the jump (croniter's rule, as Vixie cron does). When they go back, a wall
time that happens twice runs once, at its first passing, unless the
expression runs every hour (hour field `*`), whose cadence continues in real
time.

A schedule starts at its first occurrence more than two periods after it is added
or resumed (first_occurrence), so even its first is claimed ahead of its time, by a
node that has loaded what it needs.

Misfires: an occurrence made into a job more than one period after its time
was missed (the farm was down or too busy to take turns). One older than the
schedule's grace is dropped. Within the grace the policy decides: `skip`
drops the missed ones, `once` runs the newest of them once, `all` runs each.

Overlap (docs/design.md §6): `allow` (the default, as before) lets runs of a schedule overlap; under `skip`,
`buffer-one` and `cancel-previous` every job of the schedule carries an order key (its own, or `schedule:NAME`:
order_key_of), so the database never lets two of them run at once, and the turn-holder's pass applies the policy
to an occurrence that falls due while a run goes on (store/schedule_policy.py).

Jitter: an occurrence's job is due at its time plus a delay in [0, jitter) drawn from a hash of its key
(jitter_of), so every machine computes the same one; its key still names the occurrence's own time.

Run now: an operator's extra occurrence is keyed `name@run now REQUEST` (run_now_key), so one request makes
one job however often it is sent, and its key tells it from the regular occurrences in the history.
"""

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import BadJobInput, InvalidJob, echoed
from .queues import MAX_ORDER_KEY, UNCHANGED

MISFIRE = ("skip", "once", "all")
DEFAULT_MISFIRE = "once"  # a farm down over several occurrences runs one of them when it is back
DEFAULT_GRACE = 3600.0  # seconds an occurrence may be late and still run (misfire policies past it)
MIN_EVERY = 0.1  # seconds; finer than the turn clock is meaningless
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MAX_PER_PASS = 1000  # occurrences made into jobs per schedule per turn (the rest wait for the next turn)
PREVIEW = 5  # occurrences an edit shows before it is saved
RUN_NOW = "run now"  # what an operator's extra occurrence has in its key in place of its time
MAX_REQUEST = 64  # characters of a run-now request's key
OVERLAP = ("allow", "skip", "buffer-one", "cancel-previous")
DEFAULT_OVERLAP = "allow"  # runs may overlap, as before overlap policies existed
MAX_JITTER = 86400.0  # seconds: a day
MAX_PAUSE_ON_FAILURE = 1000  # failed runs in a row
MAX_BACKFILL = MAX_PER_PASS  # occurrences one backfill may make
# How the reason of an occurrence cancelled by its overlap policy begins (its policy next).
SKIPPED = "skipped: overlap="


@dataclass(frozen=True)
class Recurrence:
    """When a schedule recurs: a cron expression in a time zone, or every N seconds."""

    cron: str | None = None
    tz: str | None = None
    every: float | None = None

    @classmethod
    def parse(cls, cron: str | None = None, tz: str | None = None, every: float | None = None) -> "Recurrence":
        """Validate what a user typed; one clear line for anything wrong."""
        if (cron is None) == (every is None):
            raise BadJobInput("give a schedule either {0} EXPRESSION or {1} SECONDS", "cron", "every")
        if every is not None:
            if tz is not None:
                raise BadJobInput(
                    "{0} only applies to {1} schedules (an interval is the same in every zone)", "tz", "cron"
                )
            if not math.isfinite(every) or every < MIN_EVERY:
                raise BadJobInput.out_of("every", every, f"at least {MIN_EVERY:g} seconds")
            return cls(every=float(every))
        assert cron is not None  # exactly one of cron and every, checked first
        tz = tz or "UTC"
        cron = MACROS.get(cron.strip().lower(), cron.strip())
        try:
            ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidJob(f"unknown time zone {echoed(tz)}: use an IANA name such as Europe/Berlin or UTC") from None
        if len(cron.split()) not in (5, 6) or not _croniter().is_valid(cron):
            raise InvalidJob(
                f"malformed cron expression {echoed(cron)}: expected 5 fields (minute hour day month "
                "weekday), e.g. '30 2 * * *', or 6 with seconds last"
            )
        recurrence = cls(cron=cron, tz=tz)
        try:
            recurrence.after(datetime.now(UTC).timestamp())
        except ValueError:  # croniter's "failed to find next date", e.g. 30 February
            raise InvalidJob(f"cron expression {echoed(cron)} never matches a real date") from None
        return recurrence

    @classmethod
    def of(cls, schedule: Mapping[str, Any]) -> "Recurrence":
        """The recurrence of a stored schedule row."""
        return cls(cron=schedule["cron"], tz=schedule["tz"], every=schedule["every"])

    @classmethod
    def checked(cls, schedule: Mapping[str, Any]) -> "Recurrence":
        """The recurrence of a stored row, checked as a user's input is (InvalidJob if unusable): a row written
        by SQL, or by a machine whose croniter or time zone data accepted more, may not be usable here."""
        check_policy(schedule["misfire"], schedule["grace"])
        return cls.parse(schedule["cron"], schedule["tz"], schedule["every"])

    def describe(self) -> str:
        return f"every {self.every:g} s" if self.every is not None else f"cron '{self.cron}' {self.tz}"

    def after(self, t: float) -> float:
        """The first occurrence strictly after epoch second `t`."""
        if self.every is not None:
            n = math.floor(t / self.every) + 1
            # t / every rounds: make sure n * every is the first multiple strictly after t, or a schedule
            # could make the same occurrence again and again, or skip one.
            while (n - 1) * self.every > t:
                n -= 1
            while n * self.every <= t:
                n += 1
            return n * self.every
        cron, zone = self._cron()
        hourly = cron.split()[1] == "*"
        times = _croniter()(cron, datetime.fromtimestamp(t, zone))
        while True:
            when: datetime = times.get_next(datetime)
            if hourly or not _second_passing(when, zone):
                return when.timestamp()

    def before(self, t: float) -> float | None:
        """The last occurrence strictly before `t`, as the very float `Recurrence.after` makes (so it names the
        same job key); None if croniter finds none."""
        if self.every is not None:
            n = math.ceil(t / self.every) - 1
            while n * self.every >= t:
                n -= 1
            while (n + 1) * self.every < t:
                n += 1
            return n * self.every
        cron, zone = self._cron()
        earlier = _croniter()(cron, datetime.fromtimestamp(t, zone))
        for _ in range(3):  # the second passing of a wall time is no occurrence (see after): look further back
            occurrence = self.after(earlier.get_prev(float) - 0.001)
            if occurrence < t:
                while (following := self.after(occurrence)) < t:
                    occurrence = following
                return occurrence
        return None

    def upcoming(self, t: float, count: int = PREVIEW) -> list[float]:
        """The next `count` occurrences strictly after `t`: what an edit previews before it is saved."""
        times = [self.after(t)]
        while len(times) < count:
            times.append(self.after(times[-1]))
        return times

    def label(self, t: float) -> str:
        """How an occurrence is named in its job key: local time with its UTC offset, to the millisecond."""
        zone = UTC if self.every is not None else self._cron()[1]
        return datetime.fromtimestamp(t, zone).isoformat(timespec="milliseconds")

    def _cron(self) -> tuple[str, ZoneInfo]:
        """The cron expression and its zone: a recurrence without `every` has both (parse sees to it)."""
        assert self.cron is not None and self.tz is not None
        return self.cron, ZoneInfo(self.tz)


def edited(
    schedule: Mapping[str, Any], *, cron: Any = UNCHANGED, tz: Any = UNCHANGED, every: Any = UNCHANGED
) -> Recurrence:
    """The recurrence an edit of `schedule` (a stored row) asks for, checked as a new one is (Recurrence.parse).
    What is not given stays: a new cron keeps the row's zone, a new interval replaces a cron and its zone, and a
    zone alone moves the row's cron to it."""
    if cron is UNCHANGED and every is UNCHANGED:
        cron, every = schedule["cron"], schedule["every"]
    elif every is UNCHANGED:
        every = None
    elif cron is UNCHANGED:
        cron = None
    if tz is UNCHANGED:
        tz = schedule["tz"] if cron is not None else None
    return Recurrence.parse(cron, tz, every)


def _croniter() -> Any:
    """croniter, imported by the first cron schedule a process reads: with dateutil it is about 1 MB of a
    node's memory that a node with no cron schedule to make never needs (an idle node's memory is budgeted)."""
    from croniter import croniter

    return croniter


def _second_passing(when: datetime, zone: ZoneInfo) -> bool:
    """Is `when` the repeat of a wall time that clocks going back made happen twice?"""
    wall = when.replace(tzinfo=None)
    first, second = wall.replace(tzinfo=zone, fold=0), wall.replace(tzinfo=zone, fold=1)
    return first.utcoffset() != second.utcoffset() and when.utcoffset() == second.utcoffset()


@dataclass(frozen=True)
class Due:
    """What one turn does with a schedule: the occurrences to make jobs of, and where to resume."""

    occurrences: list[float]
    next_run: float


def plan(
    recurrence: Recurrence, next_run: float, now: float, *, ahead: float, period: float, misfire: str, grace: float
) -> Due:
    """The occurrences from `next_run` up to `now + ahead` that should become jobs (see the module's rules)."""
    occ = next_run
    if occ < now - grace:  # everything before the grace window is dropped whatever the policy
        occ = recurrence.after(now - grace)
    on_time: list[float] = []
    missed: list[float] = []
    while occ <= now + ahead and len(on_time) + len(missed) < MAX_PER_PASS:
        (missed if now - occ > period else on_time).append(occ)
        occ = recurrence.after(occ)
    if misfire == "skip":
        missed = []
    elif misfire == "once":
        missed = missed[-1:]
    return Due(missed + on_time, occ)


def first_occurrence(recurrence: Recurrence, now: float, period: float) -> float:
    """Where a schedule added (or resumed) at `now` starts: its first occurrence more than two periods away. A turn
    claims what falls due before the next turn, so an occurrence is claimed by the turn a period before it and
    starts at its time; one due sooner could not be. Each node loads what its work needs (an HTTP client, a Python
    module: see Executor.warm) from the heartbeat that shows it a new schedule (node/warmup.py): the second
    period gives that load a period or more, which it takes on a loaded machine, before the first is claimed."""
    return recurrence.after(now + settling(period))


def settling(period: float) -> float:
    """How long after it is added or resumed a schedule makes no occurrence (see first_occurrence)."""
    return 2 * period


def ahead_of(period: float, heartbeat: float) -> float:
    """How early occurrences become jobs: a lost turn or a heartbeat's delay in noticing never makes them late."""
    return 2 * period + heartbeat


def check_policy(misfire: str, grace: float) -> None:
    if misfire not in MISFIRE:
        raise InvalidJob(f"unknown misfire policy {echoed(misfire)}: use one of {', '.join(MISFIRE)}")
    if not math.isfinite(grace) or grace < 0:
        raise BadJobInput.out_of("grace", grace, "a non-negative number of seconds")


def check_schedule_name(name: str) -> None:
    if not name or len(name) > 200 or "@" in name or name != name.strip():
        raise InvalidJob(f"schedule name {echoed(name)} must be 1-200 characters without '@' or surrounding spaces")


def run_now_key(name: str, request: str) -> str:
    """The key of the extra occurrence an operator's run-now `request` makes: the same request, sent again by a
    retry or a second click, names the same job, which the database's unique key lets in once."""
    if not request or len(request) > MAX_REQUEST or request != request.strip() or not request.isprintable():
        raise BadJobInput.out_of("request", request, f"1-{MAX_REQUEST} printable characters without surrounding spaces")
    return f"{name}@{RUN_NOW} {request}"


def is_run_now(name: str, key: str | None) -> bool:
    return bool(key) and str(key).startswith(f"{name}@{RUN_NOW} ")


def made_by(job: Mapping[str, Any]) -> str:
    """Which schedule made a job, as the job lists show it: `name`, `name (run now)` for an operator's extra
    occurrence, or "" for a job no schedule made (store/schedules.py signs its jobs `schedule NAME`)."""
    origin = job.get("origin") or ""
    if not origin.startswith("schedule "):
        return ""
    name = origin.removeprefix("schedule ")
    return f"{name} ({RUN_NOW})" if is_run_now(name, job.get("key")) else name


def due_of(name: str, key: str, created_at: float) -> float:
    """When an occurrence was due: the time its key names (Recurrence.label), or for a run-now the moment it was
    asked for. A retry's due time moves with its backoff, so the key, not the job's run_at, keeps the original."""
    if is_run_now(name, key):
        return created_at
    try:
        return datetime.fromisoformat(key.removeprefix(f"{name}@")).timestamp()
    except ValueError:  # a key written by SQL: the job's making is the best guess left
        return created_at


def check_overlap(overlap: str, jitter: float, pause_on_failure: int | None) -> None:
    """The overlap policy, jitter and pause-on-failure of a schedule, each in one line if wrong."""
    if overlap not in OVERLAP:
        raise InvalidJob(f"unknown overlap policy {echoed(overlap)}: use one of {', '.join(OVERLAP)}")
    if isinstance(jitter, bool) or not isinstance(jitter, int | float) or not 0 <= jitter <= MAX_JITTER:
        raise BadJobInput.out_of("jitter", jitter, f"from 0 to {MAX_JITTER:g} seconds")
    if pause_on_failure is not None and (
        isinstance(pause_on_failure, bool)
        or not isinstance(pause_on_failure, int)
        or not 1 <= pause_on_failure <= MAX_PAUSE_ON_FAILURE
    ):
        raise BadJobInput.out_of("pause_on_failure", pause_on_failure, f"from 1 to {MAX_PAUSE_ON_FAILURE} runs")


def order_key_of(name: str, overlap: str, order_key: str | None) -> str | None:
    """The order key of a schedule's jobs: the one it was given, or, when its runs must not overlap, the farm's
    own `schedule:NAME` (for a name too long for the column, `schedule:#` and a hash of it)."""
    if order_key is not None or overlap == DEFAULT_OVERLAP:
        return order_key
    key = f"schedule:{name}"
    return key if len(key) <= MAX_ORDER_KEY else f"schedule:#{hashlib.sha256(name.encode()).hexdigest()}"


def jitter_of(key: str, jitter: float) -> float:
    """The delay of the occurrence keyed `key` (`NAME@TIME`) under `jitter` seconds: a hash of the key, so every
    machine, and every pass, computes the same."""
    if not jitter:
        return 0.0
    digest = hashlib.sha256(key.encode()).digest()
    return jitter * int.from_bytes(digest[:8], "big") / 2**64


def upcoming_runs(schedule: Mapping[str, Any], now: float, count: int = PREVIEW) -> list[float]:
    """The next `count` times the schedule's occurrences are due after `now`, jitter applied, earliest first: what
    `schedule show` and the app print. None for a paused schedule, unless paused until a time (then those after
    it; the farm resumes it then, from its next occurrence more than two periods on: see first_occurrence)."""
    if schedule["paused"]:
        if schedule.get("paused_until") is None:
            return []
        now = max(now, schedule["paused_until"])
    recurrence, name = Recurrence.of(schedule), schedule["name"]
    jitter = float(schedule.get("jitter") or 0.0)
    t, runs = recurrence.after(now - jitter), []
    for _ in range(count + MAX_PER_PASS):
        due = t + jitter_of(f"{name}@{recurrence.label(t)}", jitter)
        if due > now:
            runs.append(due)
        runs.sort()
        if len(runs) >= count and t > runs[count - 1]:
            break
        t = recurrence.after(t)
    return runs[:count]


def backfilled(recurrence: Recurrence, start: float, end: float, now: float) -> list[float]:
    """The occurrences in [start, end] that a backfill makes, checked: a past range (end not after `now`) of at
    most MAX_BACKFILL occurrences, each refused in one line."""
    if not (math.isfinite(start) and math.isfinite(end)) or start > end:
        raise BadJobInput("a backfill's start (FROM) must not be after its end (TO)", "start", "end")
    if end > now:
        raise BadJobInput("a backfill covers past occurrences: its end (TO) must not be later than now", "end")
    times: list[float] = []
    t = recurrence.after(start - 0.001)
    while t <= end:
        if len(times) == MAX_BACKFILL:
            raise InvalidJob(
                f"the range holds more than {MAX_BACKFILL} occurrences: backfill at most {MAX_BACKFILL} at a time"
            )
        times.append(t)
        t = recurrence.after(t)
    return times
