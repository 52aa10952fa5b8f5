"""The node: one machine's part in the farm (docs/design.md §1-§3, §5).

Named threads, none of which waits on another:
- qp-heartbeat (see heartbeat): every heartbeat, samples the database clock
  while reading what changed in the roster (O(1) rows, see
  roster.KnownMachines), checks in, renews leases and applies operators' wishes;
- qp-turns: the turn timer (see turn_timer): sleeps until this machine's next
  turn, the next change of the roster or a notice (ticking every 10 ms while there
  is work to claim directly), takes the turn and claims work;
- qp-runner: the asyncio loop that runs the jobs (see runner); a job's SystemExit ends only that job, and a loop
  interrupted all the same stops the node like a thread that dies;
- qp-listen (PostgreSQL only): tells the turn timer when work is enqueued (see push);
- qp-watchdog (see watchdog): fences the node off (stops its jobs) when it has
  not renewed its leases for longer than the lease minus a margin, even while
  another thread is stuck on a dead connection; it sleeps while the node holds no job.
A thread that dies stops the node loudly.

One writer per piece of state. Every mutable field has one owner, the only
thread that writes it; the others only read it (one reference, read whole) and,
to make the owner act, send it a notice: an Event (anyone sets it; the owner
clears it before it acts, so a notice given meanwhile waits for its next look)
or the turn thread's queue of backlog slots. So no wish can undo a drain, and
no backlog notice is lost to the turn thread resetting its backlog.

  field                                   owner          how the others reach it
  --------------------------------------  -------------  --------------------------------------------------
  id, runner, listener, exporter,         start()        read only, once the threads run
  _threads, heartbeat, watchdog, turns, warmup
  heartbeat's fields                      qp-heartbeat   - (start() sets renewed_at and runs the first
  (heartbeat.Heartbeat: wished (pause,                   check-in, before the thread exists); the node
  resume, drain), _known, known (its                     shows known, upcoming, guarded, queue_settings,
  copy for readers), upcoming,                           liveness() and settled() to the turn timer, the
  queue_settings, guarded,                               metrics and the tests
  _queues_changed, _checked_in,
  _streak_start, _last_contact_db,
  renewed_at), warmup's last seen
  state (a property)                      -              stopped; else draining once stop() sets _leaving
                                                         (no wish clears it); else heartbeat.wished
  db_healthy (a property)                 -              heartbeat.healthy: _checked_in, leases renewed in
                                                         time, and no heartbeat.unreachable: set by
                                                         qp-turns when a turn loses the database, cleared
                                                         by qp-heartbeat as a check-in begins
  turns' fields (turn_timer.TurnTimer:    qp-turns       turns.backlogs, a queue of backlog slots
  the turn and backlog it is on, what                    (qp-listen, qp-heartbeat); turns.wake, look now
  it claims directly, turns taken)                       (anyone); turns.sweep, sweep missed occurrences
                                                         (qp-heartbeat: contact back, resumed); new work
                                                         and places freed under a limit, through
                                                         turns.notice (qp-listen), turns.job_done and
                                                         turns.released (the runner's writer)
  watchdog.holding (jobs started:         qp-watchdog    set by qp-turns when it starts jobs, and stop()
  watch them)
  _failures[thread name]                  that thread    last_error (a property) shows the newest
  done, failed (properties)               the tally      counted under its lock by the runner's writer
  _begun, _stopping                       _stop_lock     whoever holds the lock
"""

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from ..executors import Executor, make_executors
from ..rules.clock import Clock, OffsetEstimator, SystemClock
from ..rules.logs import one_line
from ..rules.roster import KnownMachines, Liveness
from ..rules.states import MachineState, Outcome
from ..store.database import unreachable
from ..store.stores import Store
from ..tracing import node_tracer
from ..version import __version__
from .config import NodeConfig
from .flowcount import FlowCount
from .heartbeat import Heartbeat
from .push import Listener, where_to_listen
from .runner import JobRunner
from .tally import Tally
from .turn_timer import TurnTimer
from .warmup import Warmup
from .watchdog import Watchdog

if TYPE_CHECKING:
    from .metrics import Exporter

log = logging.getLogger("queueprocessor.node")

GUARDED = ("qp-heartbeat", "qp-turns", "qp-watchdog")  # the node's own threads (see _guard)
WATCHED = (*GUARDED, "qp-runner")  # and the runner's, whose loop tells us if it is interrupted (see _failed)


