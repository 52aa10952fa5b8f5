"""Keyed grabs: work named by key and instance (`Report-26` + `2026-11-22`) is done once.

The pair becomes the job's unique key `key@instance`, so the database refuses
a second copy whoever tries; the loser is told who won, where it ran and how
it ended, and can wait for the winner's result instead of doing the work again.
"""

import os
import socket
import time
from dataclasses import dataclass, replace
from typing import Any

from .rules.errors import DuplicateKey, InvalidJob, NotFound, QPError, echoed
from .rules.job import JobSpec
from .rules.output import format_time, machine_label
from .rules.states import FINISHED, JobState
from .store.stores import Store


def origin() -> str:
    """How this process signs the jobs it enqueues."""
    return f"{socket.gethostname()} pid {os.getpid()}"


def signed(spec: JobSpec) -> JobSpec:
    """`spec` signed by this process, unless it already names who enqueued it."""
    return spec if spec.origin else replace(spec, origin=origin())


def grab_key(key: str, instance: str) -> str:
    if not key or "@" in key or not instance or len(key) + len(instance) > 399:
        raise InvalidJob(
            f"grab key {echoed(key)} and instance {echoed(instance)} must be non-empty, the key "
            "without '@', together at most 399 characters"
        )
    return f"{key}@{instance}"


@dataclass(frozen=True)
class Holder:
    """The job that holds a key: who enqueued it, where it runs or ran, and how it ended."""

    job: dict[str, Any]
    machine: str | None  # "3 (node-b)": the machine that owns or last owned it
    output: str | None  # the last run's output excerpt

    @property
    def finished(self) -> bool:
        return self.job["state"] in FINISHED

    def status(self) -> str:
        job = self.job
        if job["state"] == JobState.QUEUED:
            return "queued, not started yet"
        if job["state"] == JobState.RUNNING:
            return f"running on machine {self.machine}, not finished"
        where = f" on machine {self.machine}" if self.machine else ""
        return f"finished, {job['state']}{where} at {format_time(job['finished_at'])} UTC"

    def describe(self) -> str:
        job = self.job
        return (
            f"{job['key']} was taken first by {job['origin'] or 'an unknown enqueuer'} (job {job['id']}): "
            f"{self.status()}"
        )


class AlreadyTaken(DuplicateKey):
    """A second enqueue or grab of a key: carries the winner."""

    def __init__(self, holder: Holder):
        QPError.__init__(self, holder.describe())
        self.key = holder.job["key"]
        self.holder = holder


def holder_of(store: Store, *, key: str | None = None, job_id: int | None = None) -> Holder | None:
    """The job holding `key` (or with that id), with the name of its machine and its last output."""
    job = store.jobs.keyed(key=key, job_id=job_id)
    if job is None:
        return None
    name, output = job.pop("machine_name"), job.pop("last_output")
    return Holder(job, None if job["owner"] is None else machine_label(name, job["owner"]), output)


def refuse(store: Store, error: DuplicateKey) -> AlreadyTaken | DuplicateKey:
    """Turn the database's refusal of a duplicate key into one that names the winner."""
    holder = holder_of(store, key=error.key)
    return error if holder is None else AlreadyTaken(holder)


def wait(store: Store, job_id: int, timeout: float | None = None, poll: float = 0.2) -> Holder:
    """Wait until a job has finished (succeeded, failed for good, or cancelled); return it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        holder = holder_of(store, job_id=job_id)
        if holder is None:
            raise NotFound(f"no job with id {job_id}", what="job", ref=job_id)
        if holder.finished:
            return holder
        if deadline is not None and time.monotonic() >= deadline:
            raise QPError(f"gave up waiting after {timeout:g} s: job {job_id} is {holder.status()}")
        time.sleep(poll)
