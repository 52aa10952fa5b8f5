"""The window's link to one farm database: it owns the worker (Poller) and the one `State` the link is in.

The worker reports events (a snapshot, the database not answering, a broken
read, its end); only this object turns them into a state, so every part of the
window asks `connection.state` rather than keeping flags of its own. It also
owns what the polls read (`query`) across workers, and moving to another
database: the worker of the old one stops this machine's node there first.
Nothing here waits on the database: the worker does, on its thread.
"""

import itertools
from collections.abc import Callable
from dataclasses import replace
from enum import Enum
from functools import partial
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from queueprocessor.nodeoptions import NodeConfig
from queueprocessor.rules.urls import mask
from queueprocessor.views import Query

from .poller import Poller, StopReason
from .snapshot import Snapshot

STALE = 3.0  # seconds without a snapshot before a connected link shows as slow


class State(Enum):
    """Where the link stands; the window shows each its own way (status bar colour, banner, dialog)."""

    DISCONNECTED = "disconnected"  # no worker: not opened yet, or it stopped as asked
    CONNECTING = "connecting"  # opening the farm (and starting this machine's node)
    FAILED = "failed"  # opening found the database unreachable: the worker tries again by itself
    CONNECTED = "connected"  # the last poll answered
    SLOW = "slow"  # connected, but no answer for STALE seconds: a read hangs
    LOST = "lost"  # connected before, now the database does not answer: the worker tries again
    BROKEN = "broken"  # reading fails by a bug, not the database: the worker and the node go on
    STOPPING = "stopping"  # asked to stop: the worker stops this machine's node and closes the farm
    ENDED = "ended"  # the worker ended by itself: bad settings, a newer schema, a bug; open() again
    REFUSED = "refused"  # the database turned the login down: the worker ended; ask for the login again


# No worker in these: open() starts one at once.
IDLE = frozenset((State.DISCONNECTED, State.ENDED, State.REFUSED))
_ENDED_AS = {StopReason.ASKED: State.DISCONNECTED, StopReason.FAILED: State.ENDED, StopReason.REFUSED: State.REFUSED}


