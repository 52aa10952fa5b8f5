"""The farm's shared timing (period, heartbeat, misses) as its database keeps it: the first machine to ask fixes it,
every later one must agree, since turns and death verdicts need the same timing everywhere. Farm.settings,
Farm.node and what reads the timing (liveness, locks, schedules) go through here."""

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .node.config import FARM_TIMING, FarmTiming, NodeConfig
from .rules.clock import Clock, SystemClock
from .rules.errors import BadSetting
from .rules.limits import MAX_MISSES, MIN_MISSES
from .store.stores import Store

if TYPE_CHECKING:  # loaded by node() alone, so that enqueueing never loads a node
    from .node.node import Node


class SharedTiming:
    def __init__(self, store: Store, read_only: bool):
        self._store = store
        self._read_only = read_only
        self._adopted: dict[str, float] | None = None

    def adopt(self, **wanted: float | None) -> dict[str, float]:
        """The farm-wide timing settings. Values passed in are adopted by a new farm and must match an existing
        one."""
        given = {k: v for k, v in wanted.items() if v is not None}
        if self._read_only and not given:
            return self.current()
        for key, value in given.items():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0) or (
                key == "misses" and not (value == int(value) and MIN_MISSES <= value <= MAX_MISSES)
            ):
                kind = (
                    f"a whole number from {MIN_MISSES} to {MAX_MISSES} (a lease lasts that many heartbeats, and must "
                    "outlast the one that renews it)"
                    if key == "misses"
                    else "a positive number of seconds"
                )
                raise BadSetting.out_of(key, value, kind)
        if not given and self._adopted is not None:
            return self._adopted
        new = FarmTiming()  # what a new farm adopts, but for what is given
        stored = self._store.settings.adopt({k: repr(float(given.get(k, getattr(new, k)))) for k in FARM_TIMING})
        farm = {k: float(stored[k]) for k in FARM_TIMING}
        for key, value in given.items():
            if not math.isclose(float(value), farm[key]):
                raise BadSetting(
                    "this farm uses {0} {value} (every machine must agree); start the node without {0}, "
                    "or with {0} {value}",
                    key,
                    value=farm[key],
                )
        self._adopted = farm
        return farm

    def current(self) -> dict[str, float]:
        """The farm's settings as stored, defaults for any not stored yet; unlike adopt(), never fixes them (so
        enqueueing into a new farm does not fix the timing its first node may choose)."""
        if self._adopted is not None:
            return self._adopted
        stored, new = self._store.settings.read(), FarmTiming()
        return {k: float(stored.get(k, getattr(new, k))) for k in FARM_TIMING}

    def timing(self) -> FarmTiming:
        return FarmTiming.of(self.current())


def node_for(
    store: Store, shared: SharedTiming, config: NodeConfig, clock: Clock | None, settings: dict[str, Any]
) -> "Node":
    """Farm.node: `config` with `settings`, checked, its timing the farm's (adopted by a new farm)."""
    from .node.node import Node  # the engine and the node's threads: only a node loads them

    config = config.given(**settings).checked()
    farm = shared.adopt(**{k: getattr(config, k) for k in config.asked})
    timing = FarmTiming.of(farm)
    config = replace(config, period=timing.period, heartbeat=timing.heartbeat, misses=timing.misses)
    return Node(store, config, clock=clock or SystemClock(config.clock_skew))
