"""The one worker thread that talks to the database, so the window never waits on it.

It opens the farm (retrying while the database is unreachable), starts this
machine's node unless the app only observes, polls a `Snapshot` every
`interval` seconds, and runs operators' actions in order between polls.
Everything reaches the GUI through queued signals, each a plain event (opened,
a snapshot, unreachable, a broken read, an action's result, finished): the
Connection turns them into its one state. Any unexpected error in a poll or an
action is logged with its traceback and reported; the worker goes on, so one
bug cannot stop this machine's node. On `stop()` it stops the node (handing its
jobs back) and closes the farm, then emits `finished`. It holds on to the last
snapshots it sent, so an old snapshot is freed here rather than on the GUI
thread when the window lets go of it (freeing 10,000 run rows takes milliseconds).
"""

import logging
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from PySide6.QtCore import QObject, Signal

from queueprocessor.farm import UNREACHABLE, DatabaseError, Farm, app_client
from queueprocessor.nodeoptions import NodeConfig
from queueprocessor.rules.errors import QPError
from queueprocessor.rules.logs import one_line
from queueprocessor.rules.urls import mask
from queueprocessor.views import Dashboard, Query

from .snapshot import Snapshot

log = logging.getLogger("ui.poller")

# The server turned our credentials down (PostgreSQL, libpq, SQL Server): retrying them cannot help.
REFUSED = re.compile(r"password authentication failed|no password supplied|login failed for user", re.IGNORECASE)
_STOP = object()
_POLL = object()
_START_NODE = object()


def driver_line(error: BaseException) -> str:
    """An error as one line, the driver's own words for a database's (SQLAlchemy's wrapper adds a link)."""
    return one_line(getattr(error, "orig", None) or error)


def unexpected(error: BaseException) -> str:
    """A bug's one line: its type too, since `KeyError('x')` alone reads "'x'"."""
    return f"{type(error).__name__}: {driver_line(error)}"


@dataclass(frozen=True)
class _Read:
    """A read the window asked for (Poller.fetch)."""

    token: int
    label: str
    read: Callable[[Farm], object]


class StopReason(Enum):
    """Why the worker ended."""

    ASKED = "asked"  # stop() was called
    FAILED = "failed"  # it could not go on: bad settings, a newer schema, a bug
    REFUSED = "refused"  # the database turned the login down: retrying it cannot help


