"""The farm's queues as an operator reads and steers them: every queue with its settings, counts and the live
machines that serve it; pause, resume, and the farm-wide limit, rate, failure policy, retention, breaker and
adaptive rate (rules.queues and rules.breaker say what each means, store.queues and store.breakers store them)."""

from .machines import Machines
from .rules.breaker import flow_settings, watched
from .rules.errors import BadQueueInput, NotFound, echoed
from .rules.queues import DEFAULT, UNCHANGED, OnFailure, QueueInfo, Rate, check_keep, check_limit, check_name
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
        known = name if name == DEFAULT else self._known(name)
        return self._queues.infos(self._machines.live(), only=known)[0]

    def pause(self, name: str, paused: bool) -> None:
        self._queues.put(self._known(name), paused=paused)

    def set(
        self,
        name: str,
        *,
        limit: object,
        rate: object,
        on_failure: object,
        keep: object = UNCHANGED,
        breaker: object = UNCHANGED,
        cool_down: object = UNCHANGED,
        adaptive: object = UNCHANGED,
    ) -> None:
        """What is given of `limit`, `rate`, `on_failure`, `keep`, `breaker`, `cool_down` and `adaptive` (UNCHANGED:
        not given) as the queue's settings."""
        values: dict[str, object] = {}
        if limit is not UNCHANGED:
            values["max_running"] = check_limit(limit)
        if rate is not UNCHANGED:
            parsed = None if rate is None else Rate.parse(rate)
            burst = None if parsed is None else parsed.burst(self._shared.current()["period"])
            values |= dict(
                rate_count=None if parsed is None else parsed.count,
                rate_per=None if parsed is None else parsed.per_seconds,
                burst=burst,
                tokens=None,
                refilled_at=None,
                rate_set_per=None,  # the configured rate is the current one
            )
        if on_failure is not UNCHANGED:
            values["on_failure"] = OnFailure.parse(on_failure)
        if keep is not UNCHANGED:
            values["keep"] = check_keep(keep)
        if (breaker, cool_down, adaptive, rate) != (UNCHANGED,) * 4:
            row = self._queues.settings(only=self._known(name)).get(name, {})
            period = self._shared.current()["period"]
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