class Node:
    def __init__(
        self, store: Store, config: NodeConfig, clock: Clock | None = None, executors: dict[str, Executor] | None = None
    ):
        self.store = store
        self.config = config
        self.clock = clock or SystemClock()
        self.estimator = OffsetEstimator(self.clock)
        self.executors = executors or make_executors(config.allow, config.http_base, config.command_env)
        self.tally = Tally()  # what the metrics count (queueprocessor.tally)
        self.flows = FlowCount(store, config.period)  # endings counted for breakers and adaptive rates
        self.instance = uuid.uuid4().hex
        self.id: int | None = None
        self.runner: JobRunner | None = None
        self.listener: Listener | None = None
        self.tracer = node_tracer(config.name or socket.gethostname())  # None: not tracing (docs/design.md §12)
        self.exporter: Exporter | None = None  # serves our metrics, with config.metrics_port
        self._threads: list[threading.Thread] = []
        self._failures: dict[str, tuple[float, str] | None] = dict.fromkeys(WATCHED)
        # Lifecycle: latches, set once
        self._leaving = threading.Event()
        self._stop = threading.Event()
        self._no_turns = threading.Event()  # set before _stop: a stopping node claims nothing more
        self._hurry = threading.Event()
        self.stopped = threading.Event()
        self._started = threading.Event()  # start() is over: joined, or undone
        self._stop_lock = threading.Lock()
        self._begun = False  # start() was called
        self._stopping = False
        # The threads' state and work (see the module docstring)
        self.heartbeat = Heartbeat(self, self._stop)
        self.watchdog = Watchdog(self, self._stop)
        self.turns = TurnTimer(self, started=self.watchdog.holding)
        self.warmup = Warmup(store.schedules, lambda: self.runner)

    @property
    def state(self) -> MachineState:
        """Stopped; else draining once stop() began a drain (no operator's wish undoes it); else the wish's."""
        if self.stopped.is_set():
            return MachineState.STOPPED
        return MachineState.DRAINING if self._leaving.is_set() else self.heartbeat.wished

    @property
    def db_healthy(self) -> bool:
        """Do we claim? (see Heartbeat.healthy)"""
        return self.heartbeat.healthy

    @property
    def known(self) -> KnownMachines:
        """The machine rows as of the last heartbeat (replaced whole)."""
        return self.heartbeat.known

    @property
    def upcoming(self) -> tuple[int, float | None]:
        """(farm read number, earliest schedule occurrence to make), as of the last heartbeat."""
        return self.heartbeat.upcoming

    @property
    def guarded(self) -> frozenset[str]:
        """Our queues held back (a farm-wide limit or rate, fair share, a limit per key): their claims lock their
        row."""
        return self.heartbeat.guarded

    @property
    def keyed(self) -> frozenset[str]:
        """Those of them with a limit per key: their claims keep it."""
        return self.heartbeat.keyed

    @property
    def queue_settings(self) -> dict[str, dict[str, Any]]:
        """Operators' queue settings, as of the last heartbeat that saw them change."""
        return self.heartbeat.queue_settings

    def liveness(self) -> Liveness:
        return self.heartbeat.liveness()

    def settled(self, now: float) -> bool:
        """May our claims take expired leases? (see Heartbeat.settled)"""
        return self.heartbeat.settled(now)

    @property
    def last_error(self) -> str | None:
        """The newest failure any of our threads saw."""
        failures = [failure for failure in self._failures.values() if failure is not None]
        return max(failures)[1] if failures else None

    @property
    def done(self) -> int:
        return self.tally.ended_with(Outcome.SUCCEEDED)

    @property
    def failed(self) -> int:
        return self.tally.ended_with(Outcome.FAILED, Outcome.TIMEOUT)

    # -- lifecycle --------------------------------------------------------

    def start(self) -> "Node":
        """Join the farm: register, sync the clock, start the runner, check in, start the threads.

        A start that fails part way undoes what it did, last step first (as
        apscheduler's AsyncExitStack start does): the runner stops and the
        machine row is marked stopped, so nothing is left running or claiming to
        be active. The node is then stopped for good; a retry makes a new one.
        A stop() that comes during the start (a signal) waits for it to be over.
        """
        with self._stop_lock:
            if self._stopping:
                raise RuntimeError("this node was stopped: make a new one to join the farm again")
            self._begun = True
        try:
            self._join()
        finally:
            self._started.set()
        log.info(
            "machine %s (%s) joined the farm, capacity %s, offset %+.4f s ±%.4f",
            self.id,
            self.config.name,
            self.config.capacity,
            self.estimator.offset(),
            self.estimator.error_bound(),
        )
        return self

    def _join(self) -> None:
        with ExitStack() as undo:
            undo.callback(self._failed_start)
            if self.config.metrics_port is not None:  # first: a port refused leaves nothing else to undo
                from .metrics import Exporter  # prometheus_client is loaded by a node that serves metrics only

                self.exporter = Exporter(self, self.config.metrics_host, self.config.metrics_port)
                undo.callback(self.exporter.close)
            self.id = self.store.machines.register(
                name=self.config.name,
                host=socket.gethostname(),
                instance=self.instance,
                pid=os.getpid(),
                version=__version__,
                capacity=self.config.capacity,
                allow=self.config.allow.to_json(),
                queues=str(self.config.served),
            )
            undo.callback(self._mark_stopped)
            for _ in range(5):  # a first filtered estimate before we take any turn
                self.estimator.add(self.store.sample_clock(self.clock.monotonic))
            self.heartbeat.renewed_at = self.clock.monotonic()
            self.runner = JobRunner(
                self.store,
                self.id,
                self.executors,
                self.estimator.db_now,
                self.turns.job_done,
                self.turns.room_made,
                self.tally,
                self.config.fenced_grace,
                self.config.leash,
                on_failure=self._failed,
                flows=self.flows,
                tracer=self.tracer,
            )
            self.runner.start()
            undo.callback(self.runner.stop)
            self.store.runs.on_release[self.id] = self.turns.released  # our finishes' released children: claim them
            undo.callback(self.store.runs.on_release.pop, self.id, None)
            self.heartbeat.checkin()
            undo.callback(self._end_threads)
            self._start_threads()
            undo.pop_all()

    def _start_threads(self) -> None:
        loops = {"qp-heartbeat": self.heartbeat.loop, "qp-turns": self._turn_loop, "qp-watchdog": self.watchdog.loop}
        self._threads = [
            threading.Thread(target=self._guard, args=(loops[name],), name=name, daemon=True) for name in GUARDED
        ]
        for thread in self._threads:
            thread.start()
        if self.config.push and self.store.dialect == "postgresql":
            listen = where_to_listen(self.store.engine.url, self.config.listen_db)
            self.listener = Listener(listen, self.turns.notice).start()

    def _end_threads(self) -> None:
        """Stop our threads and wait for them (the runner's loop apart): they see `_stop` within a wait."""
        self._end_turns()
        self._stop.set()
        self.watchdog.holding.set()  # the watchdog may be asleep until a job starts
        if self.listener is not None:
            self.listener.stop()
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(5)

    def _end_turns(self, wait: float = 0.0) -> None:
        """Take no more turns, and wait up to `wait` seconds for the turn thread to end (a turn under way ends
        first; one stuck on the database hands back what it still claims, once the runner refuses: see stop)."""
        self._no_turns.set()
        self.turns.wake.set()  # the turn timer may be asleep until its next turn
        for thread in self._threads:
            if thread.name == "qp-turns" and thread is not threading.current_thread():
                thread.join(wait)

    def _failed_start(self) -> None:
        """The last undo of a failed start (whose error says why): this node is stopped, so stop() has
        nothing left to do."""
        with self._stop_lock:
            self._stopping = True
        self.stopped.set()

    def _mark_stopped(self) -> None:
        """Say on our row that we left (a row we cannot reach ages into dead instead)."""
        assert self.id is not None  # called once we registered
        try:
            self.store.machines.mark_stopped(self.id)
        except Exception as exc:
            log.warning("could not mark machine %s stopped: %s", self.id, one_line(exc))

    def stop(self, drain: bool = True, timeout: float | None = None, reason: str = "exit") -> None:
        """Leave the farm. With `drain`, finish running jobs first; otherwise hand them back without spending
        an attempt, saying why (`reason`: see runs.STOPPED; the default is the operator's exit).

        Safe to call again while stopping: a later call without `drain` cuts a
        drain short (the operator's second Ctrl-C), then both return when stopped.
        """
        if not drain:
            self._hurry.set()
        with self._stop_lock:
            first, self._stopping, begun = not self._stopping, True, self._begun
        if not first:
            self.stopped.wait(30)
            return
        if not begun:  # never started: nothing to leave
            self.stopped.set()
            return
        self._started.wait()
        if self.stopped.is_set():  # the start failed and undid itself
            return
        assert self.runner is not None  # a start that got past the runner's
        if drain:
            self._leaving.set()
            self.runner.release_singletons()
            self.runner.hand_back_waiting("released")  # and what it claimed but has not begun
            self._await_idle(timeout, interruptible=True)
        # The heartbeat renews and the watchdog fences the jobs until they have stopped; a turn still under way
        # hands back what it claims.
        self.runner.refuse(reason)
        self._end_turns(wait=self.config.lease)
        self.runner.stop_all(reason)
        self._await_idle(5)
        self._end_threads()
        self.runner.stop()
        if self.tracer is not None:  # the spans of the last runs sent
            self.tracer.shutdown()
        if self.id is not None:
            self._mark_stopped()
        if self.exporter is not None:
            self.exporter.close()
        self.stopped.set()

    def _await_idle(self, timeout: float | None, interruptible: bool = False) -> None:
        deadline = None if timeout is None else self.clock.monotonic() + timeout
        while (
            self.runner
            and self.runner.count()
            and not (interruptible and self._hurry.is_set())
            and (deadline is None or self.clock.monotonic() < deadline)
        ):
            self._stop.wait(0.05)

    def _guard(self, loop: Callable[[], None]) -> None:
        """Run a thread's loop; if it dies, say so loudly and stop the node rather than limp on."""
        try:
            loop()
        except BaseException:
            name = threading.current_thread().name
            log.exception("thread %s died; stopping this node", name)
            self._failed(f"thread {name} died")

    def _failed(self, why: str) -> None:
        """One of our threads died, or the runner's loop was interrupted: keep it as that thread's last failure and
        stop the node, handing its jobs back, rather than limp on (heartbeats renewing work nobody runs)."""
        self._failures[threading.current_thread().name] = (self.clock.monotonic(), why)
        threading.Thread(target=self.stop, kwargs={"drain": False, "reason": "released"}, name="qp-stop").start()

    def note_failure(self, exc: Exception, headline: str) -> None:
        """Keep a failure as this thread's last, and log it: the database out of reach once per outage and
        message, anything else once per message (a statement refused at every tick says so once)."""
        name, message = threading.current_thread().name, one_line(exc)
        last = self._failures.get(name)
        news = last is None or last[1] != message
        if unreachable(exc) and (news or self.db_healthy):
            log.warning("database unreachable, claiming paused: %s", message)
        elif news and not unreachable(exc):
            log.error("%s: %s", headline, message, exc_info=exc)
        self._failures[name] = (self.clock.monotonic(), message)

    # -- turns ------------------------------------------------------------

    def _turn_loop(self) -> None:
        while not self._no_turns.is_set():
            if self.turns.wake.wait(self.turns.next_wake()):
                self.turns.wake.clear()
            self.turns.take_backlog_notices()
            if self.db_healthy and not self._no_turns.is_set():
                try:
                    self.turns.tick()
                except Exception as exc:
                    self.note_failure(exc, "turn failed")
                    if unreachable(exc):  # claim nothing until a check-in gets through
                        self.heartbeat.unreachable.set()

    # -- for the CLI and the GUI ------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """This node as plain data (the GUI draws it; it never reads our internals)."""
        synced = self.estimator.synced
        now = self.estimator.db_now() if synced else None
        upcoming = None
        if now is not None and self.state == MachineState.ACTIVE:
            turn = self.turns.upcoming(now)
            upcoming = None if turn is None else max(0.0, turn * self.config.period - now)
        return {
            "id": self.id,
            "name": self.config.name,
            "state": self.state,
            "db_healthy": self.db_healthy,
            "last_error": self.last_error,
            "db_now": now,
            "offset": self.estimator.offset() if synced else None,
            "error_bound": self.estimator.error_bound() if synced else None,
            "rtt": self.estimator.rtt() if synced else None,
            "running": self.runner.working() if self.runner else 0,
            "capacity": self.config.capacity,
            "done": self.done,
            "failed": self.failed,
            "turns": self.turns.taken,
            "next_turn_in": upcoming,
        }
