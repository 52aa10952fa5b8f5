"""Python callables for the tests' nodes to run (module prefix tests.support.pyjobs).

Each records what it saw in SEEN (by job id) so a test in the same process can
check what the node passed in and when the work noticed its cancellation flag.
"""

import time

from queueprocessor import job

SEEN: dict[int, dict] = {}


@job(max_attempts=1)
def echo(payload, context):
    SEEN[context.job_id] = {"payload": payload, "attempt": context.attempt, "fence": context.fence,
                            "machine": context.machine_id}
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
