"""Fair shares and limits per key (docs/design.md §9, "Fair shares"): what a job's fairness key, weight and cost may
be, and the unit of the virtual time that orders a fair queue.

A fair queue orders its waiting jobs by a virtual start tag, given each job as it is enqueued: the later of the
queue's virtual time now (the least tag still waiting) and the tag of its key's last waiting job plus that job's
cost over its weight. Keys with work waiting then take turns by weight, whatever each enqueues: the store computes
the tag (store/sql/fair.py) and the claim reads the queue's jobs in tag order, as it reads any queue in age order.
Everything here is pure: it checks what people type, so the CLI, the API and the app refuse the same input in the
same words.
"""

import math
import re
from dataclasses import dataclass

from .errors import BadJobInput, BadQueueInput
from .queues import MAX_ORDER_KEY

MAX_FAIR_KEY = MAX_ORDER_KEY  # qp_jobs.fair_key is String(200)
MAX_WEIGHT = 1000.0
MAX_COST = 1000
# Virtual seconds a job of cost 1 and weight 1 moves its key's tags on: small, so that tags stay near the database
# time a queue's first tags start from (see store/sql/fair.py), and the order between keys is what counts.
STEP = 0.001
# Where a queue takes the fairness key of a job enqueued without one (qp_queues.fair_from): its order key, or a
# top-level field of its JSON payload ("payload.tenant").
ORDER_KEY = "order_key"
PAYLOAD = "payload."
_FIELD = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")


def check_fair_key(key: object) -> str | None:
    """A fairness key as given (any text up to MAX_FAIR_KEY characters; None: the job has none), or BadJobInput."""
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_FAIR_KEY:
        raise BadJobInput.out_of("fair_key", key, f"text of 1 to {MAX_FAIR_KEY} characters")
    return key


def check_weight(weight: object) -> float | None:
    """A fairness key's weight as this job gives it: a number above 0, at most MAX_WEIGHT (None: 1)."""
    if weight is None:
        return None
    if (
        isinstance(weight, bool)
        or not isinstance(weight, (int, float))
        or not math.isfinite(weight)
        or not 0 < weight <= MAX_WEIGHT
    ):
        raise BadJobInput.out_of("fair_weight", weight, f"a number above 0 and at most {MAX_WEIGHT:g}")
    return float(weight)


def check_fair_from(source: object) -> str | None:
    """Where a queue takes a keyless job's fairness key: "order_key", or "payload.FIELD" (a top-level field of its
    JSON payload: 1 to 64 letters, digits, '_' or '-'); None: nowhere (the job has none). BadQueueInput else."""
    if source is None:
        return None
    field = source.removeprefix(PAYLOAD) if isinstance(source, str) and source.startswith(PAYLOAD) else None
    if source != ORDER_KEY and (field is None or not _FIELD.match(field)):
        raise BadQueueInput.out_of("fair_from", source, f"{ORDER_KEY!r} or 'payload.FIELD', e.g. 'payload.tenant'")
    return str(source)


def check_cost(cost: object) -> int | None:
    """How many units of its key's limit a job holds while it runs: a whole number from 1 to MAX_COST (None: 1)."""
    if cost is None:
        return None
    if isinstance(cost, bool) or not isinstance(cost, int) or not 1 <= cost <= MAX_COST:
        raise BadJobInput.out_of("cost", cost, f"a whole number from 1 to {MAX_COST}")
    return cost


def step(cost: int | None, weight: float | None) -> float:
    """How far one job moves its key's virtual time: its cost over its weight, in STEP units."""
    return STEP * (cost or 1) / (weight or 1.0)


@dataclass(frozen=True)
class KeyUse:
    """One fairness key of a queue as operators see it (Farm.queue_keys): the units its running jobs hold, its jobs
    waiting, and, with a rate per key, the tokens its bucket holds now (None without one)."""

    key: str
    running: int
    waiting: int
    tokens: float | None = None
