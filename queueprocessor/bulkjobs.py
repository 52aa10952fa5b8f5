"""The API's part for many jobs at once: find them by a JobFilter, count them, and retry, cancel or delete them
all in batches (store/bulk.py). Farm inherits it."""

from collections.abc import Callable
from typing import Any

from .rules.errors import QPError
from .rules.search import BulkAction, JobFilter
from .store.bulk import Changed
from .store.stores import Store

EVERYTHING = "give a filter (state, queue, target, older_than, search), or everything=True to act on every job"


class ManyJobs:
    _store: Store

    def find_jobs(self, where: JobFilter, limit: int = 100) -> list[dict[str, Any]]:
        """The newest `limit` jobs that `where` picks (its search: rules/search.py), newest first."""
        return self._store.views.filtered_jobs(where, limit)

    def count_jobs(self, action: str, where: JobFilter) -> int:
        """How many jobs `action` ("retry", "cancel", "delete") would change now: what to confirm first."""
        return self._store.bulk.count(BulkAction(action), where)

    def act_on_jobs(
        self,
        action: str,
        where: JobFilter,
        *,
        everything: bool = False,
        stop: Callable[[], bool] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Changed:
        """Retry (failed or cancelled), cancel (queued or running: a running one is stopped by its owner within a
        heartbeat) or delete (finished, with their runs) every job `where` picks, as the single actions do, a
        batch of jobs to a short transaction. How many it changed (an int), with `.busy`: how many it found held
        by another transaction and left unchanged (run it again for those). An empty filter is refused unless
        `everything`; `stop()` is asked before each batch, `progress(changed so far)` told after each."""
        chosen = BulkAction(action)
        if where.is_empty() and not everything:
            raise QPError(f"an empty filter would {chosen} every job: {EVERYTHING}")
        return self._store.bulk.run(chosen, where, stop=stop, progress=progress)

    def retry_jobs(self, where: JobFilter, **options: Any) -> int:
        """act_on_jobs("retry", ...)."""
        return self.act_on_jobs(BulkAction.RETRY, where, **options)

    def cancel_jobs(self, where: JobFilter, **options: Any) -> int:
        """act_on_jobs("cancel", ...)."""
        return self.act_on_jobs(BulkAction.CANCEL, where, **options)

    def delete_jobs(self, where: JobFilter, **options: Any) -> int:
        """act_on_jobs("delete", ...)."""
        return self.act_on_jobs(BulkAction.DELETE, where, **options)