class Poller(QObject):
    """Owns the Farm, the in-process Node and the thread that uses them."""

    # This machine's node id (None: the app only observes), and why the farm is read-only (None: it may write; see
    # Farm.why_read_only), once the farm is open.
    opened = Signal(object, object)
    snapshot = Signal(object)  # a Snapshot
    unreachable = Signal(str)  # the database does not answer (one line); the worker tries again
    broken = Signal(str)  # a read failed unexpectedly (a bug, not the database), one line
    done = Signal(str, bool, str)  # action label, succeeded, one-line message
    fetched = Signal(int, object)  # a read's token and what it returned (see fetch)
    finished = Signal(object, str)  # the StopReason, and one line saying why (empty when asked)

    def __init__(self, url: str, node_options: NodeConfig | None, interval: float, query: Callable[[], Query]):
        """`query`: what the next poll reads, asked before each poll (the GUI thread replaces it whole)."""
        super().__init__()
        self.url = url
        self.node_options = node_options
        self.interval = interval
        self.query = query
        self.ending, self.why = StopReason.FAILED, "it ended unexpectedly"
        self.farm: Farm | None = None
        self.node = None
        self.dashboard: Dashboard | None = None
        self._sent: deque[Snapshot] = deque(maxlen=2)
        self._requests: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="qp-gui-worker", daemon=True)

    # -- called from the GUI thread ---------------------------------------

    def start(self) -> None:
        self._thread.start()

    def refresh(self) -> None:
        self._requests.put(_POLL)

    def act(self, label: str, action: Callable[[Farm], str]) -> None:
        """Run `action(farm)` on the worker; its return value (or error) comes back through `done`."""
        self._requests.put((label, action))

    def fetch(self, token: int, label: str, read: Callable[[Farm], object]) -> None:
        """Run `read(farm)` on the worker: what it returns comes back through `fetched` with `token` (see
        _run_read for its errors)."""
        self._requests.put(_Read(token, label, read))

    def start_node(self) -> None:
        """Start this machine's node again once it has stopped (drained); `opened` tells its new id."""
        self._requests.put(_START_NODE)

    def stop(self) -> None:
        self._requests.put(_STOP)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    # -- the worker thread --------------------------------------------------

    def _run(self) -> None:
        try:
            if self._open():
                self._serve()
        except Exception:  # a bug in the loop itself: the window shows that the worker stopped
            log.exception("the background worker")
        finally:
            self._close()
            self.finished.emit(self.ending, self.why)

    def _end(self, ending: StopReason, why: str) -> bool:
        self.ending, self.why = ending, why
        return False

    def _open(self) -> bool:
        """Open the farm and start the node, retrying while the database is unreachable. False if the worker
        ends instead (`ending` says why)."""
        delay = 0.5
        while True:
            try:
                self.farm = Farm(
                    self.url,
                    read_only=self.node_options is None,  # watching changes nothing
                    client=app_client(self.node_options.name if self.node_options else None),
                )
                dashboard = self.farm.dashboard()
                if self.node_options is not None and not self.farm.read_only:  # a reader's node could not register
                    self.node = self._new_node()
                break
            except UNREACHABLE as error:
                self._discard_farm()
                if REFUSED.search(str(error)):
                    return self._end(StopReason.REFUSED, driver_line(error))
                self.unreachable.emit(f"cannot reach the database: {driver_line(error)}; retrying")
            except QPError as error:  # bad settings or a newer schema: retrying will not help
                self._discard_farm()
                return self._end(StopReason.FAILED, driver_line(error))
            except Exception as error:  # a bug: say so rather than retry it forever
                log.exception("opening %s", mask(self.url))
                self._discard_farm()
                return self._end(StopReason.FAILED, f"opening the farm failed: {unexpected(error)}")
            if self._wait(delay) is _STOP:
                return self._end(StopReason.ASKED, "")
            delay = min(5.0, delay * 2)
        self.dashboard = dashboard
        self._opened()
        return True

    def _new_node(self):
        return self.farm.node(self.node_options).start()

    def _opened(self) -> None:
        self.opened.emit(self.node.id if self.node else None, self.farm.why_read_only if self.farm else None)

    def _discard_farm(self) -> None:
        if self.farm is not None:
            self.farm.close()
            self.farm = None

    def _wait(self, seconds: float):
        try:
            return self._requests.get(timeout=seconds)
        except queue.Empty:
            return None

    def _serve(self) -> None:
        next_poll = time.monotonic()
        while True:
            request = self._wait(max(0.0, next_poll - time.monotonic()))
            if request is _STOP:
                self._end(StopReason.ASKED, "")
                return
            if isinstance(request, tuple):
                self._run_action(*request)
            elif isinstance(request, _Read):
                self._run_read(request)
                continue
            elif request is _START_NODE:
                self._run_action("Start node", self._restart_node)
            elif request is None or request is _POLL:
                healthy = self._poll()
                next_poll = time.monotonic() + (self.interval if healthy else max(1.0, self.interval))
                continue
            next_poll = min(next_poll, time.monotonic())  # show the action's effect at once

    def _restart_node(self, _farm) -> str:
        if self.node is None or not self.node.stopped.is_set():
            return "this machine's node is already running"
        self.node = self._new_node()
        self._opened()
        return f"this machine rejoined the farm as machine {self.node.id}"

    def _poll(self) -> bool:
        """Read and send one snapshot; False while the database does not answer."""
        started = time.monotonic()
        try:
            reading = self.dashboard.read(self.query())
            read_ms = (time.monotonic() - started) * 1000
            node = self.node.snapshot() if self.node else None
            snap = Snapshot.of(reading, node=node, read_ms=read_ms, mono=started)
        except UNREACHABLE as error:
            self.unreachable.emit(f"database unreachable: {driver_line(error)}; retrying")
            return False
        except DatabaseError as error:
            self.unreachable.emit(f"database error: {driver_line(error)}; retrying")
            return False
        except Exception as error:  # a bug in reading or preparing: report it, keep the node and the loop going
            log.exception("reading the farm")
            self.broken.emit(f"Reading the farm failed: {unexpected(error)}")
            return True
        self.send(snap)
        return True

    def send(self, snap: Snapshot) -> None:
        """Hand a snapshot to the window. The one sent two polls ago, long replaced there, is let go here."""
        self._sent.append(snap)
        self.snapshot.emit(snap)

    def _run_action(self, label: str, action: Callable[[Farm], str]) -> None:
        try:
            message = action(self.farm)
        except (QPError, DatabaseError, OSError) as error:
            self.done.emit(label, False, driver_line(error))
        except Exception as error:  # a bug in the action: it fails alone, the worker goes on
            log.exception("%s", label)
            self.done.emit(label, False, unexpected(error))
        else:
            self.done.emit(label, True, message)

    def _run_read(self, request: _Read) -> None:
        """A read the window asked for. One the database cannot answer is dropped quietly: the polls show the
        link's state, and the view asks again."""
        try:
            value = request.read(self.farm)
        except (QPError, DatabaseError, OSError) as error:
            log.info("%s: %s", request.label, driver_line(error))
        except Exception as error:  # a bug in the read: reported, the worker goes on
            log.exception("%s", request.label)
            self.broken.emit(f"{request.label} failed: {unexpected(error)}")
        else:
            self.fetched.emit(request.token, value)

    def _close(self) -> None:
        if self.node is not None:
            try:
                self.node.stop(drain=False)
            except Exception as error:  # the database may be gone; the node's rows will age into "dead"
                log.warning("stopping this machine's node: %s", driver_line(error))
        self._discard_farm()