class Connection(QObject):
    """One database at a time, through one worker at a time; see the module docstring."""

    changed = Signal(object)  # the new State; `reason` says why in one line
    snapshot = Signal(object)  # every Snapshot the worker reads
    opened = Signal(object)  # this machine's node id (None: only watching), when the farm opens or the node restarts
    done = Signal(str, bool, str)  # an operator's action: its label, whether it succeeded, a one-line message

    def __init__(self, node_options: NodeConfig | None, interval: float, parent=None):
        """`node_options`: this machine's node's settings; None to only watch."""
        super().__init__(parent)
        self.node_options = node_options
        self.interval = interval
        self.state = State.DISCONNECTED
        self.reason = "not connected"
        self.url: str | None = None
        self.node_id: int | None = None
        self.read_only: str | None = None  # why the open farm refuses changes (Farm.why_read_only); None: it may write
        self.query = Query()
        self.poller: Poller | None = None
        self._reads: dict[int, Callable[[Any], None]] = {}  # what to do with each read asked for (fetch)
        self._tokens = itertools.count()
        self._next_url: str | None = None  # where to go once the worker of the current database has stopped
        self.stale = QTimer(self)
        self.stale.setSingleShot(True)
        self.stale.setInterval(int(STALE * 1000))
        self.stale.timeout.connect(self._stale)

    @property
    def live(self) -> bool:
        """A worker runs (or is stopping)."""
        return self.state not in IDLE

    # -- what the window asks ---------------------------------------------------

    def open(self, url: str) -> None:
        """Read the farm at `url`, leaving the current one first (its worker stops this machine's node there)."""
        if not self.live:
            self._start(url)
            return
        self._next_url = url
        self.stop()

    def stop(self) -> None:
        """Stop the worker; the state becomes DISCONNECTED once it has (or the next database's, if opening)."""
        if self.live and self.state is not State.STOPPING:
            self._enter(State.STOPPING, f"leaving {mask(self.url)}")
            self.poller.stop()

    def act(self, label: str, action) -> None:
        """Run `action(farm)` on the worker; `done` brings back its message or its error, or says at once that
        no worker will run it."""
        if self.live and self.state is not State.STOPPING:
            self.poller.act(label, action)
        else:
            self.done.emit(label, False, "not reading a farm now: open a database (File ▸ Open Database…)")

    def fetch(self, label: str, read, then) -> None:
        """Run `read(farm)` on the worker and hand what it returns to `then` on this thread (nothing while no
        worker runs, or if the read fails: see Poller._run_read)."""
        if self.live and self.state is not State.STOPPING:
            token = next(self._tokens)
            self._reads[token] = then
            self.poller.fetch(token, label, read)

    def start_node(self) -> None:
        if self.live:
            self.poller.start_node()

    def refresh(self) -> None:
        if self.live:
            self.poller.refresh()

    def set_query(self, **changes) -> None:
        """Change what the next polls read (a new Query, so the worker never sees half a change)."""
        self.query = replace(self.query, **changes)

    # -- the worker's reports -------------------------------------------------------

    def _start(self, url: str) -> None:
        self.url, self.node_id, self.read_only = url, None, None
        self.poller = Poller(url, self.node_options, self.interval, lambda: self.query)
        # Queued to this (the GUI) thread, as the slots are this object's methods.
        self.poller.opened.connect(self._opened)
        self.poller.snapshot.connect(self._snapshot)
        self.poller.unreachable.connect(self._unreachable)
        self.poller.broken.connect(self._broken)
        self.poller.done.connect(self.done)
        self.poller.fetched.connect(self._fetched)
        self.poller.finished.connect(self._finished)
        self._enter(State.CONNECTING, f"connecting to {mask(url)}")
        self.poller.start()

    def _reporting(self) -> bool:
        """Whether the report being handled counts: a worker already replaced, or being stopped, says nothing
        about the state of the link."""
        return self.sender() is self.poller and self.state is not State.STOPPING

    def _opened(self, node_id: int | None, read_only: str | None) -> None:
        if self._reporting():
            self.node_id, self.read_only = node_id, read_only
            self.opened.emit(node_id)

    def _fetched(self, token: int, value: object) -> None:
        then = self._reads.pop(token, None)
        if then is not None and self._reporting():
            then(value)

    def _snapshot(self, snap: Snapshot) -> None:
        if self._reporting():
            self.stale.start()
            if self.state is not State.CONNECTED:
                self._enter(State.CONNECTED, "connected")
            self.snapshot.emit(snap)

    def _unreachable(self, why: str) -> None:
        if self._reporting():
            self.stale.stop()
            self._enter(State.FAILED if self.state in (State.CONNECTING, State.FAILED) else State.LOST, why)

    def _stale(self) -> None:
        if self.state is State.CONNECTED:
            self._enter(State.SLOW, f"no answer for {STALE:g} s")

    def _broken(self, why: str) -> None:
        if self._reporting():
            self._enter(State.BROKEN, why)

    def _finished(self, ending: StopReason, why: str) -> None:
        if self.sender() is self.poller:
            self._ended(self.poller, ending, why)

    def _ended(self, poller: Poller, ending: StopReason, why: str) -> None:
        if poller is not self.poller:
            return
        if poller.running:  # its thread ends a moment after its last signal: be in a final state only then
            QTimer.singleShot(5, partial(self._ended, poller, ending, why))
            return
        self.stale.stop()
        if self._next_url is not None:
            url, self._next_url = self._next_url, None
            self._start(url)
        else:
            self._enter(_ENDED_AS[ending], why or "not connected")

    def _enter(self, state: State, reason: str) -> None:
        self.state, self.reason = state, reason
        self.changed.emit(state)
