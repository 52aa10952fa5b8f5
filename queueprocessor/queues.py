"""The farm's queues as an operator reads and steers them: every queue with its settings, counts and the live
machines that serve it; pause, resume, and the farm-wide limit, rate, failure policy, retention, breaker and
adaptive rate, fair share and flow per key (rules.queue_settings, rules.breaker and rules.fairness say what each
means, store.queues and store.breakers store them)."""

from typing import Unpack

from .machines import Machines
from .rules.breaker import flow_settings, watched
from .rules.errors import BadQueueInput, NotFound, echoed
from .rules.fairness import KeyUse
from .rules.queue_settings import FLOW, QueueSettings, columns
from .rules.queues import UNCHANGED, QueueInfo, check_name
from .store.stores import Store
from .timing import SharedTiming


class Queues:
    def __init__(self, store: Store, machines: Machines, shared: SharedTiming):
        self._queues = store.queues
        self._store = store
        self._machines = machines
        self._shared = shared

    def all(self) -> list[QueueInfo]:
        return self._queues.infos(self._machines.live())

    def one(self, name: str) -> QueueInfo:
        return self._queues.infos(self._machines.live(), only=self._known(name))[0]

    def keys(self, name: str, most: int) -> list[KeyUse]:
        if isinstance(most, bool) or not isinstance(most, int) or most < 1:
            raise BadQueueInput.out_of("most", most, "a whole number from 1")
        return self._queues.keys(self._known(name), most)

    def pause(self, name: str, paused: bool) -> None:
        self._queues.put(self._known(name), paused=paused)

    def set(self, name: str, **given: Unpack[QueueSettings]) -> None:
        """What is `given` as the queue's settings (see Farm.set_queue), every one checked before any is written."""
        period = self._shared.current()["period"]
        values = columns(given, period)
        breaker, cool_down, adaptive = (given.get(setting, UNCHANGED) for setting in FLOW)
        if "rate" in given or any(value is not UNCHANGED for value in (breaker, cool_down, adaptive)):
            row = self._queues.settings(only=self._known(name)).get(name, {})  # a new rate is a new ceiling
            values |= flow_settings(row, values, breaker, cool_down, adaptive, period)
        self._queues.put(self._known(name), **values)

    def reset_breaker(self, name: str) -> None:
        """Close queue `name`'s breaker and bring its rate back to the configured one (BadQueueInput: it has
        neither a breaker nor an adaptive rate)."""
        row = self._queues.settings(only=self._known(name)).get(name, {})
        if not watched(row):
            raise BadQueueInput(
                "{0} {value} has no breaker and no adaptive rate: nothing to reset", "queue", value=name
            )
        self._store.breakers.reset(name, self._shared.current()["period"])

    def _known(self, name: str) -> str:
        if not self._queues.known(check_name(name)):
            raise NotFound(
                f"no queue named {echoed(name)}: a queue exists once a job is enqueued to it or a machine "
                "serves it by name",
                what="queue",
                ref=name,
            )
        return name
