"""A node's count of its ended runs for the queues that have a breaker or an adaptive rate (docs/design.md §9):
after each batch of endings is written, what the batch did to each such queue is written on its row
(store/breakers.py moves the breaker and the rate).

A queue with neither costs nothing: the recorder asks `written` once a batch, which returns at once while no
queue we serve has one; and a batch of successes alone costs no statement for a queue whose breaker is closed
and whose rate is the configured one (rules.breaker.quiet)."""

import logging
from collections.abc import Sequence
from typing import Any

from ..rules.breaker import Seen, quiet, watched
from ..rules.job import Ending
from ..rules.states import Outcome
from ..store.stores import Store

log = logging.getLogger("queueprocessor.node")

FAILED = (Outcome.FAILED, Outcome.TIMEOUT)


class FlowCount:
    """`watched` is replaced whole by the heartbeat (its owner) when the queue settings change; the result writer
    reads it once a batch."""

    def __init__(self, store: Store, period: float):
        self.store, self.period = store, period
        self.watched: dict[str, dict[str, Any]] = {}  # queue -> its settings row, those with a breaker or AIMD

    def watch(self, settings: dict[str, dict[str, Any]]) -> None:
        """The queue settings as the heartbeat last read them."""
        self.watched = {name: row for name, row in settings.items() if watched(row)}

    def written(self, endings: Sequence[Ending], states: Sequence[str | None]) -> None:
        """These endings were written (None: refused by the fence, not counted)."""
        rows = self.watched
        if not rows:
            return
        counts: dict[str, list[int]] = {}
        for ending, state in zip(endings, states):
            if state is None or ending.job.queue not in rows:
                continue
            seen = counts.setdefault(ending.job.queue, [0, 0, 0])
            if ending.throttled:
                seen[1] += 1
            elif ending.outcome in FAILED:
                seen[0] += 1
            elif ending.outcome == Outcome.SUCCEEDED:
                seen[2] += 1
        batch = {q: Seen(*n) for q, n in counts.items() if n[0] or n[1] or not quiet(rows[q])}
        if not batch:
            return
        try:
            self.store.breakers.note(batch, self.period)
        except Exception as exc:  # the database is away: these counts are lost, the jobs' endings are not
            log.warning("could not count endings for the breakers of %s (%s)", ", ".join(sorted(batch)), exc)
