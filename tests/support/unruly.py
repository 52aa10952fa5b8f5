"""Python jobs that misbehave towards the node that runs them (module prefix tests.support.unruly): they exit, raise
what is not an Exception, cancel themselves, or block the node's event loop. Each must end its own run alone."""

import asyncio
import sys
import time

from queueprocessor import job


def exits(payload, context):
    sys.exit(3)


def interrupts(payload, context):
    raise KeyboardInterrupt


async def exits_async(payload, context):
    await asyncio.sleep(0)
    sys.exit(4)


@job(batch=4)
def exits_in_batch(payloads, contexts):
    sys.exit(5)


async def cancels_itself(payload, context):
    """The issue's case: it awaits a task it cancelled, so a CancelledError reaches the node from the job itself."""
    task = asyncio.create_task(asyncio.sleep(9))
    task.cancel()
    await task


async def reads_results_on_the_loop(payload, context):
    return context.results()


async def blocks_the_loop(payload, context):
    time.sleep(payload)
    return "blocked"
