"""The node: one machine's part in the farm (docs/design.md §1-§3, §5).

Named threads, none of which waits on another:
- qp-heartbeat: every heartbeat, samples the database clock while reading what
  changed in the roster (O(1) rows, see roster.KnownMachines), checks in, renews
  leases and applies operators' wishes;
- qp-turns: the turn timer (see turn_timer): sleeps until this machine's next
  turn, the next change of the roster or a notice (ticking every 10 ms while there
  is work to claim directly), takes the turn and claims work;
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
  _threads, turns
  _wished (pause, resume, drain)          qp-heartbeat   an operator's wish on the machine row
  state (a property)                      -              stopped; else draining once stop() sets _leaving
                                                         (no wish clears it); else _wished
  _known, known (its copy for readers),   qp-heartbeat   - (start() runs the first check-in, before the
  upcoming, queue_settings, guarded,                     thread exists)
  _queues_changed, _checked_in,
  _streak_start, _last_contact_db,
  _renewed_at
  db_healthy (a property)                 -              _checked_in, leases renewed in time, and no
                                                         _unreachable: set by qp-turns when a turn loses
                                                         the database, cleared by qp-heartbeat as a
                                                         check-in begins
  turns' fields (turn_timer.TurnTimer:    qp-turns       turns.backlogs, a queue of backlog slots
  the turn and backlog it is on, what                    (qp-listen, qp-heartbeat); turns.wake, look now
  it claims directly, turns taken)                       (anyone); turns.sweep, sweep missed occurrences
                                                         (qp-heartbeat: contact back, resumed); new work
                                                         and places freed under a limit, through
                                                         turns.notice (qp-listen) and turns.job_done (the
                                                         runner's writer)
  _holding (jobs started: watch them)     qp-watchdog    set by qp-turns when it starts jobs, and stop()
  _failures[thread name]                  that thread    last_error (a property) shows the newest
  done, failed (properties)               the tally      counted under its lock by the runner's writer
  _begun, _stopping                       _stop_lock     whoever holds the lock
"""

import logging
import os
import socket
import threading
import uuid
from contextlib import ExitStack
from dataclasses import dataclass

from ..executors import Executor, make_executors
from ..rules.clock import Clock, OffsetEstimator, SystemClock
from ..rules.logs import about, one_line
from ..rules.roster import KnownMachines, Liveness, slot_of
from ..rules.states import MachineState, Outcome, Wish
from ..store.database import unreachable
from ..store.queues import QueueStore
from ..store.roster import FarmRead, RosterStore
from ..store.schedules import ScheduleStore
from ..store.stores import Store
from ..version import __version__
from .config import NodeConfig
from .push import Listener, where_to_listen
from .runner import JobRunner, RunKey
from .tally import Tally
from .turn_timer import TurnTimer

log = logging.getLogger("queueprocessor.node")

GUARDED = ("qp-heartbeat", "qp-turns", "qp-watchdog")  # the node's own threads (see _guard)


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


