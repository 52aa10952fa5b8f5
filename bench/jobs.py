"""The Python jobs the benchmarks' nodes run (nodes allow the module prefix bench.jobs)."""

import time

from queueprocessor import job


def noop(payload, context):
    """Does nothing: what is measured is the farm, not the work."""


def stamp(payload, context):
    """Returns when it started, by the wall clock. On one host that is the database's clock too
    (PostgreSQL's clock_timestamp() reads the same system clock), so a benchmark can see when the
    work itself began, not when its start was written down."""
    return time.time()


def nap(payload, context):
    """Sleeps `payload` seconds: work that takes a while, as most real jobs do."""
    time.sleep(payload)


async def noop_async(payload, context):
    """Does nothing, on the node's event loop (an `async def` job)."""


# Batch functions: one call for every job a claim brings (up to batch=; a node's --capacity bounds a claim, so
# with batch at the most a node may hold, --capacity is what sets the size of a call).
@job(batch=10_000)
async def noop_batch(payloads, contexts):
    """Does nothing for a whole batch, on the node's event loop (`async def`)."""


@job(batch=10_000)
def noop_batch_plain(payloads, contexts):
    """Does nothing for a whole batch, in a worker thread."""
