"""The turn timer: the node's qp-turns thread (docs/design.md §2, §3, §9), and the one writer of everything it keeps.

It sleeps until this machine's next turn, the next change of the roster or a notice, takes the turn (one
statement that records the slot and claims), says whether the turn left a backlog, and between turns claims
directly while a backlog is worked off, or to fill a place freed under a queue's farm-wide limit. It ticks
every `tick` (10 ms) only while there is work to claim directly.

What it reads of the node (the roster copy, the state, the guarded queues, the streak of check-ins) is
written by the node's heartbeat and read whole; what others want of it comes as notices (see node's
docstring): `wake`, `backlogs`, `sweep`, and its own `_pushed`, `_released` and `_limited_freed`, set through
`notice` (the listener), `released`, `job_done` and `room_made` (the runner's writer).
"""

import math
import queue
import threading
from dataclasses import replace
from typing import Any, Protocol

from ..rules.clock import Clock, OffsetEstimator
from ..rules.job import Claimed
from ..rules.queues import served_names
from ..rules.roster import KnownMachines, Liveness, slot_end, slot_of, turn_to_take, turn_wait, upcoming_turn
from ..rules.states import MachineState, Outcome
from ..store.jobs import PRUNE_BATCH
from ..store.stats import HOUR, minute_to_write
from ..store.stores import Store
from ..store.types import ClaimRequest, Looks, Plan, Turn
from .config import NodeConfig
from .joined import Joined, OfJoinedNode
from .push import BACKLOG, FOLLOW_UP, Listener, notify_backlog
from .tally import Tally

TURN_MARGIN = 0.0005  # wake this far past the instant our error bound lets us take the turn
LATELY_DEAD = 60.0  # seconds after a peer's death during which every claim also looks for expired leases
# While a backlog is worked off, a place freed under a limited queue's limit waits at most this long to be
# filled by the next claim of a quarter of our capacity, instead of a claim of its own (see tick).
FREED_WAIT = 0.05


def turn_timer_wait(
    known: KnownMachines,
    me: int,
    now: float,
    liveness: Liveness,
    config: NodeConfig,
    last_taken: int,
    error_bound: float,
) -> float | None:
    """How long an idle active node's turn timer may sleep (None: until woken): until we are surely inside our
    next slot under the roster we know, or that roster changes by itself (a newcomer's join delay, a suspect's
    dead timeout), whichever comes first."""
    wait = known.changes_at(now, liveness, config.join_delay) + TURN_MARGIN - now
    turn = upcoming_turn(known.roster(now, liveness, config.join_delay), me, now, config.period, last_taken)
    if turn is not None:
        wait = min(wait, turn_wait(turn, now, config.period, error_bound, TURN_MARGIN))
    return None if wait == math.inf else max(wait, TURN_MARGIN)


class Host(Joined, Protocol):
    """What the turn timer reads of its node (node.Node): its parts, set once; what start() sets; and what the
    heartbeat writes, whole."""

    config: NodeConfig
    store: Store
    clock: Clock
    estimator: OffsetEstimator
    tally: Tally
    listener: Listener | None

    @property
    def known(self) -> KnownMachines: ...  # the machine rows as of the last heartbeat

    @property
    def guarded(self) -> frozenset[str]: ...  # our queues held back (rules.queues.guarded): claimed under their lock

    @property
    def keyed(self) -> frozenset[str]: ...  # those of them with a limit per key

    @property
    def upcoming(self) -> tuple[int, float | None]: ...  # (farm read number, earliest schedule occurrence to make)

    @property
    def state(self) -> MachineState: ...

    @property
    def db_healthy(self) -> bool: ...

    def liveness(self) -> Liveness: ...

    def settled(self, now: float) -> bool: ...


