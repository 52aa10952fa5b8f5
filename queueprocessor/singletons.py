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
refuse a holder that lost it. `lock.lost` is set when renewals failed for so
long that the lease may have passed to someone else.
"""

import logging
import os
import socket
import threading
import time
import uuid

from .errors import DuplicateKey, InvalidJob, NotFound, QPError, echoed
from .output import machine_label
from .states import JobState, Kind
from .store import JobSpec, Store
from .store_locks import LockStore

log = logging.getLogger("queueprocessor.singletons")

PREFIX = "singleton:"
FOREVER = 2**31 - 1  # a singleton never runs out of attempts


def add(store: Store, name: str, spec: JobSpec) -> int:
    """Define a singleton; the next turn-holder with room starts it. Refused while one of that name lives."""
    if not name or len(name) > 200 or name != name.strip():
        raise InvalidJob(f"singleton name {echoed(name)} must be 1-200 characters without surrounding spaces")
    key = PREFIX + name
    spec = JobSpec(executor=spec.executor, target=spec.target, method=spec.method, payload=spec.payload,
                   priority=spec.priority, max_attempts=FOREVER, timeout=None, key=key, kind=Kind.SINGLETON,
                   origin=spec.origin, queue=spec.queue)
    # A removed singleton of the same name keeps its history but gives its name up.
    store.free_key(key)
    try:
        return store.enqueue(spec)[0]
    except DuplicateKey:
        current = get(store, name)
        raise InvalidJob(f"singleton {echoed(name)} already exists ({_where(current)}): remove it first") from None


def get(store: Store, name: str) -> dict:
    job = store.keyed_job(key=PREFIX + name)
    if job is None:
        raise NotFound(f"no singleton named {echoed(name)}", what="singleton", ref=name)
    return job


def list_all(store: Store) -> list[dict]:
    return [job | {"name": job["key"][len(PREFIX):]} for job in store.singleton_jobs()]


def remove(store: Store, name: str) -> str:
    """Stop a singleton for good: at once if it waits, within a heartbeat if it runs."""
    return store.cancel(get(store, name)["id"])


def _where(job: dict) -> str:
    if job["state"] == JobState.RUNNING:
        return f"running on machine {machine_label(job['machine_name'], job['owner'])}" + (", stopping" if job["cancel_requested"] else "")
    return job["state"]


class LockHeld(QPError):
    """The lock is held by someone else and we were not willing to wait (longer)."""


class Lock:
    """A named lease in qp_locks, renewed by a background thread while held (see the module doc)."""

    def __init__(self, store: Store, name: str, *, lease: float, renew_every: float, wait: float | None = None,
                 poll: float = 0.1):
        if not name or len(name) > 200:
            raise InvalidJob(f"lock name {echoed(name)} must be 1-200 characters")
        self.locks = LockStore(store)
        self.name = name
        self.lease = lease
        self.renew_every = renew_every
        self.wait = wait
        self.poll = poll
        self.holder = f"{socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"
        self.fence: int | None = None
        self.lost = threading.Event()
        self._released = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Lock":
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def acquire(self) -> "Lock":
        """Take the lock, waiting up to `wait` seconds (None: for ever; 0: not at all)."""
        deadline = None if self.wait is None else time.monotonic() + self.wait
        while (fence := self.locks.take(self.name, self.holder, self.lease)) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise LockHeld(f"lock {echoed(self.name)} is held by {self.held_by() or 'someone'}")
            time.sleep(self.poll)
        self.fence = fence
        self.lost.clear()
        self._released.clear()
        self._thread = threading.Thread(target=self._keep, name=f"qp-lock-{self.name}"[:60], daemon=True)
        self._thread.start()
        return self

    def release(self) -> None:
        self._released.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        try:
            self.locks.give_back(self.name, self.holder, self.fence)
        except Exception as error:  # the lease runs out by itself
            log.warning("could not release lock %s (%s); it frees itself when its lease runs out", self.name, error)

    def held_by(self) -> str | None:
        return self.locks.holder(self.name)

    def _keep(self) -> None:
        """Renew every `renew_every`; after renewals failed for the lease minus a margin, declare it lost."""
        renewed = time.monotonic()
        while not self._released.wait(self.renew_every):
            sent = time.monotonic()
            try:
                if self.locks.renew(self.name, self.holder, self.fence, self.lease):
                    renewed = sent
                    continue
                self.lost.set()
                log.warning("lock %s: taken over by another holder", self.name)
                return
            except Exception as error:
                log.warning("lock %s: could not renew (%s)", self.name, error)
            if time.monotonic() - renewed > self.lease - min(0.5, self.renew_every / 2):
                self.lost.set()
                log.warning("lock %s: no renewal for %.1f s, it may have passed to another holder",
                            self.name, time.monotonic() - renewed)
                return
