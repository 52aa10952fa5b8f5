"""What an operator may set on a queue (Farm.set_queue, `queue set`), checked and made the columns of its qp_queues
row before anything is written (docs/design.md §9). Pure: the CLI, the API and the app refuse the same settings in
the same words."""

from typing import TypedDict

from .errors import BadQueueInput
from .fairness import check_fair_from
from .queues import OnFailure, Rate, check_keep, check_limit

# The settings of a breaker and an adaptive rate, made columns with the row they change (rules.breaker.flow_settings).
FLOW = ("breaker", "cool_down", "adaptive")


class QueueSettings(TypedDict, total=False):
    """Farm.set_queue's settings, each optional: one left out stays as it is; None removes one (where it can be)."""

    limit: int | None  # most of its jobs running at once across the farm
    rate: Rate | str | None  # most starts per unit of time across the farm, "10/s"
    on_failure: OnFailure | str  # what a job of an order key that failed for good does to the key's later jobs
    keep: float | str | None  # how long its finished jobs are kept, "3d" (None: the nodes' keep_jobs)
    fair: bool  # its claims share it across its jobs' fairness keys by weight
    key_limit: int | None  # most units (the jobs' costs) of one fairness key running at once
    key_rate: Rate | str | None  # most units of one fairness key started per unit of time, "5/s"
    fair_from: str | None  # where a job enqueued without a fairness key takes one: "order_key" or "payload.FIELD"
    breaker: str | None  # "5/60s": that many failures within that time stop its claims
    cool_down: float | str | None  # before each canary of an open breaker, "30s" (None: 30 s)
    adaptive: str | None  # a floor, "1/s": throttled endings lower its current rate down to it


def columns(given: QueueSettings, period: float) -> dict[str, object]:
    """The qp_queues columns for what is `given` (but the FLOW settings), each checked (BadQueueInput); `period`
    sizes a rate's bucket: what one period brings."""
    values: dict[str, object] = {}
    if "limit" in given:
        values["max_running"] = check_limit(given["limit"])
    if "rate" in given:
        values |= _rate(given["rate"], "rate", "rate", period) | dict(tokens=None, refilled_at=None, rate_set_per=None)
    if "on_failure" in given:
        values["on_failure"] = OnFailure.parse(given["on_failure"])
    if "keep" in given:
        values["keep"] = check_keep(given["keep"])
    if "fair" in given:
        if not isinstance(given["fair"], bool):
            raise BadQueueInput.out_of("fair", given["fair"], "True or False")
        values["fair"] = given["fair"]
    if "key_limit" in given:
        values["key_limit"] = check_limit(given["key_limit"], "key_limit")
    if "key_rate" in given:
        values |= _rate(given["key_rate"], "key_rate", "key_rate", period, burst="key_burst")
    if "fair_from" in given:
        values["fair_from"] = check_fair_from(given["fair_from"])
    return values


def _rate(text: object, what: str, prefix: str, period: float, burst: str = "burst") -> dict[str, object]:
    """A rate's columns (`prefix`_count, `prefix`_per and its bucket's size), all None to remove it."""
    parsed = None if text is None else Rate.parse(text, what)
    return {
        f"{prefix}_count": None if parsed is None else parsed.count,
        f"{prefix}_per": None if parsed is None else parsed.per_seconds,
        burst: None if parsed is None else parsed.burst(period),
    }
