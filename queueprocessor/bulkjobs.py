"""Many jobs at once, as the Farm offers it: find them by a JobFilter, count them, and retry, cancel or delete them
all in batches (store/bulk.py)."""

from collections.abc import Callable
from typing import Any

from .rules.errors import QPError
from .rules.search import BulkAction, JobFilter
from .store import bulk
from .store.stores import Store
from .store.views import filtered_jobs

EVERYTHING = "give a filter (state, queue, target, older_than, search), or everything=True to act on every job"


def find(store: Store, where: JobFilter, limit: int) -> list[dict[str, Any]]:
    return filtered_jobs(store, where, limit)


def count(store: Store, action: str, where: JobFilter) -> int:
    return bulk.count(store, BulkAction(action), where)


def act(
    store: Store,
    action: str,
    where: JobFilter,
    *,
    everything: bool,
    stop: Callable[[], bool] | None,
    progress: Callable[[int], None] | None,
) -> bulk.Changed:
    """Farm.act_on_jobs: an empty filter is refused unless `everything`."""
    chosen = BulkAction(action)
    if where.is_empty() and not everything:
        raise QPError(f"an empty filter would {chosen} every job: {EVERYTHING}")
    return bulk.run(store, chosen, where, stop=stop, progress=progress)
