"""Named queues: what a queue name, an order key, a rate and a machine's served queues may be (docs/design.md §9).

Everything here is pure: it checks and parses what people type, so the CLI, the API and the app refuse the
same names with the same words before anything reaches the database. The statements that enforce a queue's
pause, limit, rate and order live in the store modules (store/sql/gates.py, store/queues.py).
"""

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .errors import BadQueueInput

DEFAULT = "default"
MAX_NAME = 64  # qp_jobs.queue is String(64)
MAX_ORDER_KEY = 200  # qp_jobs.order_key is String(200)
MAX_LIMIT = 1_000_000
# Names travel in a machine's row as "a,b:2" and on the command line in --queues a,b: no commas, colons or
# spaces, and a first character that no option or number starts with.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_NAME_RULE = f"1 to {MAX_NAME} letters, digits, '.', '_' or '-', starting with a letter or digit"
# "10/s", "10 / min", "3/h": a whole number of starts per unit.
_RATE = re.compile(r"\s*(\S+?)\s*/\s*(\S+)\s*\Z")
_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}
_UNIT_NAMES = {1.0: "s", 60.0: "min", 3600.0: "h"}
# How long a queue keeps its finished jobs: "3d", "12h", "90min", "2w", or a number of seconds.
_KEEP = re.compile(r"\s*(\d+(?:\.\d*)?)\s*([a-z]*)\s*\Z")
_KEEP_UNITS = {"": 1.0, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
MAX_KEEP = 3650 * 86400.0  # ten years
MAX_RATE_PERIOD = max(_UNITS.values())  # the longest a rate counts over: a bucket refilled that long is full


class OnFailure(StrEnum):
    """What a job of an order key that failed for good (no attempts left) does to the jobs after it."""

    BLOCK = "block"  # it keeps holding its key until an operator retries or cancels it
    SKIP = "skip"  # the next job of the key runs

    @classmethod
    def parse(cls, value: object) -> "OnFailure":
        if not isinstance(value, str) or value not in tuple(cls):
            raise BadQueueInput(
                "{0} {value} is not a policy: use {limit}", "on_failure", value=value, limit=" or ".join(cls)
            )
        return cls(value)


class Unchanged:
    """The default of Farm.set_queue's keywords: leave this setting as it is (None means: remove it)."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = Unchanged()


def check_name(name: object, what: str = "queue") -> str:
    """A queue name as given, or BadQueueInput saying what a name may be."""
    if not isinstance(name, str) or len(name) > MAX_NAME or not _NAME.match(name):
        raise BadQueueInput("{0} {value} is not a queue name: use {limit}", what, value=name, limit=_NAME_RULE)
    return name


def check_order_key(key: str | None) -> str | None:
    """An order key as given (any text up to MAX_ORDER_KEY characters), or BadQueueInput."""
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_ORDER_KEY:
        raise BadQueueInput(
            "{0} {value} is refused: an order key is {limit}",
            "order_key",
            value=key,
            limit=f"1 to {MAX_ORDER_KEY} characters",
        )
    return key


def check_limit(limit: object, what: str = "limit") -> int | None:
    """A farm-wide, per-machine or per-key limit: a whole number from 1 (None: no limit)."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise BadQueueInput.out_of(what, limit, f"a whole number from 1 to {MAX_LIMIT}")
    return limit


def check_keep(keep: object) -> float | None:
    """How long a queue keeps its finished jobs, in seconds (None: the farm's default, the nodes' `keep_jobs`):
    a number of seconds, or text such as "3d", "12h", "90min", "2w"; BadQueueInput for anything else."""
    if keep is None:
        return None
    seconds = seconds_in(keep)
    if seconds is None or not 1 <= seconds <= MAX_KEEP:
        raise BadQueueInput.out_of("keep", keep, "a time from 1s to 3650d: seconds, or a number and s, min, h, d or w")
    return seconds


def seconds_in(value: object) -> float | None:
    """A time as typed: a number of seconds, or text such as "30s", "90min", "12h", "3d", "2w"; None if it is
    neither (the caller says what it wanted)."""
    seconds = value
    found = _KEEP.match(value.lower()) if isinstance(value, str) else None
    if found and found.group(2) in _KEEP_UNITS:
        seconds = float(found.group(1)) * _KEEP_UNITS[found.group(2)]
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return None
    return float(seconds)


def keep_text(seconds: float | None) -> str:
    """A queue's retention as check_keep reads it back, in the largest unit that holds it whole ("3d", "90min");
    "farm default" for None."""
    if seconds is None:
        return "farm default"
    unit = next(u for u in ("w", "d", "h", "min", "s") if seconds % _KEEP_UNITS[u] == 0 or u == "s")
    return f"{seconds / _KEEP_UNITS[unit]:g}{unit}"


@dataclass(frozen=True)
class Rate:
    """At most `count` starts per `per_seconds`, farm-wide, in database time: "10/s" is Rate(10, 1.0)."""

    count: int
    per_seconds: float

    @classmethod
    def parse(cls, text: object, what: str = "rate") -> "Rate":
        if isinstance(text, Rate):
            return text
        found = _RATE.match(text) if isinstance(text, str) else None
        count = found.group(1) if found else ""
        unit = _UNITS.get(found.group(2).lower()) if found else None
        if not count.isdigit() or unit is None or not 1 <= int(count) <= MAX_LIMIT:
            raise BadQueueInput(
                "{0} {value} is not a rate: use {limit}",
                what,
                value=text,
                limit=f"a whole number of starts from 1 to {MAX_LIMIT} per s, min or h, e.g. 10/s",
            )
        return cls(int(count), unit)

    @property
    def per_second(self) -> float:
        return self.count / self.per_seconds

    def burst(self, period: float) -> float:
        """The bucket's size: what one period brings (so a turn per period can keep up), and at least one start.
        Starts over any window of T seconds stay within rate x T + burst."""
        return max(1.0, min(float(self.count), self.per_second * period))

    def __str__(self) -> str:
        return f"{self.count}/{_UNIT_NAMES.get(self.per_seconds, f'{self.per_seconds:g}s')}"


@dataclass(frozen=True)
class QueueInfo:
    """One queue as operators see it (Farm.queues()): `serving` names the live machines that take its work;
    `limit` and `rate` (the configured one) are farm-wide."""

    name: str
    waiting: int
    running: int
    limit: int | None
    rate: Rate | None
    order_keys_waiting: int
    paused: bool
    on_failure: OnFailure
    serving: tuple[str, ...]
    keep: float | None = None  # seconds its finished jobs are kept (None: the farm's default)
    fair: bool = False  # claims share it across fairness keys by weight (rules/fairness.py)
    key_limit: int | None = None  # most units running at once per fairness key
    key_rate: Rate | None = None  # most units started per fairness key over time
    fair_from: str | None = None  # where a job enqueued without a fairness key takes one
    # Its breaker (rules/breaker.py), None: none: "N/Ws", the seconds before a canary, its state (closed, open,
    # half-open, ramp), the failures counted in its current window.
    breaker: str | None = None
    cool_down: float | None = None
    breaker_state: str | None = None
    failures: int = 0
    adaptive_floor: float | None = None  # its adaptive rate's floor, starts per second (None: not adaptive)
    current_rate: float | None = None  # starts per second its claims allow now: `rate`'s, or lower while adapted


@dataclass(frozen=True)
class Served:
    """The queues one machine serves, and its own limit for some (`--queues reports:2,default`).
    No names: every queue (the default), with no limits of its own."""

    names: tuple[str, ...] = ()
    caps: tuple[tuple[str, int], ...] = ()  # (queue, most of its jobs this machine runs at once)

    @classmethod
    def parse(cls, text: str | None) -> "Served":
        """`a,b:2` as typed (None: every queue). Refuses a list naming no queue, a bad name or limit."""
        if text is None:
            return cls()
        names, caps = [], []
        for part in str(text).split(","):
            name, colon, cap = part.strip().partition(":")
            if not name and not colon:
                continue
            check_name(name, "queues")
            if colon:
                if not cap.strip().isdigit() or not 1 <= int(cap) <= MAX_LIMIT:
                    raise BadQueueInput(
                        "{0} {value}: a machine's own limit for a queue is {limit}",
                        "queues",
                        value=part.strip(),
                        limit=f"NAME:N, N a whole number from 1 to {MAX_LIMIT}",
                    )
                caps.append((name, int(cap)))
            if name not in names:
                names.append(name)
        if not names:
            raise BadQueueInput(
                "{0} {value} names no queue: give names separated by commas, e.g. reports,default", "queues", value=text
            )
        return cls(tuple(names), tuple(caps))

    @property
    def every(self) -> bool:
        return not self.names

    def serves(self, queue: str) -> bool:
        return self.every or queue in self.names

    def __str__(self) -> str:
        """As stored on the machine row and typed after --queues ("" for every queue)."""
        caps = dict(self.caps)
        return ",".join(f"{n}:{caps[n]}" if n in caps else n for n in self.names)


def guarded(row: dict[str, Any]) -> bool:
    """A queue's settings row holds its jobs back for claims under its lock (sql.gates._guarded, the same test in
    SQL): a farm-wide limit, rate or breaker, fair share, or a limit or rate per key."""
    farm_wide = any(row.get(c) is not None for c in ("max_running", "rate_count", "breaker_failures"))
    return farm_wide or bool(row.get("fair")) or per_key(row)


def per_key(row: dict[str, Any]) -> bool:
    """A queue's settings row has a limit or a rate per fairness key: its claims keep them (sql.gates.per_key)."""
    return row.get("key_limit") is not None or row.get("key_rate_count") is not None


def serving_machines(live: list[dict[str, Any]], queue: str) -> tuple[str, ...]:
    """The names of the machines among `live` (rows with `name` and `queues`, () for every queue) that serve
    `queue`."""
    return tuple(m["name"] for m in live if not m["queues"] or queue in m["queues"])


def served_names(stored: str | None) -> tuple[str, ...]:
    """A machine row's served queues as the contract shows them: a tuple of names, () for every queue."""
    return Served.parse(stored).names if stored else ()
