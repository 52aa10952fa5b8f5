"""The node: one machine's part in the farm (DESIGN 1-3, 5).

Named threads, none of which waits on another:
- qp-heartbeat: every heartbeat, samples the database clock while reading what
  changed in the roster (O(1) rows, see roster.KnownMachines), checks in, renews
  leases and applies operators' wishes;
- qp-turns: a timer that sleeps until this machine's next turn, the next change of
  the roster or a notice (ticking every 10 ms while there is work to claim
  directly), takes the turn and claims work;
- qp-runner: the asyncio loop that runs the jobs (see runner);
- qp-listen (PostgreSQL only): tells the turn timer when work is enqueued (see push);
- qp-watchdog: fences the node off (stops its jobs) when it has not renewed its
  leases for longer than the lease minus a margin, even while another thread is
  stuck on a dead connection; it sleeps while the node holds no job.
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
  _threads
  _wished (pause, resume, drain)          qp-heartbeat   an operator's wish on the machine row
  state (a property)                      -              stopped; else draining once stop() sets _leaving
                                                         (no wish clears it); else _wished
  _known, known (its copy for readers),   qp-heartbeat   - (start() runs the first check-in, before the
  _upcoming, queue_settings, _guarded,                   thread exists)
  _queues_changed, _checked_in,
  _streak_start, _last_contact_db,
  _renewed_at
  db_healthy (a property)                 -              _checked_in, leases renewed in time, and no
                                                         _unreachable: set by qp-turns when a turn loses
                                                         the database, cleared by qp-heartbeat as a
                                                         check-in begins
  _backlog_slot, _direct, _last_slot,     qp-turns       _backlogs, a queue of backlog slots (qp-listen,
  _made, _housekeep_more, _elsewhere,                    qp-heartbeat); _pushed, new work (qp-listen);
  _freed_seen, turns_taken                               _wake, look now (anyone)
  _sweep (sweep missed occurrences)       qp-turns       set by qp-heartbeat (contact back, resumed) and
                                                         qp-turns (housekeeping)
  _limited_freed (claim limited queues)   qp-turns       set by the runner's writer when a job of one of
                                                         _guarded ends
  _holding (jobs started: watch them)     qp-watchdog    set by qp-turns when it starts jobs, and stop()
  _failures[thread name]                  that thread    last_error (a property) shows the newest
  done, failed (properties)               the tally      counted under its lock by the runner's writer
  _begun, _stopping                       _stop_lock     whoever holds the lock
"""

import logging
import math
import os
import queue
import socket
import threading
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field, replace

from . import __version__
from .clock import Clock, OffsetEstimator, SystemClock
from .database import unreachable
from .executors import AllowLists, Executor, make_executors
from .logs import about, one_line
from .push import BACKLOG, Listener, notify_backlog, where_to_listen
from .queues import Served, served_names
from .roster import KnownMachines, Liveness, slot_end, slot_of, turn_to_take, turn_wait, upcoming_turn
from .runner import JobRunner
from .schedules import ahead_of
from .states import MachineState, Outcome, Wish
from .store import PRUNE_BATCH, Claimed, Looks, Plan, Store, Turn
from .store_queues import QueueStore
from .store_roster import FarmRead, RosterStore
from .store_schedules import ScheduleStore
from .tally import Tally

log = logging.getLogger("queueprocessor.node")

TURN_MARGIN = 0.0005  # wake this far past the instant our error bound lets us take the turn
LATELY_DEAD = 60.0  # seconds after a peer's death during which every claim also looks for expired leases
# While a backlog is worked off, a place freed under a limited queue's limit waits at most this long to be
# filled by the next claim of a quarter of our capacity, instead of a claim of its own (see _tick).
FREED_WAIT = 0.05
GUARDED = ("qp-heartbeat", "qp-turns", "qp-watchdog")  # the node's own threads (see _guard)


