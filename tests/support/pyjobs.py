"""Python callables for the tests' nodes to run (module prefix tests.support.pyjobs).

Each records what it saw in SEEN (by job id) so a test in the same process can
check what the node passed in and when the work noticed its cancellation flag.
"""

import asyncio
import os
import random
import threading
import time
from pathlib import Path

import aiohttp  # for batch_call: imported with this module (off the node's loop), not by its first call

from queueprocessor import job

SEEN: dict[int, dict] = {}


@job(max_attempts=1)
def echo(payload, context):
    SEEN[context.job_id] = {
        "payload": payload,
        "attempt": context.attempt,
        "fence": context.fence,
        "machine": context.machine_id,
    }
    return {"echo": payload}


def fail(payload, context):
    raise ValueError(f"bad input {payload!r}")


def wait_for_cancel(payload, context):
    """Works until told to stop through its flag; records when it noticed."""
    SEEN[context.job_id] = {"started": time.monotonic()}
    while not context.cancelled.wait(0.01):
        pass
    SEEN[context.job_id]["noticed"] = time.monotonic()
    return "stopped"


def noop(payload, context):
    return None


not_callable = 42


def nap(payload, context):
    """Sleeps `payload` seconds: work that takes a little while."""
    time.sleep(payload)


async def echo_async(payload, context):
    """An async job: runs on the node's event loop."""
    await asyncio.sleep(0)
    return {"echo": payload, "job": context.job_id}


async def sleep_async(payload, context):
    """Sleeps until cancelled; records that it saw the cancellation."""
    SEEN[context.job_id] = {"started": time.monotonic()}
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        SEEN[context.job_id]["noticed"] = time.monotonic()
        raise


CALLS: list[dict] = []  # stubborn's calls, in order: job, fence, machine, started, ended (monotonic)


def stubborn(payload, context):
    """Works payload[n] seconds on its n-th call for the job (0 once the list runs out) and never looks at its
    cancellation flag: a function no stop reaches."""
    record = {
        "job": context.job_id,
        "fence": context.fence,
        "machine": context.machine_id,
        "started": time.monotonic(),
        "ended": None,
    }
    calls = sum(1 for call in CALLS if call["job"] == context.job_id)
    CALLS.append(record)
    time.sleep(payload[calls] if calls < len(payload) else 0)
    record["ended"] = time.monotonic()


