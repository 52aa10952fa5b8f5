"""The kinds of event the farm logs (docs/design.md §11), one spelling each: what `events --kind` filters on (a kind,
or the part before its dot: `machine`, `queue`, `schedule`, `jobs`, `database`)."""

import re
from enum import StrEnum

FAMILIES = ("machine", "database", "queue", "schedule", "jobs")  # the kinds' first parts, as --kind takes them
_MACHINE = re.compile(r" #(\d+)$")


class EventKind(StrEnum):
    """qp_events.kind."""

    MACHINE_JOINED = "machine.joined"
    MACHINE_LEFT = "machine.left"  # stopped (after draining, or handing its jobs back)
    MACHINE_DEAD = "machine.dead"  # judged dead by a peer (the actor), which stored the verdict
    MACHINE_BACK = "machine.back"  # checked in again after it was judged dead
    MACHINE_FENCED = "machine.fenced"  # stopped its own jobs before their leases ran out, cut off from the database
    MACHINE_ASKED = "machine.asked"  # an operator asked it to pause, resume or drain (the detail says which)
    MACHINE_PAUSED = "machine.paused"  # it applied the wish (or began to drain, as it stopped)
    MACHINE_RESUMED = "machine.resumed"
    MACHINE_DRAINING = "machine.draining"
    DATABASE_OUTAGE = "database.outage"  # a node could not reach the database for a while (a restart, a failover)
    QUEUE_PAUSED = "queue.paused"
    QUEUE_RESUMED = "queue.resumed"
    QUEUE_LIMITED = "queue.limited"  # its farm-wide limit set or lifted
    QUEUE_RATED = "queue.rated"  # its rate set or lifted
    QUEUE_ON_FAILURE = "queue.on_failure"  # its order keys' failure policy changed
    QUEUE_FAIR = "queue.fair"  # fair share by key turned on or off
    QUEUE_KEY_LIMITED = "queue.key_limited"  # its limit per key set or lifted
    QUEUE_KEY_RATED = "queue.key_rated"  # its rate per key set or lifted
    QUEUE_KEEP = "queue.keep"  # how long its finished jobs are kept, set or back to the farm's default
    QUEUE_BREAKER = "queue.breaker"  # its breaker (and cool-down) set or removed, or reset by an operator
    QUEUE_ADAPTIVE = "queue.adaptive"  # its adaptive rate set or removed
    QUEUE_BREAKER_OPENED = "queue.breaker_opened"  # its failures opened its breaker (or a canary's reopened it)
    QUEUE_BREAKER_RAMP = "queue.breaker_ramp"  # a canary passed: its rate ramps back up
    QUEUE_BREAKER_CLOSED = "queue.breaker_closed"  # the ramp ended (or a canary passed, for a queue with no rate)
    QUEUE_RATE_ADAPTED = "queue.rate_adapted"  # its current rate cut or raised (the detail has old and new)
    SCHEDULE_ADDED = "schedule.added"
    SCHEDULE_EDITED = "schedule.edited"
    SCHEDULE_RUN = "schedule.run"  # run now, once, by hand
    SCHEDULE_PAUSED = "schedule.paused"
    SCHEDULE_RESUMED = "schedule.resumed"
    SCHEDULE_REMOVED = "schedule.removed"
    SCHEDULE_SKIPPED = "schedule.skipped"  # occurrences cancelled by its overlap policy (the detail says why)
    SCHEDULE_STOPPED = "schedule.stopped"  # its running run asked to stop by overlap=cancel-previous
    SCHEDULE_BACKFILLED = "schedule.backfilled"  # past occurrences made into jobs by an operator's backfill
    JOBS_BULK = "jobs.bulk"  # a bulk retry, cancel or delete: the detail has its filter and count


def machine_label(name: str, machine_id: int) -> str:
    """A machine as an event names it (subject or actor): its name and id (names repeat across restarts)."""
    return f"{name} #{machine_id}"


def machine_in(label: str) -> int | None:
    """The id of the machine a label names (machine_label), or None for any other subject."""
    found = _MACHINE.search(label)
    return int(found.group(1)) if found else None
