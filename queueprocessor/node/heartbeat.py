"""The heartbeat: the node's qp-heartbeat thread (docs/design.md §1, §3, §4, §7), and the one writer of everything it
keeps.

Every `heartbeat` it checks in: it renews our leases first (a run not renewed was taken over, one an operator
cancelled is to stop: both are stopped), so that nothing slower delays them; one read samples the database clock and
says whether the roster changed (O(1) rows; then the rows that changed are read, see roster.KnownMachines); it applies
an operator's wish and writes our row. What it keeps (the machine rows, the stall rule's streak, the queues' settings,
when our leases were last renewed) the turn timer, the watchdog and the node read whole; the turn thread tells it a
turn lost the database through `unreachable` (see node's docstring).
"""

import logging
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from ..rules.clock import Clock, OffsetEstimator
from ..rules.events import machine_label
from ..rules.logs import about, one_line
from ..rules.queues import guarded, per_key
from ..rules.roster import KnownMachines, Liveness, slot_of
from ..rules.states import MachineState, Outcome, Wish
from ..store.roster import FarmRead
from ..store.stores import Store
from .config import NodeConfig
from .flowcount import FlowCount
from .joined import Joined, OfJoinedNode
from .runs import RunKey
from .tally import Tally
from .turn_timer import TurnTimer
from .warmup import Warmup

log = logging.getLogger("queueprocessor.node")

# A paused or draining machine hands back the jobs it claimed and has not begun (see JobRunner.hand_back_waiting),
# with this reason (runs.STOPPED).
HAND_BACK = {MachineState.PAUSED: "paused", MachineState.DRAINING: "released"}


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


class Member(Joined, Protocol):
    """What the heartbeat reads of its node (node.Node): its parts, set once; what start() sets; its state, its
    counts; and the two things it asks of it: to note a failure, to stop once drained."""

    config: NodeConfig
    store: Store
    clock: Clock
    estimator: OffsetEstimator
    tally: Tally
    flows: FlowCount
    turns: TurnTimer
    warmup: Warmup

    @property
    def state(self) -> MachineState: ...

    @property
    def done(self) -> int: ...

    @property
    def failed(self) -> int: ...

    def note_failure(self, exc: Exception, headline: str) -> None: ...

    def stop(self, drain: bool = True, timeout: float | None = None, reason: str = "exit") -> None: ...


