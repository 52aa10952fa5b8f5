"""What the farm did, as the Farm reads it (docs/design.md §10): its history per queue and its log of events."""

from typing import Any

from .rules.errors import BadSetting
from .rules.events import FAMILIES, EventKind
from .rules.queues import check_name
from .store.stats import MINUTE
from .store.stores import Store


class FarmPast:
    """The Farm's reads of the past (a part of Farm: its store is the Farm's)."""

    _store: Store

    def stats(self, since: float = 86400.0, *, step: int = 60, queue: str | None = None) -> list[dict[str, Any]]:
        """The farm's history per queue (docs/design.md §10) over the last `since` seconds, in buckets of `step`
        seconds (a multiple of 60; past a day the rows are hours), oldest first: jobs enqueued, started and ended by
        outcome, the jobs waiting, and the median and 95th percentile of the runs' durations (seconds)."""
        if step < MINUTE or step % MINUTE:
            raise BadSetting.out_of("step", step, f"a whole number of minutes, in seconds ({MINUTE}, 300, 3600...)")
        if since <= 0:
            raise BadSetting.out_of("since", since, "a positive number of seconds")
        return self._store.stats.read(since, step, None if queue is None else check_name(queue))

    def events(self, since: float = 86400.0, *, kind: str | None = None, limit: int = 10_000) -> list[dict[str, Any]]:
        """The farm's log of what happened and who did it (docs/design.md §10) over the last `since` seconds, oldest
        first (the newest `limit`): each event's time (`at`), `kind` (rules.events.EventKind), `subject`, `detail`
        and `actor`. `kind`: one kind, or a family of them (`machine`, `queue`, `schedule`, `jobs`, `database`)."""
        if kind is not None and kind not in FAMILIES and kind not in tuple(EventKind):
            raise BadSetting.out_of("kind", kind, f"a kind of event, or one of {', '.join(sorted(FAMILIES))}")
        if since <= 0:
            raise BadSetting.out_of("since", since, "a positive number of seconds")
        return self._store.events.read(since, kind, limit)
