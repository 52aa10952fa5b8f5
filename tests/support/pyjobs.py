"""Python callables for the tests' nodes to run (module prefix tests.support.pyjobs).

Each records what it saw in SEEN (by job id) so a test in the same process can
check what the node passed in and when the work noticed its cancellation flag.
"""

import asyncio
import time

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