class Node:
    def __init__(
        self, store: Store, config: NodeConfig, clock: Clock | None = None, executors: dict[str, Executor] | None = None
    ):
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
        self.upcoming: tuple[int, float | None] = (0, None)  # (farm read number, earliest occurrence to make)
        # Operators' queue settings as of `_queues_changed` (the heartbeat's read says when they change): which
        # of our queues are paused or guarded by a farm-wide limit or rate.
        self.queue_settings: dict[str, dict] = {}
        self.guarded: frozenset[str] = frozenset()  # ours with a farm-wide limit or rate: their claims lock
        self._queues_changed: float | None = None
        self._checked_in = False
        self._streak_start = float("inf")
        self._last_contact_db = float("-inf")
        self._renewed_at = float("-inf")  # monotonic send time of the last successful renewal
        # Notices (see the module docstring)
        self._unreachable = threading.Event()
        self._holding = threading.Event()
        self.turns = TurnTimer(self, started=self._holding)  # qp-turns' state and work
        self._failures: dict[str, tuple[float, str] | None] = dict.fromkeys(GUARDED)
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
            self._renewed_at = self.clock.monotonic()
            self.runner = JobRunner(
                self.store,
                self.id,
                self.executors,
                self.estimator.db_now,
                self.turns.job_done,
                self.turns.room_made,
                self.tally,
                self.config.fenced_grace,
            )
            self.runner.start()
            undo.callback(self.runner.stop)
            self._checkin()
            undo.callback(self._end_threads)
            self._start_threads()
            undo.pop_all()

    def _start_threads(self) -> None:
        loops = {"qp-heartbeat": self._heartbeat_loop, "qp-turns": self._turn_loop, "qp-watchdog": self._watchdog_loop}
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
        self._holding.set()  # the watchdog may be asleep until a job starts
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
        try:
            self.store.machines.mark_stopped(self.id)
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
        # The heartbeat renews and the watchdog fences the jobs until they have stopped; a turn still under way
        # hands back what it claims.
        self.runner.refuse(reason)
        self._end_turns(wait=self.config.lease)
        self.runner.stop_all(reason)
        self._await_idle(5)
        self._end_threads()
        self.runner.stop()
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
        self.upcoming = (self.upcoming[0] + 1, farm.next_schedule)
        applied = self._apply_wish(farm.wish)
        if farm.queues_changed != self._queues_changed:
            self.queue_settings, self._queues_changed = self.queue_store.settings(), farm.queues_changed
            self.guarded = frozenset(
                name
                for name, row in self.queue_settings.items()
                if self.config.served.serves(name)
                and not row["paused"]
                and (row["max_running"] is not None or row["rate_count"] is not None)
            )
        held, renewing = self.runner.held(), self.clock.monotonic()
        renewed = self.store.runs.renew(self.id, held, self.config.lease)
        self.runner.renewed(list(renewed), renewing)
        self._handle_renewals(held, renewed)
        self.store.machines.heartbeat(
            self.id,
            state=self.state,
            applied_wish=applied,
            running=self.runner.working(),
            done=self.done,
            failed=self.failed,
            offset=self.estimator.offset(),
            rtt=self.estimator.rtt(),
            error_bound=self.estimator.error_bound(),
        )
        self._renewed_at = sent
        if farm.backlog_slot is not None:
            self.turns.backlogs.put(farm.backlog_slot)
        self._checked_in = True
        if self.db_healthy and not outlook.healthy:  # not after a check-in the database stalled under (db_healthy)
            log.info(
                "database reachable (offset %+.4f s, rtt %.2f ms)", self.estimator.offset(), self.estimator.rtt() * 1000
            )
        if outlook.news(self._outlook(), moved, farm.backlog_slot is not None):
            self.turns.wake.set()  # the turn timer plans again

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
                log.warning(
                    "machine %s (%s) stopped checking in: judged dead", machine_id, self._known.name(machine_id)
                )
        return moved

    def _note_contact(self, db_time: float) -> None:
        """Track our unbroken run of check-ins: peers are only judged on silence within it."""
        if db_time - self._last_contact_db > 2 * self.config.heartbeat:
            self._streak_start = db_time
            self.turns.sweep.set()  # the farm may have been down for longer than a schedule's grace
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
                self.turns.sweep.set()
            if target == MachineState.DRAINING:
                self.runner.release_singletons()
        return wish

    def _handle_renewals(self, held: list[RunKey], renewed: dict[RunKey, bool]) -> None:
        """Stop the runs whose leases were not renewed (taken over), and those an operator cancelled."""
        for key in held:
            if key not in renewed:
                if self.runner.stop_job(key, Outcome.LOST):
                    log.warning("job %s: lease lost to another machine, stopped it", key[0], extra=about(key[0]))
            elif renewed[key]:
                self.runner.stop_job(key, Outcome.CANCELLED)

    # -- turns ------------------------------------------------------------

    def liveness(self) -> Liveness:
        return Liveness(self.config.dead_after, self._streak_start)

    def settled(self, now: float) -> bool:
        """Is our unbroken run of check-ins longer than a lease and still going (an overdue check-in may be a
        stall we have not noticed yet)? Only then may our claims take expired leases (see TurnTimer)."""
        return now - self._streak_start > self.config.lease and now - self._last_contact_db <= 2 * self.config.heartbeat

    def _outlook(self) -> Outlook:
        return Outlook(self.db_healthy, self.state, self.liveness())

    def _turn_loop(self) -> None:
        while not self._no_turns.is_set():
            if self.turns.wake.wait(self.turns.next_wake()):
                self.turns.wake.clear()
            self.turns.take_backlog_notices()
            if self.db_healthy and not self._no_turns.is_set():
                try:
                    self.turns.tick()
                except Exception as exc:
                    self._note_failure(exc, "turn failed")
                    if unreachable(exc):  # claim nothing until a check-in gets through
                        self._unreachable.set()

    def _watchdog_loop(self) -> None:
        """The watchdog has its own thread: a turn stuck on a black-holed connection must not keep
        it from stopping our jobs before their leases run out. While we hold no job it sleeps until
        the turn thread starts some (or stop())."""
        while not self._stop.is_set():
            if self.runner.count():
                self._stop.wait(self.config.watchdog_every)
                self._watchdog()
                continue
            self._holding.clear()
            if not self.runner.count():  # looked again after clearing: a job started meanwhile is not missed
                self._holding.wait()

    def _watchdog(self) -> None:
        """Self-fencing: jobs whose leases we could not renew in time are stopped before they run out.
        A run's lease runs from the send time of its claim or of the last renewal that renewed it: a job
        claimed once the database came back is not stopped for the silence before it, and one claimed while a
        renewal was on its way is not credited with that renewal."""
        now = self.clock.monotonic()
        limit = self.config.lease - self.config.fence_margin
        overdue = [key for key, leased_at in self.runner.leases() if now - leased_at > limit]
        stopped = [key for key in overdue if self.runner.stop_job(key, Outcome.LOST)]
        if stopped:
            self.tally.fenced()
            log.warning(
                "no contact with the database for %.1f s: stopping %s jobs before their leases run out",
                now - self._renewed_at,
                len(stopped),
            )

    # -- for the CLI and the GUI ------------------------------------------

    def snapshot(self) -> dict:
        """This node as plain data (the GUI draws it; it never reads our internals)."""
        synced = self.estimator.synced
        now = self.estimator.db_now() if synced else None
        upcoming = None
        if synced and self.state == MachineState.ACTIVE:
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