@dataclass
class NodeConfig:
    name: str = field(default_factory=socket.gethostname)
    capacity: int = 4
    period: float = 1.0
    heartbeat: float = 1.0
    misses: int = 3
    http_base: str = "http://localhost/"
    turn_keep: float = 24 * 3600.0
    keep_jobs: float = 7 * 24 * 3600.0  # finished jobs (and their runs) are deleted this long after they ended
    housekeeping: float = 300.0  # seconds between the farm's retention passes (turn log, finished jobs)
    tick: float = 0.01
    allow: AllowLists = field(default_factory=AllowLists)
    push: bool = True  # LISTEN for new work on PostgreSQL
    metrics_port: int | None = None  # serve Prometheus metrics on this port (queueprocessor.metrics)
    metrics_host: str = "127.0.0.1"
    served: Served = field(default_factory=Served)  # the queues this machine serves (DESIGN 7)
    listen_db: str | None = None  # LISTEN there rather than on the farm's URL (which may reach a pooler: see push)

    @property
    def claim_ahead(self) -> float:
        """A turn claims jobs due before the next turn and starts each exactly at its time."""
        return self.period

    @property
    def schedule_ahead(self) -> float:
        return ahead_of(self.period, self.heartbeat)

    @property
    def dead_after(self) -> float:
        return self.misses * self.heartbeat

    @property
    def lease(self) -> float:
        """A lease lasts as long as a silent machine is given before it is judged dead."""
        return self.dead_after

    @property
    def fence_margin(self) -> float:
        """Stop our own jobs this long before our leases could run out."""
        return min(0.5, self.heartbeat / 2)

    @property
    def stale(self) -> float:
        """A machine quiet for this long is read by name at every heartbeat (a suspect): late by a heartbeat
        or so, and a heartbeat and a half before its dead timeout, so every peer reads its last_seen first."""
        return max(self.dead_after - 1.5 * self.heartbeat, self.dead_after / 2)

    @property
    def join_delay(self) -> float:
        """Join the roster only once every peer has surely read our row."""
        return 1.5 * self.heartbeat


@dataclass(frozen=True)
class Outlook:
    """What the turn timer's plan rests on besides the rows: contact with the database, our state, the stall
    rule's streak. Taken before and after a check-in, it says whether the check-in brought news (bench/simulate.py
    plans its virtual nodes' timers by the same rule)."""

    healthy: bool
    state: MachineState
    liveness: Liveness

    def news(self, after: "Outlook", moved: bool, backlog: bool) -> bool:
        """Whether a check-in that began with this outlook and ended with `after` may change the timer's plan:
        new rows or suspects (`moved`), contact back, a new state or streak, a backlog to help with. One that
        changed nothing leaves the plan be: the timer sleeps on to its turn."""
        return moved or not self.healthy or after.state != self.state or after.liveness != self.liveness or backlog


def turn_timer_wait(known: KnownMachines, me: int, now: float, liveness: Liveness, config: NodeConfig,
                    last_taken: int, error_bound: float) -> float | None:
    """How long an idle active node's turn timer may sleep (None: until woken): until we are surely inside our
    next slot under the roster we know, or that roster changes by itself (a newcomer's join delay, a suspect's
    dead timeout), whichever comes first."""
    wait = known.changes_at(now, liveness, config.join_delay) + TURN_MARGIN - now
    turn = upcoming_turn(known.roster(now, liveness, config.join_delay), me, now, config.period, last_taken)
    if turn is not None:
        wait = min(wait, turn_wait(turn, now, config.period, error_bound, TURN_MARGIN))
    return None if wait == math.inf else max(wait, TURN_MARGIN)


