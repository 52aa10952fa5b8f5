"""Work as a farm takes it: a job definition checked for form, and payloads as JSON text.

The Farm's enqueue, schedule and singleton calls check work here, and so do a schedule's edits
(schedulesteer.py), which sit under the Farm: so these live apart from it.
"""

import json
import math
from collections.abc import Iterable
from typing import NoReturn

from .rules.allow import check_form
from .rules.errors import BadJobInput, InvalidJob
from .rules.limits import MAX_ATTEMPTS, MAX_INT, MAX_PAYLOAD
from .rules.queues import DEFAULT, check_name, check_order_key
from .store.types import JobSpec

MAX_ID = 2**63 - 1  # ids are 64-bit


def parse_payload(text: str | None) -> str | None:
    """Check that a payload is JSON within the size limit; return it normalised."""
    if text is None or text == "":
        return None
    try:
        size = len(text.encode())
    except UnicodeEncodeError:  # bytes that were not UTF-8 on the command line arrive as lone surrogates
        raise InvalidJob("payload is not valid UTF-8 text") from None
    if size > MAX_PAYLOAD:
        raise InvalidJob(
            f"payload is {size} bytes, over the {MAX_PAYLOAD} byte limit: "
            "store large data elsewhere and pass a reference"
        )
    try:
        return json.dumps(json.loads(text, parse_constant=_not_json), separators=(",", ":"))
    except json.JSONDecodeError as error:
        raise BadJobInput(
            "payload is not valid JSON ({limit}): quote it, e.g. {0} '{{\"id\": 1}}'",
            "payload",
            limit=f"{error.msg} at line {error.lineno} column {error.colno}",
        ) from None
    except RecursionError:
        raise InvalidJob("payload is not usable JSON: it is nested too deeply") from None


def _not_json(constant: str) -> NoReturn:
    raise json.JSONDecodeError(f"{constant} is not JSON (use null or a string)", constant, 0)


def to_json(value: object) -> str | None:
    """A Python payload as JSON text (None stays None: no payload)."""
    if value is None:
        return None
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as error:
        raise InvalidJob(f"payload cannot be sent as JSON: {error}") from None


def work_spec(
    executor: str,
    target: str,
    *,
    method: str = "GET",
    payload: str | None = None,
    priority: int = 0,
    max_attempts: int = MAX_ATTEMPTS,
    timeout: float | None = None,
    key: str | None = None,
    queue: str = DEFAULT,
    order_key: str | None = None,
    after: Iterable[int] = (),
    after_ended: bool = False,
) -> JobSpec:
    """A job definition checked for form; `payload` is JSON text. `queue` names the queue it waits in; jobs
    with the same `order_key` in one queue run one at a time, in the order they were enqueued. It runs once the
    jobs `after` names have succeeded (with `after_ended`: have ended, whatever the outcome)."""
    if not 1 <= max_attempts <= MAX_INT:
        raise BadJobInput.out_of("max_attempts", max_attempts, f"from 1 to {MAX_INT}")
    if not -MAX_INT <= priority <= MAX_INT:
        raise BadJobInput.out_of("priority", priority, f"from {-MAX_INT} to {MAX_INT}")
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
        raise BadJobInput.out_of("timeout", timeout, "a positive number of seconds")
    spec = JobSpec(
        executor=executor,
        target=target,
        method=method.upper(),
        payload=parse_payload(payload),
        priority=priority,
        max_attempts=max_attempts,
        timeout=timeout,
        key=key,
        queue=check_name(queue),
        order_key=check_order_key(order_key),
        after=check_after(after, after_ended),
        after_ended=after_ended,
    )
    check_form(spec)
    return spec


def check_after(after: Iterable[int], after_ended: bool) -> tuple[int, ...]:
    """The ids a job runs after, checked for form (whether they exist, the store checks as it enqueues)."""
    ids = tuple(after)
    for job_id in ids:
        if isinstance(job_id, bool) or not isinstance(job_id, int) or not 1 <= job_id <= MAX_ID:
            raise BadJobInput("{0} names jobs by their ids, whole numbers from 1 (got {value})", "after", value=job_id)
    if after_ended and not ids:
        raise BadJobInput("{0} needs {1}: the jobs whose end it waits for", "after_ended", "after")
    return tuple(sorted(set(ids)))
