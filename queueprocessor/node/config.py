"""A node's settings (docs/design.md §8), in the one shape every entry point builds: the CLI with its TOML file and
QP_* variables (queueprocessor.nodeoptions), the desktop app, and Farm.node's keywords. Each default is written here
once, and `checked()` is the one check of what a node is given. Apart from the node so that what only reads them
(views, the turn timer, bench/simulate.py) does not load the node and its executors."""

import re
import socket
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from ..rules.allow import AllowLists
from ..rules.errors import BadSetting
from ..rules.kinds import KINDS, LOCAL_BASE
from ..rules.limits import MAX_CAPACITY
from ..rules.logs import LogFormat
from ..rules.queues import Served
from ..rules.roster import Liveness
from ..rules.schedules import ahead_of

FARM_TIMING = ("period", "heartbeat", "misses")  # every machine must share them, or turns and death verdicts disagree
ALLOW_LISTS = tuple(kind.option for kind in KINDS.values())  # a field below for each kind of work
LISTS = (*ALLOW_LISTS, "command_env")  # the settings that are lists (tuples, given as any iterable)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class FarmTiming:
    """The timing a farm's machines share (its defaults are a new farm's), and the durations that follow from it."""

    period: float = 1.0
    heartbeat: float = 1.0
    misses: int = 3

    @classmethod
    def of(cls, settings: dict[str, Any]) -> "FarmTiming":
        """The timing in a farm's settings (Farm.settings()), which stores every value as a float."""
        return cls(float(settings["period"]), float(settings["heartbeat"]), int(settings["misses"]))

    def liveness(self) -> Liveness:
        return Liveness(self.dead_after)

    @property
    def claim_ahead(self) -> float:
        """A turn claims jobs due before the next turn and starts each exactly at its time."""
        return self.period

    @property
    def schedule_ahead(self) -> float:
        return ahead_of(self.period, self.heartbeat)

    @property
    def dead_after(self) -> float:
        return self.misses * self.heartbeat

    @property
    def lease(self) -> float:
        """A lease lasts as long as a silent machine is given before it is judged dead."""
        return self.dead_after

    @property
    def fence_margin(self) -> float:
        """Stop our own jobs this long before our leases could run out."""
        return min(0.5, self.heartbeat / 2)

    @property
    def watchdog_every(self) -> float:
        """How often the watchdog looks for leases about to run out: a stop begins at most this late."""
        return self.fence_margin / 4

    @property
    def fenced_grace(self) -> float:
        """How long a job stopped for its lease may take to end by itself before it is forced (a command's
        SIGKILL): with the watchdog's lateness, half the margin, so the stop is over before the lease runs out."""
        return self.fence_margin / 4

    @property
    def leash(self) -> float:
        """How long after the send time of its claim or last renewal a run's work outside the node (a command) may
        live before the node's warden kills it (docs/design.md §3): the lease less half the fence margin. The node's
        own stop begins by lease - fence_margin + watchdog_every and is over fenced_grace later, half the margin
        before the lease ends; the warden's kill comes then, after that stop would have finished (so a node that is
        alive stops its commands itself, gracefully), and still half the margin before the lease ends, when another
        machine may take the job."""
        return self.lease - self.fence_margin / 2

    @property
    def stale(self) -> float:
        """A machine quiet for this long is read by name at every heartbeat (a suspect): late by a heartbeat
        or so, and a heartbeat and a half before its dead timeout, so every peer reads its last_seen first."""
        return max(self.dead_after - 1.5 * self.heartbeat, self.dead_after / 2)

    @property
    def join_delay(self) -> float:
        """Join the roster only once every peer has surely read our row."""
        return 1.5 * self.heartbeat


@dataclass(frozen=True)
class NodeConfig(FarmTiming):
    """What a node on this machine is told. The farm-wide timing it inherits is the farm's (Farm.node sets it);
    `asked` names those given for this node, which a new farm adopts and an existing one must already use."""

    name: str = field(default_factory=socket.gethostname)  # shown to operators
    capacity: int = 4  # jobs it runs at once
    asked: frozenset[str] = frozenset()  # of FARM_TIMING
    http_base: str = LOCAL_BASE
    clock_skew: float = 0.0  # pretend the system clock is off by this much (to see skew handled)
    turn_keep: float = 86400.0  # seconds of turn history kept
    keep_jobs: float = 7 * 86400.0  # finished jobs (and their runs) are deleted this long after they ended
    keep_history: float = 14 * 86400.0  # per-queue history (store/stats.py) is deleted this long after its minute
    keep_events: float = 30 * 86400.0  # the farm's event log (store/events.py) likewise
    housekeeping: float = 300.0  # seconds between the farm's retention passes (turn log, finished jobs)
    tick: float = 0.01
    allow_hosts: tuple[str, ...] = ()
    allow_modules: tuple[str, ...] = ()
    allow_commands: tuple[str, ...] = ()
    # Variables of the node's environment its commands also get (executors.command.PASSED they always get); never
    # a QP_* one: those are the node's own settings, QP_DB with the database's password.
    command_env: tuple[str, ...] = ()
    queues: str | None = None  # the queues it serves, as typed ("reports:2,default"; None: every queue): see served
    push: bool = True  # LISTEN for new work on PostgreSQL
    metrics_port: int | None = None  # serve Prometheus metrics on this port (queueprocessor.node.metrics)
    metrics_host: str = "127.0.0.1"
    listen_db: str | None = None  # LISTEN there rather than on the farm's URL (which may reach a pooler: see push)
    log_format: LogFormat = LogFormat.TEXT  # how its process logs: the entry point that runs it configures that

    def given(self, **settings: Any) -> "NodeConfig":
        """These settings with `settings` changed as Farm.node's keywords and the command line give them: None is
        not given, an allow-list may be any iterable, and a farm-wide timing given is `asked`."""
        given: dict[str, Any] = {k: v for k, v in settings.items() if v is not None}
        given |= {k: tuple(given[k]) for k in LISTS if k in given}
        return replace(self, **given, asked=self.asked | {k for k in FARM_TIMING if k in given})

    def checked(self) -> "NodeConfig":
        """Raise the QPError the node would meet at start: every entry point checks its settings here."""
        from ..executors import make_executors  # only what runs a node comes here (aiohttp, subprocesses)

        if not 1 <= self.capacity <= MAX_CAPACITY:
            raise BadSetting.out_of("capacity", self.capacity, f"from 1 to {MAX_CAPACITY}")
        for name in self.command_env:
            if not ENV_NAME.fullmatch(name):
                raise BadSetting("{0} takes names of environment variables (got {value})", "command_env", value=name)
            if name.upper().startswith("QP_"):
                raise BadSetting(
                    "{0} cannot pass {value} to commands: QP_* variables are the node's own settings (QP_DB holds the "
                    "database password)",
                    "command_env",
                    value=name,
                )
        make_executors(self.allow, self.http_base)
        Served.parse(self.queues)
        if self.listen_db is not None:
            from ..store.database import listen_url  # SQLAlchemy: likewise

            listen_url(self.listen_db)
        return self

    @cached_property
    def allow(self) -> AllowLists:
        """What work it agrees to run (queueprocessor.rules.allow)."""
        return AllowLists(**{kind.allow_field: getattr(self, kind.option) for kind in KINDS.values()})

    @cached_property
    def served(self) -> Served:
        """The queues it serves (docs/design.md §9), read at every claim."""
        return Served.parse(self.queues)
