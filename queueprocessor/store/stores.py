"""The `Store`: the farm's database, with a store for each thing it stores. A caller holds one and reaches what it
needs by name, never building a store of its own: `store.jobs.claim(...)`, `store.queues.put(...)`,
`store.bulk.run(...)`."""

from sqlalchemy.engine import Engine

from .base import StoreBase
from .breakers import BreakerStore
from .bulk import BulkStore
from .events import EventStore
from .flows import FlowStore
from .jobs import JobStore
from .lineage import LineageStore
from .locks import LockStore
from .machines import MachineStore
from .queues import QueueStore
from .roster import RosterStore
from .runs import RunStore
from .schedules import ScheduleStore
from .settings import SettingsStore
from .stats import StatsStore
from .turns import TurnStore
from .views import ViewStore


class Store(StoreBase):
    """The farm's database (see StoreBase) and its stores, each built once here over the same base: jobs (the
    queue's side), runs (their owner's side), machines, turns, the roster (the machines as peers read them), the
    farm's settings, queues and their breakers, schedules, locks, workflows and groups (flows), a job's lineage,
    bulk actions, the dashboards' reads (views), its history per queue (stats) and its log of events."""

    def __init__(self, engine: Engine):
        super().__init__(engine)
        self.turns = TurnStore(self)
        self.jobs = JobStore(self, self.turns)
        self.runs = RunStore(self)
        self.machines = MachineStore(self)
        self.roster = RosterStore(self)
        self.settings = SettingsStore(self)
        self.queues = QueueStore(self)
        self.breakers = BreakerStore(self)
        self.schedules = ScheduleStore(self)
        self.locks = LockStore(self)
        self.flows = FlowStore(self)
        self.lineage = LineageStore(self, self.flows)
        self.bulk = BulkStore(self)
        self.views = ViewStore(self)
        self.stats = StatsStore(self)
        self.events = EventStore(self)
