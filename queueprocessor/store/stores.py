"""The `Store`: the farm's database, with a store for each thing it stores. A caller holds one and reaches what it
needs by name: `store.jobs.claim(...)`, `store.runs.finish_many(...)`, `store.machines.heartbeat(...)`."""

from sqlalchemy.engine import Engine

from .base import StoreBase
from .events import EventStore
from .flows import FlowStore
from .jobs import JobStore
from .machines import MachineStore
from .runs import RunStore
from .settings import SettingsStore
from .stats import StatsStore
from .turns import TurnStore


class Store(StoreBase):
    """The farm's database (see StoreBase) and its stores: jobs (the queue's side), runs (their owner's side),
    machines, turns, the farm's settings, workflows and groups (flows), its history per queue (stats) and its log
    of events. Queues, schedules, locks, the roster and the dashboards' reads have stores of their own over the
    same base (QueueStore(store) and the like)."""

    def __init__(self, engine: Engine):
        super().__init__(engine)
        self.turns = TurnStore(self)
        self.jobs = JobStore(self, self.turns)
        self.runs = RunStore(self)
        self.machines = MachineStore(self)
        self.settings = SettingsStore(self)
        self.flows = FlowStore(self)
        self.stats = StatsStore(self)
        self.events = EventStore(self)