class TurnTimer(OfJoinedNode):
    """The qp-turns thread's state and work; the node runs `next_wake`, `take_backlog_notices` and `tick` in
    its loop (Node._turn_loop), which notes a failed tick."""

    node: Host

    def __init__(self, node: Host, started: threading.Event) -> None:
        """`started`: the watchdog's notice, set whenever we start jobs."""
        self.node = node
        self.config, self.store, self.clock, self.estimator = node.config, node.store, node.clock, node.estimator
        self.tally = node.tally
        self._started = started
        self._backlog_slot = -1
        self._direct = False
        self._freed_seen: float | None = None  # monotonic time a tick first saw _limited_freed while _direct
        self._last_slot = -1
        self._made: tuple[int, float | None] = (-1, None)  # (farm read number, earliest occurrence left)
        self._housekeep_more = False  # our last housekeeping pass was cut short
        self._elsewhere: tuple[object, tuple[str, ...] | None] = (
            None,
            None,
        )  # ((roster version, roster), _served_elsewhere()'s answer for it)
        self.taken = 0  # turns taken
        # Notices (see the node's docstring)
        self.backlogs: queue.SimpleQueue[int] = queue.SimpleQueue()  # backlog slots: the listener's, heartbeats'
        self.wake = threading.Event()  # look now
        self._pushed = threading.Event()  # new work (the listener)
        self._released = threading.Event()  # our finish released children (the runner's writer): claim them
        self._follow_at: float | None = None  # when to claim again after answering a notice (monotonic; FOLLOW_UP)
        self._limited_freed = threading.Event()  # a job of a guarded queue ended here: claim its room at once
        # Drop occurrences that waited past their schedule's grace, before this node's next turn claims: set
        # when it starts, when its contact with the database resumes, when it is resumed, and by housekeeping.
        self.sweep = threading.Event()
        self.sweep.set()

    def take_backlog_notices(self) -> None:
        """Fold the backlog slots other threads sent (a push, a heartbeat's read) into ours. Taken after our
        own reset, a notice that came in while we reset is kept, not lost."""
        while True:
            try:
                slot = self.backlogs.get_nowait()
            except queue.Empty:
                return
            self._backlog_slot = max(self._backlog_slot, slot)

    def next_wake(self) -> float | None:
        """How long the turn timer may sleep (None: until woken): until we are surely inside our next slot or
        the roster changes by itself, whichever comes first; a tick while there is work to claim directly.
        Whatever else changes our plans wakes us: a check-in that brought news (see Heartbeat.checkin), a push, stop().
        Sleeping until then instead of waking to look keeps an idle node's CPU to a fraction of a percent of
        a core, and starts its turns to a fraction of a millisecond."""
        if not self.node.db_healthy or self.node.state != MachineState.ACTIVE:
            return None
        now = self.estimator.db_now()
        if self._direct or self._pushed.is_set() or self._released.is_set():
            return self.config.tick
        if self._backlog_slot >= slot_of(now, self.config.period) - 2:
            return self.config.tick
        wait = turn_timer_wait(
            self.node.known,
            self._me,
            now,
            self.node.liveness(),
            self.config,
            self._last_slot,
            self.estimator.error_bound(),
        )
        if self._follow_at is None:
            return wait
        follow = max(self._follow_at - self.clock.monotonic(), 0.0)
        return follow if wait is None else min(wait, follow)

    def _roster(self, now: float, known: KnownMachines | None = None) -> list[int]:
        """The roster at `now` by our copy of the machine rows (`known`: one already read, to read more from)."""
        known = self.node.known if known is None else known
        return known.roster(now, self.node.liveness(), self.config.join_delay)

    def upcoming(self, now: float) -> int | None:
        """Our next slot under the current roster that we have not taken yet; None if not in the roster."""
        return upcoming_turn(self._roster(now), self._me, now, self.config.period, self._last_slot)

    def tick(self) -> None:
        """Take our turn if its slot has come; else take pushed work within our turn (and again FOLLOW_UP after the
        notice), the children our own finishes released, and claim directly while a backlog is worked off or a
        place under a limit was freed here."""
        if self.node.state != MachineState.ACTIVE:
            return
        now = self.estimator.db_now()
        slot = slot_of(now, self.config.period)
        free = self._runner.room(self.config.capacity)
        if slot != self._last_slot:
            if (
                turn_to_take(
                    self._roster(now),
                    self._me,
                    now,
                    self.config.period,
                    self.estimator.error_bound(),
                    self._last_slot,
                )
                is not None
            ):
                self._last_slot = slot
                if self._pushed.is_set():  # the turn's claim covers what the notice announced; claim again later
                    self._pushed.clear()  # for a commit that skipped its notice for that one (see push.FOLLOW_UP)
                    self._follow_at = self.clock.monotonic() + FOLLOW_UP
                self._materialise_due()
                if self.sweep.is_set():
                    self.sweep.clear()
                    self.store.schedules.drop_missed()
                turn = self._take_turn(slot, free)
                if turn is not None:
                    self._took_turn(slot, free, turn, now)
                return
        if self._pushed.is_set():
            self._pushed.clear()
            if self._last_slot == slot:  # our turn is under way: take the new work now, and again a little later
                self._follow_at = self.clock.monotonic() + FOLLOW_UP
                free = self._claim_pushed(slot, free)
        if self._follow_at is not None and self.clock.monotonic() >= self._follow_at:
            self._follow_at = None  # the jobs whose commits skipped their notice for the one we answered
            if free > 0 or self._last_slot == slot:
                free = self._claim_pushed(slot, free)
        if self._released.is_set():  # our own finish released children, due now: we have the room they need
            self._released.clear()
            if free > 0:
                self._claim(free, guarded=self._take_freed())
                free = self._runner.room(self.config.capacity)
        if self._backlog_slot >= slot - 2 and free > 0 and not self._direct:
            self._direct = True
        if self._direct:
            # Work-conserving: a recent turn found more than its holder could take. Slow jobs free a slot or
            # two per tick: claiming for each cost a statement per couple of jobs (HTTP jobs: 4 per claim), so
            # we claim a quarter of our capacity at a time. A place freed under a limited queue's limit rides
            # with that claim (guarded then), waiting for it at most FREED_WAIT. Like a turn's, the claim looks a
            # period ahead: work of a higher priority than the backlog due before the next turn (a schedule's
            # occurrence) is taken ahead of its time and starts at it, not at the next claim after it. A claim
            # takes at most half our capacity, and the room left is claimed at once: the next claim is under way
            # while the runner starts the last one's jobs and writes the results before them.
            if free >= max(1, self.config.capacity // 4) or (free > 0 and self._freed_waited()):
                limit = min(free, max(1, self.config.capacity // 2))
                if not self._claim(limit, self.config.claim_ahead, guarded=self._take_freed()):
                    self._direct = False
                    self._backlog_slot = -1
                elif limit < free:
                    self.wake.set()
        elif free > 0 and self._take_freed():
            self._claim(free, guarded=True)

    def _claim_pushed(self, slot: int, free: int) -> int:
        """Take pushed work (a notice, or the claim that follows one) and flag it if we are full; our room left."""
        self._take_freed()  # the claim is guarded: it fills the places freed under a limit too
        claimed = self._claim(free, self.config.claim_ahead, guarded=True)
        if self._last_slot == slot:
            self._flag_backlog(slot, free, claimed)
        return self._runner.room(self.config.capacity)

    def _take_freed(self) -> bool:
        """Whether a job of a guarded queue ended here since our last guarded claim (see job_done): if so, the
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
        reading, upcoming = self.node.upcoming
        if self._made[0] == reading:
            upcoming = self._made[1]
        if upcoming is not None and upcoming <= self.estimator.db_now() + self.config.schedule_ahead:
            made = self.store.schedules.materialise(ahead=self.config.schedule_ahead, period=self.config.period)
            self._made = (reading, made.next_schedule)

    def _took_turn(self, slot: int, free: int, turn: Turn, now: float) -> None:
        """The turn was ours: say whether it left a backlog for the others, and keep the tables trimmed.

        A turn that filled its room (or had none) puts the expired leases it could not take back in the queue
        (docs/design.md §3), where they are a backlog that any machine with room takes at once, first (their run_at is
        old): under a backlog every turn-holder may be full for minutes, and a dead machine's jobs may be more
        than the next turn-holders have room for. A turn that may not take expired leases (we are not settled:
        we just joined, or the database stalled) flags those it finds as a backlog, for the settled machines:
        a machine restarted after a crash is unsettled just when its dead predecessor's leases run out."""
        self.taken += 1
        self.tally.turn(now - slot * self.config.period)
        settled = self.node.settled(now)
        if len(turn.claimed) >= free and settled:
            self.store.jobs.requeue_expired(before=now)
        self._flag_backlog(
            slot, free, len(turn.claimed), turn.elsewhere_due, expired=not settled and self.store.jobs.any_expired()
        )
        if slot % max(1, round(self.config.housekeeping / self.config.period)) == 0 or self._housekeep_more:
            self._housekeep()
        if (minute := minute_to_write(slot, self.config.period)) is not None:
            self._write_history(minute, now)

    def _write_history(self, minute: int, now: float) -> None:
        """The farm's history (docs/design.md §11), by whoever holds the first turn of a slot past a minute's end
        (one statement a minute for the whole farm); after an hour's last minute, the hourly roll-up and retention of
        the history and the event log."""
        self.store.stats.write_minute(minute)
        if (minute + 60) % HOUR == 0:
            self.store.stats.roll_up(now, self.config.keep_history)
            self.store.events.prune(self.config.keep_events)

    def _housekeep(self) -> None:
        """Retention, once per `housekeeping` seconds for the whole farm (by whoever holds the turn of a slot
        that is a multiple of it), so an idle farm's cost does not grow with its machines: trim the turn log and
        delete finished jobs past `keep_jobs` (or their queue's own `keep`) a small batch at a time, for at most a
        quarter period per turn. A pass cut short goes on at our next turn. Our next turn also sweeps missed
        schedule occurrences (see ScheduleStore.drop_missed), for those left waiting while the farm was busy."""
        started = self.clock.monotonic()
        self.store.turns.prune(self.config.turn_keep)
        self.store.queues.recount()
        self._housekeep_more = True
        self.store.jobs.prune_ranges(self.config.keep_jobs)
        while self.store.jobs.prune(self.config.keep_jobs) == PRUNE_BATCH:
            if self.clock.monotonic() - started > self.config.period / 4:
                return
        self._housekeep_more = False
        self.sweep.set()

    def _flag_backlog(
        self, slot: int, free: int, claimed: int, elsewhere_due: bool | None = None, expired: bool = False
    ) -> None:
        """Log what our turn (or a claim on a push notice within it) took; if it found more than we had
        room for (any at all, when we are full), due work in a queue we do not serve that a live peer does
        (`elsewhere_due`, when our turn's statement looked already), or leases run out that it could not take
        (`expired`), say so, so that every node with room claims directly (at once, on PostgreSQL)."""
        served = self.config.served
        backlog = expired or (claimed >= free and self.store.jobs.any_due(among=served.names))
        if not backlog and elsewhere_due is None and (elsewhere := self._served_elsewhere()) is not None:
            elsewhere_due = self.store.jobs.any_due(among=elsewhere, besides=served.names)
        backlog = backlog or bool(elsewhere_due)
        if claimed or backlog:
            self.store.turns.record(slot, claimed, backlog)
        if backlog:
            self._backlog_slot = slot
            if self.node.listener is not None and self.node.listener.listening.is_set():
                with self.store.engine.connect() as conn:
                    notify_backlog(conn)
                    conn.commit()

    def _served_elsewhere(self) -> tuple[str, ...] | None:
        """The queues we do not serve that a live peer in the roster does: () for every queue, None when there
        are none (we serve every queue, or nobody else serves the others). Whether that peer has room is its own
        to judge when it sees the flag. Worked out again only when the roster or its rows change."""
        if self.config.served.every:
            return None
        known = self.node.known  # read once: the heartbeat replaces it whole
        roster = self._roster(self.estimator.db_now(), known)
        key = (known.version, tuple(roster))
        if self._elsewhere[0] != key:
            peers = set(roster) - {self._me}
            theirs = [served_names(m["queues"]) for m in known.machines() if m["id"] in peers]
            others = sorted({name for names in theirs for name in names} - set(self.config.served.names))
            self._elsewhere = (key, () if any(not names for names in theirs) else tuple(others) or None)
        return self._elsewhere[1]

    def _claim_options(self) -> dict[str, Any]:
        """What every claim of ours passes on about expired leases. Leases that ran out while we ourselves
        could not reach the database are not taken: their owners deserve a full lease to renew after the
        stall (we must be settled: see Node.settled), and the claim only takes leases that ran out before it
        was sent, in case the database holds it up."""
        now = self.estimator.db_now()
        return dict(take_expired=self.node.settled(now), expired_before=now)

    def _take_turn(self, slot: int, free: int) -> Turn | None:
        """Record our slot's turn and claim in one statement (None if another machine has the slot), which
        also looks for due work we do not claim there (store.Looks): if a job of our guarded queues is due, the
        turn claimed nothing, and one locked claim takes every queue's jobs in one order of priority."""
        options = self._claim_options()  # expired leases go back to work on turns (docs/design.md §3)
        sent = self.clock.monotonic()
        looks = Looks(tuple(sorted(self.node.guarded)), self._served_elsewhere(), self.config.served.names)
        request = ClaimRequest(
            self._me, free, self.config.lease, horizon=self.config.claim_ahead, plan=self._plan(free), **options
        )
        turn = self.store.jobs.take_turn_and_claim(slot, request, looks=looks, ends=slot_end(slot, self.config.period))
        if not turn.won:
            return None
        claimed = turn.claimed
        if turn.guarded_due and free > 0:
            claimed = self.store.jobs.claim(replace(request, plan=self._plan(free, guarded=True)))
        self._start(claimed, sent, slot)
        return replace(turn, claimed=claimed)

    def _claim(self, limit: int, horizon: float = 0.0, guarded: bool = False) -> int:
        """Claim and start up to `limit` jobs; how many. With `guarded`, our queues with a farm-wide limit or
        rate too, in one claim with every other queue, so priority holds across them (a guarded queue with no
        room or no job due gives nothing and, on PostgreSQL, is not even locked: see sql.gates.held_queues)."""
        options = self._claim_options()
        # Expired leases go back to work on turns (docs/design.md §3), and on any claim while a peer lately died (the
        # turn's holder may have no room for them); otherwise a claim skips looking for them, which costs a
        # scan of the running jobs' lease entries, live and dead.
        options["take_expired"] = options["take_expired"] and self._peer_lately_dead(options["expired_before"])
        sent = self.clock.monotonic()
        plan = self._plan(limit, guarded and bool(self.node.guarded))
        jobs = self.store.jobs.claim(
            ClaimRequest(self._me, limit, self.config.lease, horizon=horizon, plan=plan, **options)
        )
        self._start(jobs, sent)
        return len(jobs)

    def _start(self, jobs: list[Claimed], leased_at: float, slot: int | None = None) -> None:
        if jobs:
            self._runner.submit_many(jobs, leased_at=leased_at, slot=slot)
            self._started.set()

    def _plan(self, free: int, guarded: bool = False) -> Plan:
        """Which queues a claim takes from: every queue we serve (a queue we limit ourselves, as in --queues
        reports:2, in a branch of its own, at most its room here), none with a farm-wide limit or rate. With
        `guarded`, those too (as we last read the settings), each in a branch of its own whose row the claim
        locks: a claim that must wait for other machines' claims of a limited queue, so it is made only when
        such work is due (see _claim, _take_turn), and never by the claims of a backlog."""
        capped, ours = dict(self.config.served.caps), self.node.guarded  # read once: the heartbeat may replace it
        names = sorted(set(capped) - ours) + (sorted(ours) if guarded else [])
        alone = tuple(
            (name, min(free, capped[name] - self._runner.held_in(name)) if name in capped else free, name in ours)
            for name in names
        )
        return Plan(self.config.served.names, alone, tuple(sorted(self.node.keyed & set(names))))

    def _peer_lately_dead(self, now: float) -> bool:
        """Did a machine die within the last minute (so its jobs' leases may be running out now)?"""
        liveness = self.node.liveness()
        return any(
            m["id"] != self._me
            and m["state"] != MachineState.STOPPED
            and liveness.is_dead(m["last_seen"], now)
            and now - m["last_seen"] < self.config.dead_after + LATELY_DEAD
            for m in self.node.known.machines()
        )

    def notice(self, payload: str) -> None:
        """A push notice (listener thread): new work, or another machine's backlog to help with."""
        if payload == BACKLOG:
            self.backlogs.put(slot_of(self.estimator.db_now(), self.config.period))
        else:
            self._pushed.set()
        self.wake.set()

    def released(self, _count: int) -> None:
        """A finish of ours released children (the runner's writer, once it committed): claim them now, on every
        dialect, instead of waiting for a turn or for the slot's holder to hear of them."""
        self._released.set()
        self.wake.set()

    def room_made(self) -> None:
        if self._direct and self._runner.room(self.config.capacity) >= max(1, self.config.capacity // 2):
            self.wake.set()  # working off a backlog: claim again now that half our room is free

    def job_done(self, job: Claimed, _outcome: Outcome) -> None:
        """A job's result is written (the tally counts how it ended; the runner calls room_made after a batch)."""
        if job.queue in self.node.guarded:  # its place under the limit is free now, not at our next turn
            self._limited_freed.set()
            self.wake.set()
