"""Many jobs at once, as the Farm acts on them: retry, cancel or delete every job a JobFilter picks, in batches
(store/bulk.py), once the filter is known not to be empty by mistake."""

from collections.abc import Callable

from .rules.errors import QPError
from .rules.search import BulkAction, JobFilter
from .store.bulk import Changed
from .store.stores import Store

EVERYTHING = "give a filter (state, queue, target, older_than, search), or everything=True to act on every job"


def act(
    store: Store,
    action: str,
    where: JobFilter,
    *,
    everything: bool,
    stop: Callable[[], bool] | None,
    progress: Callable[[int], None] | None,
) -> Changed:
    """Farm.act_on_jobs: an empty filter is refused unless `everything`."""
    chosen = BulkAction(action)
    if where.is_empty() and not everything:
        raise QPError(f"an empty filter would {chosen} every job: {EVERYTHING}")
    return store.bulk.run(chosen, where, stop=stop, progress=progress)