class Node:
    def __init__(self, store: Store, config: NodeConfig, clock: Clock | None = None,
                 executors: dict[str, Executor] | None = None):
        self.store = store
        self.config = config
        self.clock = clock or SystemClock()
        self.estimator = OffsetEstimator(self.clock)
        self.executors = executors or make_executors(config.allow, config.http_base)
        self.schedules = ScheduleStore(store)
        self.peers = RosterStore(store)
        self.queue_store = QueueStore(store)
        self.tally = Tally()  # what the metrics count (queueprocessor.tally)
        self.instance = uuid.uuid4().hex
        self.id: int | None = None
        self.runner: JobRunner | None = None
        self.listener: Listener | None = None
        self.exporter = None  # serves our metrics, with config.metrics_port
        self._threads: list[threading.Thread] = []
        # qp-heartbeat's
        self._wished = MachineState.ACTIVE
        self._known = KnownMachines()  # the machine rows, as of the last heartbeat
        self.known = self._known.copy()
        self._upcoming: tuple[int, float | None] = (0, None)  # (farm read number, earliest occurrence to make)
        # Operators' queue settings as of `_queues_changed` (the heartbeat's read says when they change): which
        # of our queues are paused or guarded by a farm-wide limit or rate.
        self.queue_settings: dict[str, dict] = {}
        self._guarded: frozenset[str] = frozenset()  # ours with a farm-wide limit or rate: their claims lock
        self._queues_changed: float | None = None
        self._checked_in = False
        self._limited_freed = threading.Event()  # a job of a guarded queue ended here: claim its room at once
        self._streak_start = float("inf")
        self._last_contact_db = float("-inf")
        self._renewed_at = float("-inf")  # monotonic send time of the last successful renewal
        # qp-turns'
        self._backlog_slot = -1
        self._direct = False
        self._freed_seen: float | None = None  # monotonic time a tick first saw _limited_freed while _direct
        self._last_slot = -1
        self._made: tuple[int, float | None] = (-1, None)  # (farm read number, earliest occurrence left)
        self._housekeep_more = False  # our last housekeeping pass was cut short
        self._elsewhere: tuple = (None, None)  # ((roster version, roster), _served_elsewhere()'s answer for it)
        self.turns_taken = 0
        # Notices (see the module docstring)
        self._backlogs: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._pushed = threading.Event()
        self._wake = threading.Event()
        self._unreachable = threading.Event()
        # Drop occurrences that waited past their schedule's grace, before this node's next turn claims: set
        # when it starts, when its contact with the database resumes, when it is resumed, and by housekeeping.
        self._sweep = threading.Event()
        self._sweep.set()
        self._holding = threading.Event()
        self._failures: dict[str, tuple[float, str] | None] = dict.fromkeys(GUARDED)
        # Lifecycle: latches, set once
        self._leaving = threading.Event()
        self._stop = threading.Event()
        self._hurry = threading.Event()
        self.stopped = threading.Event()
        self._started = threading.Event()  # start() is over: joined, or undone
        self._stop_lock = threading.Lock()
        self._begun = False  # start() was called
        self._stopping = False

    @property
    def state(self) -> MachineState:
        """Stopped; else draining once stop() began a drain (no operator's wish undoes it); else the wish's."""
        if self.stopped.is_set():
            return MachineState.STOPPED
        return MachineState.DRAINING if self._leaving.is_set() else self._wished

    @property
    def db_healthy(self) -> bool:
        """Do we claim? Only while our last check-in got through, no turn has lost the database since one
        began, and our leases were renewed in time (a check-in stuck on a dead connection says nothing)."""
        overdue = self.clock.monotonic() - self._renewed_at > self.config.lease - self.config.fence_margin
        return self._checked_in and not self._unreachable.is_set() and not overdue

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
        log.info("machine %s (%s) joined the farm, capacity %s, offset %+.4f s ±%.4f",
                 self.id, self.config.name, self.config.capacity, self.estimator.offset(),
                 self.estimator.error_bound())
        return self

    def _join(self) -> None:
        with ExitStack() as undo:
            undo.callback(self._failed_start)
            if self.config.metrics_port is not None:  # first: a port refused leaves nothing else to undo
                from .metrics import Exporter  # prometheus_client is loaded by a node that serves metrics only

                self.exporter = Exporter(self, self.config.metrics_host, self.config.metrics_port)
                undo.callback(self.exporter.close)
            self.id = self.store.register(
                name=self.config.name, host=socket.gethostname(), instance=self.instance, pid=os.getpid(),
                version=__version__, capacity=self.config.capacity, allow=self.config.allow.to_json(),
                queues=str(self.config.served),
            )
            undo.callback(self._mark_stopped)
            for _ in range(5):  # a first filtered estimate before we take any turn
                self.estimator.add(self.store.sample_clock(self.clock.monotonic))
            self._renewed_at = self.clock.monotonic()
            self.runner = JobRunner(self.store, self.id, self.executors, self.estimator.db_now, self._job_done,
                                    self._room_made, self.tally)
            self.runner.start()
            undo.callback(self.runner.stop)
            self._checkin()
            undo.callback(self._end_threads)
            self._start_threads()
            undo.pop_all()

    def _start_threads(self) -> None:
        loops = {"qp-heartbeat": self._heartbeat_loop, "qp-turns": self._turn_loop,
                 "qp-watchdog": self._watchdog_loop}
        self._threads = [threading.Thread(target=self._guard, args=(loops[name],), name=name, daemon=True)
                         for name in GUARDED]
        for thread in self._threads:
            thread.start()
        if self.config.push and self.store.dialect == "postgresql":
            listen = where_to_listen(self.store.engine.url, self.config.listen_db)
            self.listener = Listener(listen, self._notice).start()

    def _end_threads(self) -> None:
        """Stop our threads and wait for them (the runner's loop apart): they see `_stop` within a wait."""
        self._stop.set()
        self._wake.set()  # the turn timer may be asleep until its next turn
        self._holding.set()  # the watchdog may be asleep until a job starts
        if self.listener is not None:
            self.listener.stop()
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(5)

    def _failed_start(self) -> None:
        """The last undo of a failed start (whose error says why): this node is stopped, so stop() has
        nothing left to do."""
        with self._stop_lock:
            self._stopping = True
        self.stopped.set()

    def _mark_stopped(self) -> None:
        """Say on our row that we left (a row we cannot reach ages into dead instead)."""
        try:
            self.store.mark_stopped(self.id)
        except Exception as exc:
            log.warning("could not mark machine %s stopped: %s", self.id, one_line(exc))

    def stop(self, drain: bool = True, timeout: float | None = None, reason: str = "exit") -> None:
        """Leave the farm. With `drain`, finish running jobs first; otherwise hand them back without spending
        an attempt, saying why (`reason`: see runner.STOPPED; the default is the operator's exit).

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
        if drain:
            self._leaving.set()
            self.runner.release_singletons()
            self._await_idle(timeout, interruptible=True)
        self._end_threads()
        if self.runner is not None:
            self.runner.stop_all(reason)
            self._await_idle(5)
            self.runner.stop()
        if self.id is not None:
            self._mark_stopped()
        if self.exporter is not None:
            self.exporter.close()
        self.stopped.set()

    def _await_idle(self, timeout: float | None, interruptible: bool = False) -> None:
        deadline = None if timeout is None else self.clock.monotonic() + timeout
        while (self.runner and self.runner.count() and not (interruptible and self._hurry.is_set())
               and (deadline is None or self.clock.monotonic() < deadline)):
            self._stop.wait(0.05)

    def _guard(self, loop) -> None:
        """Run a thread's loop; if it dies, say so loudly and stop the node rather than limp on."""
        try:
            loop()
        except Exception:
            name = threading.current_thread().name
            log.exception("thread %s died; stopping this node", name)
            self._failures[name] = (self.clock.monotonic(), f"thread {name} died")
            threading.Thread(target=self.stop, kwargs={"drain": False, "reason": "released"}, name="qp-stop").start()

    def _note_failure(self, exc: Exception, headline: str) -> None:
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

    # -- heartbeat --------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        next_beat = self.clock.monotonic()
        while not self._stop.is_set():
            next_beat += self.config.heartbeat
            self._stop.wait(max(0.0, next_beat - self.clock.monotonic()))
            if self._stop.is_set():
                return
            try:
                self._checkin()
            except Exception as exc:  # database down: keep trying; the watchdog fences us off
                self.tally.renewal_failed()
                self._note_failure(exc, "check-in failed, claiming paused")
                self._checked_in = False
            if self.runner.count() == 0:
                self.store.idle()
            if self.state == MachineState.DRAINING and self.runner.count() == 0:
                log.info("drained: no jobs left, stopping")
                threading.Thread(target=self.stop, kwargs={"drain": False}, name="qp-stop").start()
                return

    def _checkin(self) -> None:
        outlook = self._outlook()
        self._unreachable.clear()  # a turn that loses the database from now on is news to this check-in
        sent = self.clock.monotonic()
        since = slot_of(self.estimator.db_now(), self.config.period) - 3
        before = self.estimator.db_now() - self.config.stale  # a machine last seen before is a suspect
        farm = self.peers.read_farm(self.id, before, since, stamp=self.clock.monotonic)  # also a clock sample
        self.estimator.add(farm.sample)
        self._note_contact(farm.now)
        moved = self._learn_roster(farm, before)
        self._upcoming = (self._upcoming[0] + 1, farm.next_schedule)
        applied = self._apply_wish(farm.wish)
        if farm.queues_changed != self._queues_changed:
            self.queue_settings, self._queues_changed = self.queue_store.settings(), farm.queues_changed
            self._guarded = frozenset(name for name, row in self.queue_settings.items()
                                      if self.config.served.serves(name) and not row["paused"]
                                      and (row["max_running"] is not None or row["rate_count"] is not None))
        held = self.runner.held()
        self._handle_renewals(held, self.store.renew(self.id, held, self.config.lease))
        self.store.heartbeat(
            self.id, state=self.state, applied_wish=applied, running=self.runner.working(), done=self.done,
            failed=self.failed, offset=self.estimator.offset(), rtt=self.estimator.rtt(),
            error_bound=self.estimator.error_bound(),
        )
        self._renewed_at = sent
        if farm.backlog_slot is not None:
            self._backlogs.put(farm.backlog_slot)
        self._checked_in = True
        if self.db_healthy and not outlook.healthy:  # not after a check-in the database stalled under (db_healthy)
            log.info("database reachable (offset %+.4f s, rtt %.2f ms)", self.estimator.offset(),
                     self.estimator.rtt() * 1000)
        if outlook.news(self._outlook(), moved, farm.backlog_slot is not None):
            self._wake.set()  # the turn timer plans again

    def _learn_roster(self, farm: FarmRead, before: float) -> bool:
        """Keep our copy of the machine rows current: every row when the roster version moved, else only the
        suspects' last_seen (see roster.KnownMachines). Suspects we find dead are buried, so nobody reads
        them again. Whether the rows or the suspects changed."""
        if self._known.current(farm.version):
            moved = self._known.update(before, farm.suspects)
        else:
            version, rows = self.peers.read_all()
            self._known.replace(version, rows, before)
            moved = True
        self.known = self._known.copy()
        for machine_id, last_seen in self._known.dead(farm.now, self.liveness()):
            if self.peers.bury(machine_id, last_seen):
                log.warning("machine %s stopped checking in: judged dead", machine_id)
        return moved

    def _note_contact(self, db_time: float) -> None:
        """Track our unbroken run of check-ins: peers are only judged on silence within it."""
        if db_time - self._last_contact_db > 2 * self.config.heartbeat:
            self._streak_start = db_time
            self._sweep.set()  # the farm may have been down for longer than a schedule's grace
        self._last_contact_db = db_time

    def _apply_wish(self, wish: str | None) -> str | None:
        """Apply an operator's wish to our state. A drain is for good: once draining, by a wish or by stop(),
        the state stays draining whatever this writes (see state)."""
        state = self.state
        if wish not in tuple(Wish) or state == MachineState.STOPPED:
            return None
        target = Wish(wish).leads_to
        if state == MachineState.DRAINING and target != MachineState.DRAINING:
            log.info("ignoring %s: this machine is draining", wish)
        elif target != state:
            log.info("operator wish: %s (%s -> %s)", wish, state, target)
            self._wished = target
            if target == MachineState.ACTIVE:
                self._sweep.set()
            if target == MachineState.DRAINING:
                self.runner.release_singletons()
        return wish

    def _handle_renewals(self, held: list[tuple[int, int]], renewed: dict[int, bool]) -> None:
        for job_id, _fence in held:
            if job_id not in renewed:
                if self.runner.stop_job(job_id, Outcome.LOST):
                    log.warning("job %s: lease lost to another machine, stopped it", job_id, extra=about(job_id))
            elif renewed[job_id]:
                self.runner.stop_job(job_id, Outcome.CANCELLED)

    # -- turns ------------------------------------------------------------

    def liveness(self) -> Liveness:
        return Liveness(self.config.dead_after, self._streak_start)

    def _outlook(self) -> Outlook:
        return Outlook(self.db_healthy, self.state, self.liveness())

    def _turn_loop(self) -> None:
        while not self._stop.is_set():
            if self._wake.wait(self._next_wake()):
                self._wake.clear()
            self._take_backlog_notices()
            if self.db_healthy:
                try:
                    self._tick()
                except Exception as exc:
                    self._note_failure(exc, "turn failed")
                    if unreachable(exc):  # claim nothing until a check-in gets through
                        self._unreachable.set()

    def _take_backlog_notices(self) -> None:
        """Fold the backlog slots other threads sent (a push, a heartbeat's read) into ours. Taken after our
        own reset, a notice that came in while we reset is kept, not lost."""
        while True:
            try:
                slot = self._backlogs.get_nowait()
            except queue.Empty:
                return
            self._backlog_slot = max(self._backlog_slot, slot)

    def _next_wake(self) -> float | None:
        """How long the turn timer may sleep (None: until woken): until we are surely inside our next slot or
        the roster changes by itself, whichever comes first; a tick while there is work to claim directly.
        Whatever else changes our plans wakes us: a check-in that brought news (see _checkin), a push, stop().
        Sleeping until then instead of waking to look keeps an idle node's CPU to a fraction of a percent of
        a core, and starts its turns to a fraction of a millisecond."""
        if not self.db_healthy or self.state != MachineState.ACTIVE:
            return None
        now = self.estimator.db_now()
        if self._direct or self._pushed.is_set() or self._backlog_slot >= slot_of(now, self.config.period) - 2:
            return self.config.tick
        return turn_timer_wait(self.known, self.id, now, self.liveness(), self.config, self._last_slot,
                               self.estimator.error_bound())

    def _roster(self, now: float) -> list[int]:
        return self.known.roster(now, self.liveness(), self.config.join_delay)

    def _upcoming_turn(self, now: float) -> int | None:
        """Our next slot under the current roster that we have not taken yet; None if not in the roster."""
        return upcoming_turn(self._roster(now), self.id, now, self.config.period, self._last_slot)

    def _watchdog_loop(self) -> None:
        """The watchdog has its own thread: a turn stuck on a black-holed connection must not keep
        it from stopping our jobs before their leases run out. While we hold no job it sleeps until
        the turn thread starts some (or stop())."""
        while not self._stop.is_set():
            if self.runner.count():
                self._stop.wait(self.config.fence_margin / 4)
                self._watchdog()
                continue
            self._holding.clear()
            if not self.runner.count():  # looked again after clearing: a job started meanwhile is not missed
                self._holding.wait()

    def _watchdog(self) -> None:
        """Self-fencing: jobs whose leases we could not renew in time are stopped before they run out.
        A job's lease runs from our last renewal or from its claim, whichever was sent later: a job
        claimed once the database came back is not stopped for the silence before it."""
        now = self.clock.monotonic()
        limit = self.config.lease - self.config.fence_margin
        overdue = [job_id for job_id, leased_at in self.runner.leases()
                   if now - max(leased_at, self._renewed_at) > limit]
        stopped = [job_id for job_id in overdue if self.runner.stop_job(job_id, Outcome.LOST)]
        if stopped:
            self.tally.fenced()
            log.warning("no contact with the database for %.1f s: stopping %s jobs before their leases run out",
                        now - self._renewed_at, len(stopped))

    def _tick(self) -> None:
        if self.state != MachineState.ACTIVE:
            return
        now = self.estimator.db_now()
        slot = slot_of(now, self.config.period)
        free = self.runner.room(self.config.capacity)
        if slot != self._last_slot:
            if turn_to_take(self._roster(now), self.id, now, self.config.period, self.estimator.error_bound(),
                            self._last_slot) is not None:
                self._last_slot = slot
                self._pushed.clear()  # the turn's claim covers what the notice announced
                self._materialise_due()
                if self._sweep.is_set():
                    self._sweep.clear()
                    self.schedules.drop_missed()
                turn = self._take_turn(slot, free)
                if turn is not None:
                    self._took_turn(slot, free, turn, now)
                return
        if self._pushed.is_set():
            self._pushed.clear()
            if self._last_slot == slot:  # our turn is under way: take the new work now, or flag it if we are full
                self._take_freed()  # the claim is guarded: it fills the places freed under a limit too
                self._flag_backlog(slot, free, self._claim(free, self.config.claim_ahead, guarded=True))
                free = self.runner.room(self.config.capacity)
        if self._backlog_slot >= slot - 2 and free > 0 and not self._direct:
            self._direct = True
        if self._direct:
            # Work-conserving: a recent turn found more than its holder could take. Slow jobs free a slot or
            # two per tick: claiming for each cost a statement per couple of jobs (HTTP jobs: 4 per claim), so
            # we claim a quarter of our capacity at a time. A place freed under a limited queue's limit rides
            # with that claim (guarded then), waiting for it at most FREED_WAIT.
            if free >= max(1, self.config.capacity // 4) or (free > 0 and self._freed_waited()):
                if not self._claim(free, guarded=self._take_freed()):
                    self._direct = False
                    self._backlog_slot = -1
        elif free > 0 and self._take_freed():
            self._claim(free, guarded=True)

    def _take_freed(self) -> bool:
        """Whether a job of a guarded queue ended here since our last guarded claim (see _job_done): if so, the
        claim about to be made is guarded, and a job that ends after this look is kept for the next one."""
        freed = self._limited_freed.is_set()
        if freed:
            self._limited_freed.clear()
            self._freed_seen = None
        return freed

    def _freed_waited(self) -> bool:
        """Has a place freed under a limit waited FREED_WAIT for a backlog's claim (counted from the tick that
        first saw it)?"""
        if not self._limited_freed.is_set():
            return False
        now = self.clock.monotonic()
        if self._freed_seen is None:
            self._freed_seen = now
        return now - self._freed_seen >= FREED_WAIT

    def _materialise_due(self) -> None:
        """Make due schedule occurrences jobs before our turn claims (idempotent: each is a unique key).
        Until the heartbeat reads the schedules again, what we made tells the next occurrence left."""
        reading, upcoming = self._upcoming
        if self._made[0] == reading:
            upcoming = self._made[1]
        if upcoming is not None and upcoming <= self.estimator.db_now() + self.config.schedule_ahead:
            made = self.schedules.materialise(ahead=self.config.schedule_ahead, period=self.config.period)
            self._made = (reading, made.next_schedule)

    def _took_turn(self, slot: int, free: int, turn: Turn, now: float) -> None:
        """The turn was ours: say whether it left a backlog for the others, and keep the tables trimmed.

        A turn that filled its room (or had none) puts the expired leases it could not take back in the queue
        (DESIGN 3), where they are a backlog that any machine with room takes at once, first (their run_at is
        old): under a backlog every turn-holder may be full for minutes, and a dead machine's jobs may be more
        than the next turn-holders have room for. A turn that may not take expired leases (we are not settled:
        we just joined, or the database stalled) flags those it finds as a backlog, for the settled machines:
        a machine restarted after a crash is unsettled just when its dead predecessor's leases run out."""
        self.turns_taken += 1
        self.tally.turn(now - slot * self.config.period)
        settled = self._settled(now)
        if len(turn.claimed) >= free and settled:
            self.store.requeue_expired(before=now)
        self._flag_backlog(slot, free, len(turn.claimed), turn.elsewhere_due,
                           expired=not settled and self.store.any_expired())
        if slot % max(1, round(self.config.housekeeping / self.config.period)) == 0 or self._housekeep_more:
            self._housekeep()

    def _housekeep(self) -> None:
        """Retention, once per `housekeeping` seconds for the whole farm (by whoever holds the turn of a slot
        that is a multiple of it), so an idle farm's cost does not grow with its machines: trim the turn log and
        delete finished jobs past `keep_jobs` a small batch at a time, for at most a quarter period per turn. A
        pass cut short goes on at our next turn. Our next turn also sweeps missed schedule occurrences (see
        ScheduleStore.drop_missed), for those left waiting while the farm was busy."""
        started = self.clock.monotonic()
        self.store.prune_turns(self.config.turn_keep)
        self.queue_store.recount()
        self._housekeep_more = True
        while self.store.prune_jobs(self.config.keep_jobs) == PRUNE_BATCH:
            if self.clock.monotonic() - started > self.config.period / 4:
                return
        self._housekeep_more = False
        self._sweep.set()

    def _flag_backlog(self, slot: int, free: int, claimed: int, elsewhere_due: bool | None = None,
                      expired: bool = False) -> None:
        """Log what our turn (or a claim on a push notice within it) took; if it found more than we had
        room for (any at all, when we are full), due work in a queue we do not serve that a live peer does
        (`elsewhere_due`, when our turn's statement looked already), or leases run out that it could not take
        (`expired`), say so, so that every node with room claims directly (at once, on PostgreSQL)."""
        served = self.config.served
        backlog = expired or (claimed >= free and self.store.any_due(among=served.names))
        if not backlog and elsewhere_due is None and (elsewhere := self._served_elsewhere()) is not None:
            elsewhere_due = self.store.any_due(among=elsewhere, besides=served.names)
        backlog = backlog or bool(elsewhere_due)
        if claimed or backlog:
            self.store.record_turn(slot, claimed, backlog)
        if backlog:
            self._backlog_slot = slot
            if self.listener is not None and self.listener.listening.is_set():
                with self.store.engine.connect() as conn:
                    notify_backlog(conn)
                    conn.commit()

    def _served_elsewhere(self) -> tuple[str, ...] | None:
        """The queues we do not serve that a live peer in the roster does: () for every queue, None when there
        are none (we serve every queue, or nobody else serves the others). Whether that peer has room is its own
        to judge when it sees the flag. Worked out again only when the roster or its rows change."""
        if self.config.served.every:
            return None
        roster = self._roster(self.estimator.db_now())
        key = (self.known.version, tuple(roster))
        if self._elsewhere[0] != key:
            peers = set(roster) - {self.id}
            theirs = [served_names(m["queues"]) for m in self.known.machines() if m["id"] in peers]
            others = sorted({name for names in theirs for name in names} - set(self.config.served.names))
            self._elsewhere = (key, () if any(not names for names in theirs) else tuple(others) or None)
        return self._elsewhere[1]

    def _claim_options(self) -> dict:
        """What every claim of ours passes on about expired leases. Leases that ran out while we ourselves
        could not reach the database are not taken: their owners deserve a full lease to renew after the
        stall. We are settled once our unbroken run of check-ins is longer than a lease and still going (an
        overdue check-in may be a stall we have not noticed yet), and the claim only takes leases that ran out
        before it was sent, in case the database holds it up."""
        now = self.estimator.db_now()
        return dict(take_expired=self._settled(now), expired_before=now)

    def _take_turn(self, slot: int, free: int) -> Turn | None:
        """Record our slot's turn and claim in one statement (None if another machine has the slot), which
        also looks for due work we do not claim there (store.Looks): if a job of our guarded queues is due, the
        turn claimed nothing, and one locked claim takes every queue's jobs in one order of priority."""
        options = self._claim_options()  # expired leases go back to work on turns (DESIGN 3)
        sent = self.clock.monotonic()
        looks = Looks(tuple(sorted(self._guarded)), self._served_elsewhere(), self.config.served.names)
        turn = self.store.take_turn_and_claim(slot, self.id, free, self.config.lease, horizon=self.config.claim_ahead,
                                              plan=self._plan(free), looks=looks,
                                              ends=slot_end(slot, self.config.period), **options)
        if not turn.won:
            return None
        claimed = turn.claimed
        if turn.guarded_due and free > 0:
            claimed = self.store.claim(self.id, free, self.config.lease, horizon=self.config.claim_ahead,
                                       plan=self._plan(free, guarded=True), **options)
        self._start(claimed, sent)
        return replace(turn, claimed=claimed)

    def _claim(self, limit: int, horizon: float = 0.0, guarded: bool = False) -> int:
        """Claim and start up to `limit` jobs; how many. With `guarded`, our queues with a farm-wide limit or
        rate too, in one claim with every other queue, so priority holds across them (a guarded queue with no
        room or no job due gives nothing and, on PostgreSQL, is not even locked: see statements._held)."""
        options = self._claim_options()
        # Expired leases go back to work on turns (DESIGN 3), and on any claim while a peer lately died (the
        # turn's holder may have no room for them); otherwise a claim skips looking for them, which costs a
        # scan of the running jobs' lease entries, live and dead.
        options["take_expired"] = options["take_expired"] and self._peer_lately_dead(options["expired_before"])
        sent = self.clock.monotonic()
        jobs = self.store.claim(self.id, limit, self.config.lease, horizon=horizon,
                                plan=self._plan(limit, guarded and bool(self._guarded)), **options)
        self._start(jobs, sent)
        return len(jobs)

    def _start(self, jobs: list[Claimed], leased_at: float) -> None:
        if jobs:
            self.runner.submit_many(jobs, leased_at=leased_at)
            self._holding.set()

    def _plan(self, free: int, guarded: bool = False) -> Plan:
        """Which queues a claim takes from: every queue we serve (a queue we limit ourselves, as in --queues
        reports:2, in a branch of its own, at most its room here), none with a farm-wide limit or rate. With
        `guarded`, those too (as we last read the settings), each in a branch of its own whose row the claim
        locks: a claim that must wait for other machines' claims of a limited queue, so it is made only when
        such work is due (see _claim, _take_turn), and never by the claims of a backlog."""
        capped = dict(self.config.served.caps)
        names = sorted(set(capped) - self._guarded) + (sorted(self._guarded) if guarded else [])
        alone = tuple((name, min(free, capped[name] - self.runner.held_in(name)) if name in capped else free,
                       name in self._guarded) for name in names)
        return Plan(self.config.served.names, alone)

    def _settled(self, now: float) -> bool:
        return (now - self._streak_start > self.config.lease
                and now - self._last_contact_db <= 2 * self.config.heartbeat)

    def _peer_lately_dead(self, now: float) -> bool:
        """Did a machine die within the last minute (so its jobs' leases may be running out now)?"""
        liveness = self.liveness()
        return any(m["id"] != self.id and m["state"] != MachineState.STOPPED and liveness.is_dead(m["last_seen"], now)
                   and now - m["last_seen"] < self.config.dead_after + LATELY_DEAD for m in self.known.machines())

    def _notice(self, payload: str) -> None:
        """A push notice (listener thread): new work, or another machine's backlog to help with."""
        if payload == BACKLOG:
            self._backlogs.put(slot_of(self.estimator.db_now(), self.config.period))
        else:
            self._pushed.set()
        self._wake.set()

    def _room_made(self) -> None:
        if self._direct and self.runner.room(self.config.capacity) >= max(1, self.config.capacity // 2):
            self._wake.set()  # working off a backlog: claim again now that half our room is free

    def _job_done(self, job: Claimed, _outcome: Outcome) -> None:
        """A job's result is written (the tally counts how it ended; the runner calls _room_made after a batch)."""
        if job.queue in self._guarded:  # its place under the limit is free now, not at our next turn
            self._limited_freed.set()
            self._wake.set()

    # -- for the CLI and the GUI ------------------------------------------

    def snapshot(self) -> dict:
        """This node as plain data (the GUI draws it; it never reads our internals)."""
        synced = self.estimator.synced
        now = self.estimator.db_now() if synced else None
        upcoming = None
        if synced and self.state == MachineState.ACTIVE:
            turn = self._upcoming_turn(now)
            upcoming = None if turn is None else max(0.0, turn * self.config.period - now)
        return {
            "id": self.id, "name": self.config.name, "state": self.state, "db_healthy": self.db_healthy,
            "last_error": self.last_error, "db_now": now,
            "offset": self.estimator.offset() if synced else None,
            "error_bound": self.estimator.error_bound() if synced else None,
            "rtt": self.estimator.rtt() if synced else None,
            "running": self.runner.working() if self.runner else 0, "capacity": self.config.capacity,
            "done": self.done, "failed": self.failed, "turns": self.turns_taken, "next_turn_in": upcoming,
        }