class Heartbeat(OfJoinedNode):
    """The qp-heartbeat thread's state and work: the node runs `loop` on its thread, after start() ran the first
    `checkin` itself (before the thread exists)."""

    node: Member

    def __init__(self, node: Member, stop: threading.Event) -> None:
        """`stop`: the node's latch, set once its jobs have stopped (the heartbeat renews them until then)."""
        self.node = node
        self.config, self.clock, self.estimator = node.config, node.clock, node.estimator
        self._stop = stop
        self.wished = MachineState.ACTIVE  # the operators' wish for us (see Node.state)
        self._known = KnownMachines()  # the machine rows, as of the last heartbeat
        self.known = self._known.copy()
        self.upcoming: tuple[int, float | None] = (0, None)  # (farm read number, earliest occurrence to make)
        # Operators' queue settings as of `_queues_changed` (the heartbeat's read says when they change): which
        # of our queues are paused or guarded by a farm-wide limit, rate or breaker.
        self.queue_settings: dict[str, dict[str, Any]] = {}
        self.guarded: frozenset[str] = frozenset()  # ours held back (rules.queues.guarded): their claims lock
        self.keyed: frozenset[str] = frozenset()  # those of them with a limit or rate per key: their claims keep it
        self._queues_changed: float | None = None
        self._checked_in = False
        self._streak_start = float("inf")
        self._last_contact_db = float("-inf")
        self.renewed_at = float("-inf")  # monotonic send time of the last successful renewal (start() sets the first)
        self.unreachable = threading.Event()  # a notice: a turn lost the database (set by qp-turns)
        self._outage: float | None = None  # database time our contact broke off, logged once it is back
        self._fences_logged = 0

    @property
    def healthy(self) -> bool:
        """Do we claim? Only while our last check-in got through, no turn has lost the database since one
        began, and our leases were renewed in time (a check-in stuck on a dead connection says nothing)."""
        overdue = self.clock.monotonic() - self.renewed_at > self.config.lease - self.config.fence_margin
        return self._checked_in and not self.unreachable.is_set() and not overdue

    def liveness(self) -> Liveness:
        return Liveness(self.config.dead_after, self._streak_start)

    def settled(self, now: float) -> bool:
        """Is our unbroken run of check-ins longer than a lease and still going (an overdue check-in may be a
        stall we have not noticed yet)? Only then may our claims take expired leases (see TurnTimer)."""
        return now - self._streak_start > self.config.lease and now - self._last_contact_db <= 2 * self.config.heartbeat

    def _outlook(self) -> Outlook:
        return Outlook(self.healthy, self.node.state, self.liveness())

    def loop(self) -> None:
        next_beat = self.clock.monotonic()
        while not self._stop.is_set():
            next_beat += self.config.heartbeat
            self._stop.wait(max(0.0, next_beat - self.clock.monotonic()))
            if self._stop.is_set():
                return
            try:
                self.checkin()
            except Exception as exc:  # database down: keep trying; the watchdog fences us off
                self.node.tally.renewal_failed()
                self.node.note_failure(exc, "check-in failed, claiming paused")
                self._checked_in = False
            if self._runner.count() == 0:
                self.node.store.idle()
            if self.node.state == MachineState.DRAINING and self._runner.count() == 0:
                log.info("drained: no jobs left, stopping")
                threading.Thread(target=self.node.stop, kwargs={"drain": False}, name="qp-stop").start()
                return

    def checkin(self) -> None:
        outlook = self._outlook()
        self.unreachable.clear()  # a turn that loses the database from now on is news to this check-in
        sent = self.clock.monotonic()
        self._renew()  # first: a slow read of the roster must not fence our jobs off
        self.renewed_at = sent
        since = slot_of(self.estimator.db_now(), self.config.period) - 3
        before = self.estimator.db_now() - self.config.stale  # a machine last seen before is a suspect
        farm = self.node.store.roster.read_farm(
            self._me, before, since, stamp=self.clock.monotonic
        )  # also a clock sample
        assert farm.sample is not None  # asked for with stamp
        self.estimator.add(farm.sample)
        self._note_contact(farm.now)
        moved = self._learn_roster(farm, before)
        self.upcoming = (self.upcoming[0] + 1, farm.next_schedule)
        self.node.warmup.note(farm.next_schedule)
        applied = self._apply_wish(farm.wish)
        if (state := self.node.state) in HAND_BACK:  # at every heartbeat: a turn under way may yet have claimed some
            self._runner.hand_back_waiting(HAND_BACK[state])
        if farm.queues_changed != self._queues_changed:
            self.queue_settings, self._queues_changed = self.node.store.queues.settings(), farm.queues_changed
            held = {
                n: row for n, row in self.queue_settings.items() if self.config.served.serves(n) and not row["paused"]
            }
            self.guarded = frozenset(name for name, row in held.items() if guarded(row))
            self.keyed = frozenset(name for name, row in held.items() if per_key(row))
            self.node.flows.watch(self.queue_settings)
        self.node.store.machines.heartbeat(
            self._me,
            state=self.node.state,
            applied_wish=applied,
            running=self._runner.working(),
            done=self.node.done,
            failed=self.node.failed,
            offset=self.estimator.offset(),
            rtt=self.estimator.rtt(),
            error_bound=self.estimator.error_bound(),
        )
        if farm.backlog_slot is not None:
            self.node.turns.backlogs.put(farm.backlog_slot)
        self._checked_in = True
        if self.healthy and not outlook.healthy:  # not after a check-in the database stalled under (healthy)
            log.info(
                "database reachable (offset %+.4f s, rtt %.2f ms)", self.estimator.offset(), self.estimator.rtt() * 1000
            )
        if self._outage is not None:
            self._log_outage(self._outage, farm.now)
        if outlook.news(self._outlook(), moved, farm.backlog_slot is not None):
            self.node.turns.wake.set()  # the turn timer plans again

    def _renew(self) -> None:
        """Renew the leases of the runs we hold, writing their progress with it (fenced as the renewal is: no
        statement of its own); stop those not renewed (taken over) and those an operator cancelled."""
        held, renewing = self._runner.held(), self.clock.monotonic()
        news = self._runner.progress_news()
        renewed = self.node.store.runs.renew(self._me, held, self.config.lease, {k: p for k, (_, p) in news.items()})
        self._runner.renewed(list(renewed), renewing)
        for key, (context, said) in news.items():
            if key in renewed:
                context.told = said
        self._handle_renewals(held, renewed)

    def _learn_roster(self, farm: FarmRead, before: float) -> bool:
        """Keep our copy of the machine rows current: the rows changed since our version when the roster
        version moved (every row when we are far behind, or cannot tell what changed), else only the
        suspects' last_seen (see roster.KnownMachines). Suspects we find dead are buried, so nobody reads
        them again. Whether the rows or the suspects changed, or our copy had gone stale by this read: the turn
        timer sleeps on a stale roster (no turn of ours in it, no change it could wake for) until told."""
        moved = True
        peers = self.node.store.roster
        if self._known.current(farm.version):
            stale = self._known.stale(farm.now, self.liveness())
            moved = self._known.update(before, farm.suspects) or stale
        elif (behind := self._known.behind(farm.version)) is None or not self._known.catch_up(
            *peers.read_changes(*behind), before, farm.suspects
        ):
            self._known.replace(*peers.read_all(), before)
        self.known = self._known.copy()
        for machine_id, last_seen in self._known.dead(farm.now, self.liveness()):
            if peers.bury(machine_id, last_seen, judge=machine_label(self.config.name, self._me)):
                log.warning(
                    "machine %s (%s) stopped checking in: judged dead", machine_id, self._known.name(machine_id)
                )
        return moved

    def _note_contact(self, db_time: float) -> None:
        """Track our unbroken run of check-ins: peers are only judged on silence within it."""
        if db_time - self._last_contact_db > 2 * self.config.heartbeat:
            self._streak_start = db_time
            self.node.turns.sweep.set()  # the farm may have been down for longer than a schedule's grace
            if self._last_contact_db > float("-inf"):
                self._outage = self._last_contact_db
        self._last_contact_db = db_time

    def _log_outage(self, since: float, now: float) -> None:
        """Log the stretch without the database this check-in ended (a restart, a failover), and whether the
        watchdog fenced our jobs off in it, now that the database takes writes again. The log is a record, not
        the farm's safety: failing to write it never fails a check-in (it is tried again at the next one)."""
        fences = self.node.tally.read().fences
        try:
            self.node.store.events.outage(self._me, since, now, fences - self._fences_logged)
        except Exception as exc:
            log.warning("could not log the outage: %s", one_line(exc))
            return
        self._outage, self._fences_logged = None, fences

    def _apply_wish(self, wish: str | None) -> str | None:
        """Apply an operator's wish to our state. A drain is for good: once draining, by a wish or by stop(),
        the state stays draining whatever this writes (see Node.state)."""
        state = self.node.state
        if wish not in tuple(Wish) or state == MachineState.STOPPED:
            return None
        target = Wish(wish).leads_to
        if state == MachineState.DRAINING and target != MachineState.DRAINING:
            log.info("ignoring %s: this machine is draining", wish)
        elif target != state:
            log.info("operator wish: %s (%s -> %s)", wish, state, target)
            self.wished = target
            if target == MachineState.ACTIVE:
                self.node.turns.sweep.set()
            if target == MachineState.DRAINING:
                self._runner.release_singletons()
        return wish

    def _handle_renewals(self, held: list[RunKey], renewed: dict[RunKey, bool]) -> None:
        """Stop the runs whose leases were not renewed (taken over), and those an operator cancelled."""
        for key in held:
            if key not in renewed:
                if self._runner.stop_job(key, Outcome.LOST):
                    log.warning("job %s: lease lost to another machine, stopped it", key[0], extra=about(key[0]))
            elif renewed[key]:
                self._runner.stop_job(key, Outcome.CANCELLED)
