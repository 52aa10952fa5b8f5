"""What the farm did, as the Farm reads it (docs/design.md §10): its history per queue and its log of events, their
bounds checked here (Farm.stats and Farm.events say what each returns)."""

from typing import Any

from .rules.errors import BadSetting
from .rules.events import FAMILIES, EventKind
from .rules.queues import check_name
from .store.stats import MINUTE
from .store.stores import Store


def stats(store: Store, since: float, step: int, queue: str | None) -> list[dict[str, Any]]:
    if step < MINUTE or step % MINUTE:
        raise BadSetting.out_of("step", step, f"a whole number of minutes, in seconds ({MINUTE}, 300, 3600...)")
    if since <= 0:
        raise BadSetting.out_of("since", since, "a positive number of seconds")
    return store.stats.read(since, step, None if queue is None else check_name(queue))


def events(store: Store, since: float, kind: str | None, limit: int) -> list[dict[str, Any]]:
    if kind is not None and kind not in FAMILIES and kind not in tuple(EventKind):
        raise BadSetting.out_of("kind", kind, f"a kind of event, or one of {', '.join(sorted(FAMILIES))}")
    if since <= 0:
        raise BadSetting.out_of("since", since, "a positive number of seconds")
    return store.events.read(since, kind, limit)