def overlapping(calls: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs of calls of one job, on different fences, that were under way at the same time."""
    now = time.monotonic()
    return [
        (a, b)
        for i, a in enumerate(calls)
        for b in calls[i + 1 :]
        if a["job"] == b["job"]
        and a["fence"] != b["fence"]
        and a["started"] < (b["ended"] or now)
        and b["started"] < (a["ended"] or now)
    ]


# Batch functions (@job(batch=N)): each call is recorded in BATCHES, in order, as the job ids it was given.
BATCHES: list[list[int]] = []
IN_FLIGHT = {"jobs": 0, "most": 0, "calls": 0, "most_calls": 0, "keys": set(), "overlaps": []}
_in_flight = threading.Lock()


@job(batch=20, max_attempts=1)
def batch_each(payloads, contexts):
    """One entry per job: a payload {"fail": msg} fails its job with ValueError(msg); any other is echoed."""
    BATCHES.append([c.job_id for c in contexts])
    return [
        ValueError(p["fail"]) if isinstance(p, dict) and "fail" in p else {"echo": p, "job": c.job_id}
        for p, c in zip(payloads, contexts)
    ]


@job(batch=20, max_attempts=3)
def batch_raise(payloads, contexts):
    """Fails every job of the call."""
    BATCHES.append([c.job_id for c in contexts])
    raise RuntimeError(f"all {len(payloads)} at once")


@job(batch=20)
async def batch_async(payloads, contexts):
    """An async batch function: returns one value for all."""
    BATCHES.append([c.job_id for c in contexts])
    await asyncio.sleep(0)
    return {"batch": len(payloads)}


@job(batch=20)
def batch_busy(payloads, contexts):
    """Works 50 ms, counting how many jobs and calls (in IN_FLIGHT, across every node of the process) and which order
    keys (payload {"key": k}) are inside a call at once; a key in two calls at once, or twice in one, is an overlap."""
    BATCHES.append([c.job_id for c in contexts])
    keys = [p["key"] for p in payloads if isinstance(p, dict) and "key" in p]
    with _in_flight:
        IN_FLIGHT["jobs"] += len(payloads)
        IN_FLIGHT["most"] = max(IN_FLIGHT["most"], IN_FLIGHT["jobs"])
        IN_FLIGHT["calls"] += 1
        IN_FLIGHT["most_calls"] = max(IN_FLIGHT["most_calls"], IN_FLIGHT["calls"])
        clash = [k for k in keys if k in IN_FLIGHT["keys"]] + [k for k in set(keys) if keys.count(k) > 1]
        IN_FLIGHT["overlaps"].extend(clash)
        IN_FLIGHT["keys"].update(keys)
    time.sleep(0.05)
    with _in_flight:
        IN_FLIGHT["jobs"] -= len(payloads)
        IN_FLIGHT["calls"] -= 1
        IN_FLIGHT["keys"].difference_update(keys)


@job(batch=20, timeout=0.5, max_attempts=1)
async def batch_sleep_async(payloads, contexts):
    """Sleeps until cancelled (its timeout, or every job of it stopped); records that it saw the cancellation."""
    BATCHES.append([c.job_id for c in contexts])
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        for c in contexts:
            SEEN[c.job_id] = {"noticed": True, "context": c}  # its flag is set as the cancellation goes up
        raise


@job(batch=20, max_attempts=1)
def batch_until_cancelled(payloads, contexts):
    """Works until some job of the call is told to stop (or 10 s pass); records, per job, whether its flag was set;
    returns a result for each."""
    BATCHES.append([c.job_id for c in contexts])
    deadline = time.monotonic() + 10
    while not any(c.cancelled.is_set() for c in contexts) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # the others' flags, had they been set too
    for c in contexts:
        SEEN[c.job_id] = {"cancelled": c.cancelled.is_set()}
    return [{"job": c.job_id} for c in contexts]


@job(batch=8, max_attempts=5)
async def batch_call(payloads, contexts):
    """Calls the HTTP service each payload names ({"url", "method"?, "body"?}), one request per job of the call, all
    at once, each with its job's X-QP-Job, -Attempt, -Fence and -Machine headers as an HTTP job's request carries
    them: the service's record (tests/support/httptarget.py) judges a batch function's jobs as it judges HTTP jobs.
    A job told to stop (its flag, looked at every 10 ms) has its request cut, as the whole call's are when it is
    cancelled; each job ends by its own answer (anything but 200 fails it). Each URL gets `call=` the call's first
    job id, so the record also says which jobs were called together."""
    call = contexts[0].job_id
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)) as session:
        return await asyncio.gather(*(_call(session, p, c, call) for p, c in zip(payloads, contexts)))


def called_together(requests: list[dict]) -> dict[int, list[dict]]:
    """batch_call's requests (HttpTarget.requests) by the call that sent them."""
    calls: dict[int, list[dict]] = {}
    for request in requests:
        calls.setdefault(int(request["path"].rsplit("call=", 1)[1]), []).append(request)
    return calls


async def _call(session, payload, context, call):
    headers = {
        "X-QP-Job": str(context.job_id),
        "X-QP-Attempt": str(context.attempt),
        "X-QP-Fence": str(context.fence),
        "X-QP-Machine": str(context.machine_id),
    }
    request = asyncio.ensure_future(_request(session, payload, headers, call))
    try:
        while not request.done():
            if context.cancelled.is_set():
                return RuntimeError("stopped")
            await asyncio.wait({request}, timeout=0.01)
        return request.result()
    finally:
        request.cancel()  # a stopped job's, or the whole call's when it is cancelled: the service sees a hang-up


async def _request(session, payload, headers, call):
    try:
        method, body, url = payload.get("method", "GET"), payload.get("body"), payload["url"]
        url += f"{'&' if '?' in url else '?'}call={call}"
        async with session.request(method, url, data=body, headers=headers) as response:
            await response.read()
            return {"status": 200} if response.status == 200 else RuntimeError(f"HTTP {response.status}")
    except aiohttp.ClientError as exc:
        return exc


def parents(payload, context):
    """Returns what the jobs it ran after returned (context.results()), as the next step would read them."""
    return context.results()


def _wait_for_gate(path, context):
    """Until the file at `path` exists (at most 120 s, longer than a test waits for anything) or the run is stopped."""
    gate = Path(path)
    deadline = time.monotonic() + 120
    while not gate.exists() and time.monotonic() < deadline and not context.cancelled.wait(0.02):
        pass


def halfway(payload, context):
    """Says it is half way, then waits for the file `payload` names and ends: a run whose progress a test reads
    while it runs."""
    context.progress(0.5, "half way")
    _wait_for_gate(payload, context)
    return "through the gate"


def log_record(payload, context):
    """A log record's processing (docs/sql-enqueue.md): a short wait of its own length, then a line "request seq" on
    the file QP_TEST_RECORDS names, so a test reads the order the farm processed each request's records in."""
    time.sleep(random.uniform(0, 0.02))
    with open(os.environ["QP_TEST_RECORDS"], "a") as out:
        out.write(f"{payload['request']} {payload['seq']}\n")


def chatty(payload, context):
    """Reports its progress 10,000 times as fast as it can, then waits for the file `payload` names: a job whose
    reports the node must coalesce."""
    for n in range(1, 10_001):
        context.progress(n / 10_000, f"step {n}")
    _wait_for_gate(payload, context)


# Snoozes (context.snooze): each job's runs counted in SNOOZED, by job id.
SNOOZED: dict[int, list[int]] = {}


@job(max_attempts=1)
def snooze_twice(payload, context):
    """Snoozes its first two runs for `payload` seconds, then succeeds (one attempt: a spent one would fail it)."""
    runs = SNOOZED.setdefault(context.job_id, [])
    runs.append(context.attempt)
    if len(runs) <= 2:
        context.snooze(payload, "not yet")
    return {"runs": len(runs)}


@job(max_attempts=1)
async def snooze_twice_async(payload, context):
    """snooze_twice, as an async def."""
    await asyncio.sleep(0)
    return snooze_twice(payload, context)


@job(batch=20, max_attempts=1)
def batch_snooze_odd(payloads, contexts):
    """One entry per job: a job with an odd payload snoozes (`Snooze(0.2)`) on its first run, the others succeed."""
    from queueprocessor.executors import Snooze

    BATCHES.append([c.job_id for c in contexts])
    entries: list[object] = []
    for p, c in zip(payloads, contexts):
        runs = SNOOZED.setdefault(c.job_id, [])
        runs.append(c.attempt)
        entries.append(Snooze(0.2, "odd") if p % 2 and len(runs) == 1 else {"job": c.job_id})
    return entries


@job(batch=20, max_attempts=1)
def batch_snooze_all(payloads, contexts):
    """Raises a snooze (0.2 s) out of the call the first time it sees its jobs: every job of the call snoozes."""
    BATCHES.append([c.job_id for c in contexts])
    first = [len(SNOOZED.setdefault(c.job_id, [])) == 0 for c in contexts]
    for c in contexts:
        SNOOZED[c.job_id].append(c.attempt)
    if all(first):
        contexts[0].snooze(0.2, "all of them")
    return {"batch": len(payloads)}


# Traces (docs/design.md §12): what a job sees of its run's span, as the current OpenTelemetry context and as
# context.traceparent (tests/acceptance/test_traces.py).
def _current_trace() -> str | None:
    from opentelemetry import trace

    from queueprocessor.tracing import traceparent_of

    return traceparent_of(trace.get_current_span())


def seen_trace(payload, context):
    return {"current": _current_trace(), "context": context.traceparent}


async def seen_trace_async(payload, context):
    await asyncio.sleep(0)
    return {"current": _current_trace(), "context": context.traceparent}


@job(batch=5)
def seen_trace_batch(payloads, contexts):
    """A batch call: each job's own span in its context; no context current during the call."""
    return [{"current": _current_trace(), "context": c.traceparent} for c in contexts]
