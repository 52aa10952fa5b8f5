"""The job: what the farm stores and runs, below every other floor. A job to enqueue (JobSpec) with the options
every kind of work takes alike (JobOptions), checked for form (work_spec: payload, `after`, bounds); a job claimed
(Claimed), with the fence every later write must quote; and how one run of it ended (Ending). The store, the
node, the executors, the Farm, the CLI and the app all speak in these."""

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple, NoReturn, TypedDict, Unpack, cast

from .errors import BadJobInput, InvalidJob
from .fairness import check_cost, check_fair_key, check_weight
from .keys import KeyTerms, key_terms
from .kinds import HTTP, kind_of
from .limits import MAX_ATTEMPTS, MAX_INT, MAX_PAYLOAD
from .queues import DEFAULT, check_name, check_order_key
from .states import JobState, Kind, Outcome
from .tracecontext import check_traceparent


@dataclass(frozen=True)
class JobSpec:
    """What to run; validated by the executors before it reaches the database."""

    executor: str
    target: str
    method: str = "GET"
    payload: str | None = None
    priority: int = 0
    max_attempts: int = MAX_ATTEMPTS
    timeout: float | None = None
    key: str | None = None
    kind: str = Kind.JOB  # or SINGLETON (see singletons)
    origin: str | None = None  # who enqueued it
    queue: str = DEFAULT
    order_key: str | None = None  # jobs of one key in one queue run one at a time, in enqueue order
    after: tuple[int, ...] = ()  # jobs it waits for (store/dependencies.py): it runs once they have succeeded
    after_ended: bool = False  # or once they have ended, whatever their outcome
    fair_key: str | None = None  # whose share of a fair queue it takes, and whose per-key limit it counts in
    fair_weight: float | None = None  # that key's weight (None: 1): a key of weight 2 gets twice the share
    cost: int | None = None  # units of its key's limit it holds while it runs (None: 1)
    terms: KeyTerms = KeyTerms()  # how long it holds `key`, and what its enqueue does if the key is held
    traceparent: str | None = None  # the W3C trace context it was enqueued under (docs/design.md §12)


class Claimed(NamedTuple):
    """A job this machine now owns, with the fence token every later write must quote (a tuple: a busy node makes
    thousands a second, straight from the claim's rows)."""

    id: int
    executor: str
    target: str
    method: str
    payload: str | None
    attempts: int
    max_attempts: int
    timeout: float | None
    fence: int
    run_at: float
    priority: int = 0
    kind: str = Kind.JOB
    queue: str = DEFAULT
    cancel_requested: bool = False  # a claim ends such a job cancelled, never hands it on (JobStore.claim)

    @property
    def exhausted(self) -> bool:
        """Claimed back from a lost lease on its last attempt: fail it, do not run it."""
        return self.kind != Kind.SINGLETON and self.attempts > self.max_attempts


class Ending(NamedTuple):
    """How one run ended, as the runner reports it (see RunStore.finish); a tuple, as a busy node makes thousands a
    second. `throttled`: the target answered 429 or 503 (whether the job snoozed or failed)."""

    job: Claimed
    outcome: Outcome  # SUCCEEDED, FAILED, TIMEOUT, CANCELLED or SNOOZED
    error: str | None = None
    retry_in: float | None = None  # requeue after this long, if attempts are left (SNOOZED: the snooze's delay)
    output: str | None = None
    throttled: bool = False

    @property
    def state(self) -> JobState:
        """The job's state after this ending (a snooze's: queued, unless the store finds it snoozed too often)."""
        if self.job.kind == Kind.SINGLETON and self.outcome != Outcome.CANCELLED and self.retry_in is not None:
            return JobState.QUEUED
        if self.outcome == Outcome.SUCCEEDED:
            return JobState.SUCCEEDED
        if self.outcome == Outcome.CANCELLED:
            return JobState.CANCELLED
        if self.outcome == Outcome.SNOOZED:
            return JobState.QUEUED
        again = self.retry_in is not None and self.job.attempts < self.job.max_attempts
        return JobState.QUEUED if again else JobState.FAILED


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


class JobOptions(TypedDict, total=False):
    """What every kind of work takes alike, with one meaning and one default (JobSpec's): the Farm's enqueue_*
        and *_spec calls, schedules, singletons, the CLI and the app pass these through unchanged. `queue` names the
        queue it waits in; jobs with the same `order_key` in one queue run one at a time, in the order they were
        enqueued; it runs once the jobs `after` names have succeeded (with `after_ended`: have ended, whatever the
        outcome). `fair_key` names whose share of a fair queue it takes (`fair_weight`: that key's weight) and whose
        per-key limit it counts in, holding `cost` units of it (rules/fairness.py). A job with a `key` holds it as
    `key_scope`, `key_until` or `key_for` say, and its enqueue settles a conflict as `on_conflict` says, or moves the
    waiting job of its key by `debounce`, up to `max_delay` (rules/keys.py). `method` is an HTTP job's. `traceparent`
    (W3C) names the trace its runs join (docs/design.md §12); none given, the Farm takes the current one, if any."""

    method: str
    priority: int
    max_attempts: int
    timeout: float | None
    key: str | None
    queue: str
    order_key: str | None
    after: Iterable[int]
    after_ended: bool
    fair_key: str | None
    fair_weight: float | None
    cost: int | None
    key_scope: str | None
    key_until: float | None
    key_for: float | None
    on_conflict: str | None
    debounce: float | None
    max_delay: float | None
    traceparent: str | None


def work_spec(executor: str, target: str, *, payload: str | None = None, **options: Unpack[JobOptions]) -> JobSpec:
    """A job definition checked for form; `payload` is JSON text; `options` as JobOptions says (a None leaves an
    option at its default)."""
    given = cast(JobOptions, {name: value for name, value in options.items() if value is not None})
    max_attempts = given.get("max_attempts", MAX_ATTEMPTS)
    priority = given.get("priority", 0)
    timeout = given.get("timeout")
    after_ended = given.get("after_ended", False)
    if not 1 <= max_attempts <= MAX_INT:
        raise BadJobInput.out_of("max_attempts", max_attempts, f"from 1 to {MAX_INT}")
    if not -MAX_INT <= priority <= MAX_INT:
        raise BadJobInput.out_of("priority", priority, f"from {-MAX_INT} to {MAX_INT}")
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
        raise BadJobInput.out_of("timeout", timeout, "a positive number of seconds")
    spec = JobSpec(
        executor=executor,
        target=target,
        method=given.get("method", "GET").upper(),
        payload=parse_payload(payload),
        priority=priority,
        max_attempts=max_attempts,
        timeout=timeout,
        key=given.get("key"),
        queue=check_name(given.get("queue", DEFAULT)),
        order_key=check_order_key(given.get("order_key")),
        after=check_after(given.get("after", ()), after_ended),
        after_ended=after_ended,
        fair_key=check_fair_key(given.get("fair_key")),
        fair_weight=check_weight(given.get("fair_weight")),
        cost=check_cost(given.get("cost")),
        terms=key_terms(
            given.get("key"),
            key_scope=given.get("key_scope"),
            key_until=given.get("key_until"),
            key_for=given.get("key_for"),
            on_conflict=given.get("on_conflict"),
            debounce=given.get("debounce"),
            max_delay=given.get("max_delay"),
        ),
        traceparent=check_traceparent(given.get("traceparent")),
    )
    kind_of(spec.executor).check(spec.target, spec.method)
    if spec.method != "GET" and spec.executor != HTTP.name:  # GET: the column's default, what every kind holds
        raise BadJobInput("{0} is for http work only: {part} work takes none", "method", part=spec.executor)
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
