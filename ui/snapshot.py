"""One poll of the farm as the window draws it: a frozen `Snapshot`, made in one place, `Snapshot.of`.

The worker thread makes it (the dashboard's read, this machine's node, the
selected schedule's next runs, the plot arrays) and the GUI thread only reads it, so no view can change what the
others draw. A field the dashboard reads is copied by name: a new one is one
more field here (views.Dashboard.read must fill it).
"""

from dataclasses import dataclass, fields

from queueprocessor.rules.queues import QueueInfo

from .arrays import LaneArrays, prepare
from .scheduleplan import next_runs


@dataclass(frozen=True)
class Snapshot:
    # What views.Dashboard.read returns, field for field.
    db_now: float
    since: float  # the stretch of database time the plots show
    until: float
    period: float
    machines: list[dict]  # judged: status, leader, synced
    names: dict[int, str]  # every machine's name by id, gone ones too
    leader: int | None
    turns: list[dict]
    upcoming: list[tuple[int, int]]  # (slot, machine id) ahead of now
    runs: list[dict]
    job_counts: dict[str, int]
    throughput: list[dict]
    bucket: float
    history: float  # the seconds up to db_now that both throughputs count
    machine_throughput: dict[int, dict[str, int]]
    jobs: list[dict]
    job: dict | None  # the selected job with its runs, parents, children and flows (store/lineage.py)
    flow: dict | None  # the workflow or group whose graph is open, with its steps
    schedules: list[dict]
    schedule: dict | None  # the schedule the Schedules tab has selected, with its last runs (Query.schedule)
    singletons: list[dict]
    queues: list[QueueInfo]  # every named queue, by name
    # What the app adds.
    node: dict | None  # this machine's node (Node.snapshot()); None when the app only observes
    schedule_next: list[float]  # the selected schedule's next starts with its jitter applied (scheduleplan)
    read_ms: float  # how long the read took
    mono: float  # the app's monotonic clock when the read began: db time is extrapolated from it
    plot: LaneArrays

    @classmethod
    def of(cls, reading: dict, *, node: dict | None, read_ms: float, mono: float) -> "Snapshot":
        """A snapshot of `reading` (views.Dashboard.read()'s dict); makes the plot arrays, so call it off the GUI
        thread."""
        read = {f.name: reading[f.name] for f in fields(cls) if f.name not in _ADDED}
        upcoming = next_runs(reading["schedule"], reading["db_now"])
        return cls(**read, node=node, schedule_next=upcoming, read_ms=read_ms, mono=mono, plot=prepare(reading))

    @property
    def own_id(self) -> int | None:
        """The machine whose node runs in this app, if any."""
        return self.node["id"] if self.node else None

    @property
    def own_row(self) -> dict | None:
        """This app's node's machine row, as the peers table shows it."""
        return next((m for m in self.machines if m["id"] == self.own_id), None) if self.node else None

    def name_of(self, machine_id: int) -> str:
        return self.names.get(machine_id, f"#{machine_id}")


_ADDED = frozenset(("node", "schedule_next", "read_ms", "mono", "plot"))
