"""Singletons and locks: named leases that one holder keeps for as long as it lives.

A singleton (continuous work, e.g. polling a feed) is a job of kind
`singleton` with the unique key `singleton:NAME`, so it rides on everything a
job has: one owner at a time by claim, a lease renewed with its machine's
heartbeat, a fence token, a run row per tenure. It never finishes: when its
work ends it goes back to the queue to start again, and when its machine
dies its lease runs out and the next turn-holder's claim takes it over.

A lock is the same kind of lease for code that is not a job:
`with farm.lock("name") as lock:` holds it, a thread renews it every
heartbeat, and `lock.fence` is a token a downstream service can use to
refuse a holder that lost it. `lock.lost` is set when no renewal got through
for the lease minus a margin: before the lease could pass to someone else,
even while a renewal hangs.
"""

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import replace
from typing import Any, cast

from .rules.errors import DuplicateKey, InvalidJob, NotFound, QPError, echoed
from .rules.job import JobSpec
from .rules.output import machine_label
from .rules.states import JobState, Kind
from .store.inserts import SINGLETON_PREFIX
from .store.stores import Store

log = logging.getLogger("queueprocessor.singletons")

FOREVER = 2**31 - 1  # a singleton never runs out of attempts


def add(store: Store, name: str, spec: JobSpec) -> int:
    """Define a singleton; the next turn-holder with room starts it. Refused while one of that name lives."""
    if not name or len(name) > 200 or name != name.strip():
        raise InvalidJob(f"singleton name {echoed(name)} must be 1-200 characters without surrounding spaces")
    key = SINGLETON_PREFIX + name
    # Never out of attempts or time, and bound to no order key or parent: a singleton runs on, whatever the spec says.
    spec = replace(
        spec,
        max_attempts=FOREVER,
        timeout=None,
        key=key,
        kind=Kind.SINGLETON,
        order_key=None,
        after=(),
        after_ended=False,
    )
    # A removed singleton of the same name keeps its history but gives its name up.
    store.jobs.free_key(key)
    try:
        return store.jobs.enqueue(spec)[0]
    except DuplicateKey:
        current = get(store, name)
        raise InvalidJob(f"singleton {echoed(name)} already exists ({_where(current)}): remove it first") from None


def get(store: Store, name: str) -> dict[str, Any]:
    job = store.jobs.keyed(key=SINGLETON_PREFIX + name)
    if job is None:
        raise NotFound(f"no singleton named {echoed(name)}", what="singleton", ref=name)
    return job


def list_all(store: Store) -> list[dict[str, Any]]:
    return [job | {"name": job["key"][len(SINGLETON_PREFIX) :]} for job in store.jobs.singletons()]


def remove(store: Store, name: str) -> str:
    """Stop a singleton for good: at once if it waits, within a heartbeat if it runs."""
    return store.jobs.cancel(get(store, name)["id"])


def _where(job: dict[str, Any]) -> str:
    if job["state"] == JobState.RUNNING:
        return f"running on machine {machine_label(job['machine_name'], job['owner'])}" + (
            ", stopping" if job["cancel_requested"] else ""
        )
    return cast(str, job["state"])


class LockHeld(QPError):
    """The lock is held by someone else and we were not willing to wait (longer)."""


class Lock:
    """A named lease in qp_locks, renewed by a background thread while held (see the module doc)."""

    def __init__(
        self, store: Store, name: str, *, lease: float, renew_every: float, wait: float | None = None, poll: float = 0.1
    ):
        if not name or len(name) > 200:
            raise InvalidJob(f"lock name {echoed(name)} must be 1-200 characters")
        self.locks = store.locks
        self.name = name
        self.lease = lease
        self.renew_every = renew_every
        self.margin = min(0.5, renew_every / 2)  # `lost` comes this long before the lease can run out: its wake-up
        self.wait = wait
        self.poll = poll
        self.holder = f"{socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"
        self.fence: int | None = None
        self.lost = threading.Event()
        self._tenure: _Tenure | None = None

    def __enter__(self) -> "Lock":
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def acquire(self) -> "Lock":
        """Take the lock, waiting up to `wait` seconds (None: for ever; 0: not at all)."""
        deadline = None if self.wait is None else time.monotonic() + self.wait
        while True:
            sent = time.monotonic()
            if (fence := self.locks.take(self.name, self.holder, self.lease)) is not None:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise LockHeld(f"lock {echoed(self.name)} is held by {self.held_by() or 'someone'}")
            time.sleep(self.poll)
        self.fence = fence
        self.lost.clear()
        self._tenure = _Tenure(self, fence, sent)
        return self

    def release(self) -> None:
        if self._tenure is not None:
            self._tenure.end()
            self._tenure = None
        try:
            self.locks.give_back(self.name, self.holder, cast(int, self.fence))  # None (never taken) matches no row
        except Exception as error:  # the lease runs out by itself
            log.warning("could not release lock %s (%s); it frees itself when its lease runs out", self.name, error)

    def held_by(self) -> str | None:
        return self.locks.holder(self.name)


class _Tenure:
    """One holding of a lock, kept by two threads. One renews it every `renew_every` from the send time of the
    previous renewal, so a slow one that comes back in time is credited from when it was sent and the next goes
    out at once. The other, a watchdog that no hanging renewal can hold up, sets `lost` at a deadline: the lease
    minus the margin from the send time of the last successful take or renewal. The database wrote that lease's
    end after the send, by its own clock, so no other taker can have the lock before the deadline has passed."""

    def __init__(self, lock: Lock, fence: int, sent: float):
        self.lock = lock
        self.fence = fence
        self.deadline = sent + lock.lease - lock.margin  # monotonic; only moves later
        self.over = threading.Event()  # released or lost: both threads end
        self._losing = threading.Lock()
        name = f"qp-lock-{lock.name}"[:60]
        self.threads = [
            threading.Thread(target=self._renew, args=(sent,), name=name, daemon=True),
            threading.Thread(target=self._watch, name=name, daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def end(self) -> None:
        self.over.set()
        for thread in self.threads:
            thread.join(10)

    def _renew(self, sent: float) -> None:
        lock = self.lock
        while not self.over.wait(max(0.0, sent + lock.renew_every - time.monotonic())):
            sent = time.monotonic()
            try:
                ours = lock.locks.renew(lock.name, lock.holder, self.fence, lock.lease)
            except Exception as error:  # the watchdog declares it lost if none gets through in time
                if not self.over.is_set():
                    log.warning("lock %s: could not renew (%s)", lock.name, error)
                continue
            if not ours:
                self._lose("taken over by another holder")
                return
            self.deadline = max(self.deadline, sent + lock.lease - lock.margin)

    def _watch(self) -> None:
        while not self.over.wait(max(0.0, self.deadline - time.monotonic())):
            if time.monotonic() >= self.deadline:
                self._lose(
                    f"not renewed in time ({self.lock.lease - self.lock.margin:.1f} s), it may pass to another holder"
                )
                return

    def _lose(self, why: str) -> None:
        with self._losing:  # a late answer from either thread after a release or the other's verdict says nothing
            if self.over.is_set():
                return
            self.over.set()
        self.lock.lost.set()
        log.warning("lock %s: %s", self.lock.name, why)
