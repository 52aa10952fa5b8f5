"""The farm's queues as an operator reads and steers them: every queue with its settings, counts and the live
machines that serve it; pause, resume, and the farm-wide limit, rate, failure policy and retention (rules.queues
says what each means, store.queues stores them)."""

from .machines import Machines
from .rules.errors import BadQueueInput, NotFound, echoed
from .rules.fairness import KeyUse, check_fair_from
from .rules.queues import DEFAULT, UNCHANGED, OnFailure, QueueInfo, Rate, check_keep, check_limit, check_name
from .store.stores import Store
from .timing import SharedTiming


class Queues:
    def __init__(self, store: Store, machines: Machines, shared: SharedTiming):
        self._queues = store.queues
        self._machines = machines
        self._shared = shared

    def all(self) -> list[QueueInfo]:
        return self._queues.infos(self._machines.live())

    def one(self, name: str) -> QueueInfo:
        known = name if name == DEFAULT else self._known(name)
        return self._queues.infos(self._machines.live(), only=known)[0]

    def keys(self, name: str, most: int) -> list[KeyUse]:
        if isinstance(most, bool) or not isinstance(most, int) or most < 1:
            raise BadQueueInput.out_of("most", most, "a whole number from 1")
        return self._queues.keys(self._known(name), most)

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
        fair: object = UNCHANGED,
        key_limit: object = UNCHANGED,
        key_rate: object = UNCHANGED,
        fair_from: object = UNCHANGED,
    ) -> None:
        """What is given of `limit`, `rate`, `on_failure`, `keep`, `fair`, `key_limit`, `key_rate` and `fair_from`
        (UNCHANGED: not given) as the queue's settings."""
        values: dict[str, object] = {}
        period = self._shared.current()["period"]
        if fair is not UNCHANGED:
            if not isinstance(fair, bool):
                raise BadQueueInput.out_of("fair", fair, "True or False")
            values["fair"] = fair
        if key_limit is not UNCHANGED:
            values["key_limit"] = check_limit(key_limit, "key_limit")
        if fair_from is not UNCHANGED:
            values["fair_from"] = check_fair_from(fair_from)
        if key_rate is not UNCHANGED:
            parsed = None if key_rate is None else Rate.parse(key_rate, "key_rate")
            values |= dict(
                key_rate_count=None if parsed is None else parsed.count,
                key_rate_per=None if parsed is None else parsed.per_seconds,
                key_burst=None if parsed is None else parsed.burst(period),
            )
        if limit is not UNCHANGED:
            values["max_running"] = check_limit(limit)
        if rate is not UNCHANGED:
            parsed = None if rate is None else Rate.parse(rate)
            values |= dict(
                rate_count=None if parsed is None else parsed.count,
                rate_per=None if parsed is None else parsed.per_seconds,
                burst=None if parsed is None else parsed.burst(period),
                tokens=None,
                refilled_at=None,
            )
        if on_failure is not UNCHANGED:
            values["on_failure"] = OnFailure.parse(on_failure)
        if keep is not UNCHANGED:
            values["keep"] = check_keep(keep)
        self._queues.put(self._known(name), **values)

    def _known(self, name: str) -> str:
        if not self._queues.known(check_name(name)):
            raise NotFound(
                f"no queue named {echoed(name)}: a queue exists once a job is enqueued to it or a machine "
                "serves it by name",
                what="queue",
                ref=name,
            )
        return name
