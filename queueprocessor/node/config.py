"""A node's settings (docs/design.md §8): its own, and the farm's timing it must share with every peer (period,
heartbeat, misses), with the durations that follow from them. Apart from the node so that what only reads
them (views, the turn timer, bench/simulate.py) does not load the node and its executors."""

import socket
from dataclasses import dataclass, field

from ..rules.allow import AllowLists
from ..rules.queues import Served
from ..rules.schedules import ahead_of


@dataclass
class NodeConfig:
    name: str = field(default_factory=socket.gethostname)
    capacity: int = 4
    period: float = 1.0
    heartbeat: float = 1.0
    misses: int = 3
    http_base: str = "http://localhost/"
    turn_keep: float = 24 * 3600.0
    keep_jobs: float = 7 * 24 * 3600.0  # finished jobs (and their runs) are deleted this long after they ended
    housekeeping: float = 300.0  # seconds between the farm's retention passes (turn log, finished jobs)
    tick: float = 0.01
    allow: AllowLists = field(default_factory=AllowLists)
    push: bool = True  # LISTEN for new work on PostgreSQL
    metrics_port: int | None = None  # serve Prometheus metrics on this port (queueprocessor.node.metrics)
    metrics_host: str = "127.0.0.1"
    served: Served = field(default_factory=Served)  # the queues this machine serves (docs/design.md §9)
    listen_db: str | None = None  # LISTEN there rather than on the farm's URL (which may reach a pooler: see push)

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
    def stale(self) -> float:
        """A machine quiet for this long is read by name at every heartbeat (a suspect): late by a heartbeat
        or so, and a heartbeat and a half before its dead timeout, so every peer reads its last_seen first."""
        return max(self.dead_after - 1.5 * self.heartbeat, self.dead_after / 2)

    @property
    def join_delay(self) -> float:
        """Join the roster only once every peer has surely read our row."""
        return 1.5 * self.heartbeat
