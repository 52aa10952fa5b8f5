"""The words the farm stores for states, one spelling each (as apscheduler's _enums.py does).

Each is a StrEnum: a member is the very string the database holds, so rows read back compare equal to
them as they are, and a misspelt state is a NameError instead of a query that silently matches nothing.
schema.STATE_SQL derives the SQL text of job states from JobState.
"""

from enum import StrEnum


class JobState(StrEnum):
    """qp_jobs.state. WAITING: enqueued after other jobs (store/dependencies.py), not due until they end."""

    WAITING = "waiting"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


# A job in one of these is done with: retention may delete it, its key may be given up, a waiter may stop.
FINISHED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class Outcome(StrEnum):
    """qp_runs.outcome: how one attempt ended (or RUNNING while it has not)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    LOST = "lost"  # its machine lost the lease (died, was cut off, or handed the job back)
    SNOOZED = "snoozed"  # put back for later without spending an attempt (a 429 with Retry-After, context.snooze)


# How a run may end, each a count in the farm's history (store/stats.py) beside the jobs enqueued and started.
ENDINGS = tuple(outcome.value for outcome in Outcome if outcome != Outcome.RUNNING)
HISTORY_COUNTS = ("enqueued", "started", *ENDINGS)


class MachineState(StrEnum):
    """qp_machines.state. DEAD is judged from a row that stopped checking in; the first judge to find it dead
    stores it (a burial, see store/roster.py), so that its peers stop reading the row, until it checks in again."""

    ACTIVE = "active"
    PAUSED = "paused"
    DRAINING = "draining"
    STOPPED = "stopped"
    DEAD = "dead"


# The states a machine checks in under: its row's last_seen moves, so the heartbeat read watches it.
CHECKING_IN = (MachineState.ACTIVE, MachineState.PAUSED, MachineState.DRAINING)
# A live machine in one of these still takes work of the queues it serves (one draining finishes its own only):
# who `queue list` and the app show as serving a queue, and whose allow-lists an enqueue is checked against.
SERVING = (MachineState.ACTIVE, MachineState.PAUSED)


class Wish(StrEnum):
    """qp_machines.wish: what an operator asked a machine to do; the machine applies it itself."""

    PAUSE = "pause"
    RESUME = "resume"
    DRAIN = "drain"

    @property
    def leads_to(self) -> MachineState:
        return {Wish.PAUSE: MachineState.PAUSED, Wish.RESUME: MachineState.ACTIVE, Wish.DRAIN: MachineState.DRAINING}[
            self
        ]


class Kind(StrEnum):
    """qp_jobs.kind: a job runs until it ends; a singleton goes back to the queue whenever its run ends."""

    JOB = "job"
    SINGLETON = "singleton"
