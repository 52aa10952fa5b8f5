"""The executor interface: how a node runs one kind of work.

An executor validates a job before it is stored (bad work is refused at the
door with a clear reason) and again when it runs (allow-lists are the running
node's). `run` is a coroutine so a timeout or a lost lease can cancel it.
"""

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ..store import Claimed, JobSpec


@dataclass
class JobContext:
    """What a running job may know about itself; `cancelled` is set when it must stop."""

    job_id: int
    attempt: int
    fence: int
    machine_id: int
    cancelled: threading.Event = field(default_factory=threading.Event)


class JobFailed(Exception):
    """The work ran and did not succeed; the message is the run's error, `output` what it printed.
    `permanent`: no retry could succeed (the callable does not exist, the host is not allowed), so the job
    fails at once instead of backing off through its attempts."""

    def __init__(self, message: str, output: str | None = None, permanent: bool = False):
        super().__init__(message)
        self.output = output
        self.permanent = permanent


OUTPUT_LIMIT = 4000  # characters of output kept with a run (the end: that is where errors are)


def excerpt(text: str | None) -> str | None:
    if not text:
        return None
    return text if len(text) <= OUTPUT_LIMIT else "…" + text[-OUTPUT_LIMIT:]


class Executor(ABC):
    name: str

    @abstractmethod
    def validate(self, spec: JobSpec) -> None:
        """Raise InvalidJob with a clear reason if this node would refuse to run `spec`."""

    @abstractmethod
    async def run(self, job: Claimed, context: JobContext) -> str | None:
        """Do the work. Return an output excerpt; raise JobFailed (or anything) when it fails."""
