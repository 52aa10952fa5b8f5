"""A thousand machines in simulation: the real roster, slot and turn-taking code on virtual clocks.

Each virtual machine decides with the node's own code: queueprocessor.rules.clock.OffsetEstimator (its estimate of
database time and error bound, from round trips), roster.KnownMachines (its copy of the rows, kept current by
the heartbeat read), Liveness (the stall rule), roster.turn_to_take (whether a slot is its turn), and the turn
timer's turn_timer_wait and heartbeat.Outlook (when to wake for the next). What is modelled is everything around
that code:

- the database: machine rows, the roster version, the turn table's unique slot key, each statement applied at
  the instant it reaches the database (one-way delays drawn independently for each direction: a lognormal
  body around `--latency` with a Pareto tail in `--tail` of the statements, capped at `--tail-cap`);
- the clocks: database time is the simulator's time; each machine's monotonic clock runs at its own rate
  (within +-20 ppm) from its own origin, and its idea of database time comes only from its round trips;
- the machines' life: joins, deaths (SIGKILL: silent from then on), operators' pauses and resumes, and
  freezes (a stalled process: silent past its dead timeout, then back, unaware);
- the turn timer: the node's own plan (turn_timer_wait: it sleeps until its next turn or the roster's next
  change by time alone, a newcomer's join delay or a suspect's dead timeout), woken to plan again only by a
  check-in that brought news (heartbeat.Outlook.news), as the node's.

It reports double polls (two turns recorded in one slot of database time) and missed slots (none) over the
slots measured, the statements per second the real farm would make on PostgreSQL (where an idle turn is
one statement), by kind, and the rows read when the roster version moved (the rows changed since each node's
version: store/roster.py) beside what main read then (every row, each time: its read_all), counted in the same
run.

    python bench/simulate.py                             # 1,000 machines, 10,000 slots of 0.25 s
    python bench/simulate.py --machines 50 --slots 200   # a quick look
    python bench/simulate.py --machines 10000 --slots 1000 --churn 3   # the roster reads of a big farm
"""

import argparse
import bisect
import contextlib
import heapq
import math
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from queueprocessor.node.config import NodeConfig  # noqa: E402
from queueprocessor.node.heartbeat import Outlook  # noqa: E402
from queueprocessor.node.turn_timer import turn_timer_wait  # noqa: E402
from queueprocessor.rules.clock import OffsetEstimator, Sample  # noqa: E402
from queueprocessor.rules.roster import KnownMachines, Liveness, slot_end, slot_of, turn_to_take  # noqa: E402
from queueprocessor.rules.states import CHECKING_IN, MachineState, Wish  # noqa: E402

NO_HARNESS = "the database, the clocks and the machines are modelled in memory: no server, no farm, no node process"
WARMUP = 60.0  # seconds of database time before the measured slots: every machine joined and settled
SAMPLES_AT_START = 5  # clock samples a node takes before its first check-in (Node.start)


@dataclass
class Latency:
    """One-way delays: a lognormal body around `median` seconds; a share `tail` from a Pareto tail."""

    median: float
    tail: float
    tail_cap: float
    rng: random.Random

    def __call__(self) -> float:
        delay = self.median * math.exp(self.rng.gauss(0.0, 0.5))
        if self.rng.random() < self.tail:
            delay += min(self.median * 10 * self.rng.paretovariate(1.5), self.tail_cap)
        return delay


class VirtualClock:
    """A machine's monotonic clock: its own origin and rate, read at the simulator's current instant."""

    def __init__(self, sim: "Simulation", rate: float, origin: float):
        self.sim = sim
        self.rate = rate
        self.origin = origin

    def monotonic(self) -> float:
        return self.at(self.sim.now)

    def at(self, db_time: float) -> float:
        """This clock's reading at database time `db_time`."""
        return self.origin + db_time * self.rate

    def time(self) -> float:
        return self.monotonic()

    def seconds(self, local: float) -> float:
        """Database seconds that `local` seconds of this clock take."""
        return local / self.rate


class Database:
    """The modelled database: what the store's statements read and write, applied in database time."""

    def __init__(self):
        self.rows: dict[int, dict] = {}
        self.version = 0
        self._changes: list[tuple[int, int]] = []  # (version, id) as stamped, in order: ix_qp_machines_changed
        self.roster_rows = 0  # rows read by the reads of rows a moved version makes (read_changes, read_all)
        self.roster_rows_main = 0  # what main's read (every row at each moved version) would have read
        self.turns: dict[int, float] = {}  # slot -> when its turn was recorded
        self.refused = 0  # turn inserts that found their slot taken
        self.late = 0  # turn inserts that arrived after their slot ended (statements.turn_row)
        self.statements: Counter = Counter()
        self.rows_returned = 0
        self._seen: list[tuple[float, int]] = []  # (last_seen, id) as written; stale entries are skipped
        self._quiet: dict[int, float] = {}  # checking-in machines last seen before some reader's bound

    def register(self, machine_id: int, now: float, joined_at: float) -> None:
        self.rows[machine_id] = dict(
            id=machine_id, state=MachineState.ACTIVE, last_seen=now, joined_at=joined_at, wish=None, changed=0
        )
        self._write_seen(machine_id, now)
        self._bump(machine_id)
        self.statements["register (insert + version + mark)"] += 3

    def _bump(self, machine_id: int) -> None:
        """sql.machines.bump_roster: the version moves, and is written on the row changed."""
        self.version += 1
        self._set(machine_id, changed=self.version)
        self._changes.append((self.version, machine_id))

    def _set(self, machine_id: int, **values) -> None:
        """Write on a row: a new dict, so that the rows the nodes read (shared, not copied: 10,000 nodes' copies of
        10,000 rows would not fit in memory) stay as they were read."""
        self.rows[machine_id] = self.rows[machine_id] | values

    def _write_seen(self, machine_id: int, now: float) -> None:
        self._set(machine_id, last_seen=now)
        self._quiet.pop(machine_id, None)
        heapq.heappush(self._seen, (now, machine_id))

    def read_farm(self, machine_id: int, bound: float) -> tuple[int, str | None, dict[int, float]]:
        """RosterStore.read_farm: the version, our wish, the machines checking in last seen before `bound`."""
        while self._seen and self._seen[0][0] < bound:
            seen, quiet_id = heapq.heappop(self._seen)
            row = self.rows[quiet_id]
            if row["last_seen"] == seen and row["state"] in CHECKING_IN:
                self._quiet[quiet_id] = seen
        suspects = {i: s for i, s in self._quiet.items() if s < bound and self.rows[i]["state"] in CHECKING_IN}
        self.statements["heartbeat read"] += 1
        self.rows_returned += max(1, len(suspects))
        return self.version, self.rows[machine_id]["wish"], suspects

    def read_all(self) -> tuple[int, list[dict]]:
        self.statements["read every row (version moved)"] += 1
        self.rows_returned += len(self.rows)
        self.roster_rows += len(self.rows)
        return self.version, list(self.rows.values())

    def read_changes(self, since: int, most: int) -> tuple[int, list[dict]]:
        """RosterStore.read_changes: the first `most` rows changed after `since`, through their index (entries a
        later change of the same row replaced are skipped, as the index holds only the row's newest)."""
        rows = []
        for version, machine_id in self._changes[bisect.bisect_right(self._changes, (since, math.inf)) :]:
            if len(rows) == most:
                break
            if self.rows[machine_id]["changed"] == version:
                rows.append(self.rows[machine_id])
        self.statements["read the rows changed (version moved)"] += 1
        self.rows_returned += max(1, len(rows))
        self.roster_rows += len(rows)
        return self.version, rows

    def bury(self, machine_id: int, last_seen: float) -> None:
        row = self.rows[machine_id]
        self.statements["burial (update + version + mark)"] += 1
        if row["last_seen"] == last_seen and row["state"] in CHECKING_IN:
            self._set(machine_id, state=MachineState.DEAD)
            self._quiet.pop(machine_id, None)
            self._bump(machine_id)
            self.statements["burial (update + version + mark)"] += 2

    def heartbeat(self, machine_id: int, state: MachineState, applied: str | None, now: float) -> None:
        """Store.heartbeat: one update while the state is as stored, else a second one and the version."""
        row = self.rows[machine_id]
        self.statements["check-in"] += 1
        if applied is not None and row["wish"] == applied:
            self._set(machine_id, wish=None)
        if row["state"] != state:
            self._set(machine_id, state=state)
            self._bump(machine_id)
            self.statements["check-in, new state (update + version + mark)"] += 3
        self._write_seen(machine_id, now)

    def take_turn(self, slot: int, now: float, ends: float) -> None:
        self.statements["turn (insert + claim, one statement)"] += 1
        if now >= ends:
            self.late += 1
        elif slot in self.turns:
            self.refused += 1
        else:
            self.turns[slot] = now


class SharedRosters:
    """Nodes whose copies of the rows give the same roster share one computation of it by the node's own code
    (KnownMachines.roster): the first to need it computes it, the others find it in their memo, as if each had.

    Without this, each of n nodes recomputes its roster over every row at each change: n x n rows in this one
    process (the model's cost, not the node's: each node computes over its own copy). Two copies give the same
    roster, and the same instants at which it changes by itself, over an interval of database time when they
    hold the same version (the same ids, states and join times: each version is one set of rows), the same
    suspects with their last_seen, and the same dead timeout and join delay; provided that, for each, no machine
    but a suspect may be dead yet (its own heartbeats ran within the dead timeout: what the node's memo asks too)
    and its own streak of check-ins began before every suspect was last seen (so the streak changes no verdict).
    A node outside these computes on its own (SharedKnown)."""

    MOST = 256  # rosters kept: older ones are dropped whole (the nodes keep theirs in their memo)

    def __init__(self) -> None:
        self._rosters: dict[tuple, tuple[float, float, list[int]]] = {}  # key -> (valid from, until, roster)
        self.computed = 0  # rosters the node's code computed and shared
        self.lent = 0  # rosters a node found computed by a peer

    @staticmethod
    def key(known: KnownMachines, now: float, liveness: Liveness, join_delay: float) -> tuple | None:
        """What the roster `known` gives at `now` depends on, when its copy may share it (see above); else None."""
        suspects = known._suspects
        if (
            known.version is None
            or now >= liveness.dies_at(known._fresh_since)
            or liveness.judge_streak_start > min(suspects.values(), default=math.inf)
        ):
            return None
        return known.version, frozenset(suspects.items()), liveness.dead_after, join_delay

    def lend(self, known: KnownMachines, now: float, liveness: Liveness, join_delay: float) -> bool:
        """Before the node's own roster(`now`): put the shared roster in its memo, if it is its and its memo does
        not hold it already."""
        memo = known._memo
        own = (known.version, liveness, join_delay, now >= liveness.dies_at(known._fresh_since))
        if memo is not None and memo[0] == own and memo[1] <= now < memo[2]:
            return False
        key = self.key(known, now, liveness, join_delay)
        shared = None if key is None else self._rosters.get(key)
        if shared is None or not shared[0] < now < shared[1]:
            return False
        known._memo = (own, *shared)
        self.lent += 1
        return True

    def share(self, known: KnownMachines, now: float, liveness: Liveness, join_delay: float) -> None:
        """After the node's code computed its roster at `now` (in its memo): share it, if its copy may."""
        key = self.key(known, now, liveness, join_delay)
        if key is not None and known._memo is not None:
            if len(self._rosters) >= self.MOST:
                self._rosters.clear()
            self._rosters[key] = known._memo[1:]
            self.computed += 1


class SharedKnown(KnownMachines):
    """A node's KnownMachines whose roster() first looks for the one it would compute, already computed by the
    node's code for a peer (SharedRosters), and shares what it computes itself. A node whose heartbeat answer is
    late (its last read's bound past the dead timeout) computes its own, once: the node's memo holds it until
    the next read or change (KnownMachines.roster)."""

    def __init__(self, farm: SharedRosters) -> None:
        super().__init__()
        self.farm = farm

    def roster(self, db_now: float, liveness: Liveness, join_delay: float) -> list[int]:
        memo, lent = self._memo, self.farm.lend(self, db_now, liveness, join_delay)
        ids = super().roster(db_now, liveness, join_delay)
        if not lent and self._memo is not memo:
            self.farm.share(self, db_now, liveness, join_delay)
        return ids


@dataclass
class Machine:
    """One virtual node: the real estimator, known rows, liveness and turn decisions; modelled statements."""

    id: int
    clock: VirtualClock
    config: NodeConfig
    estimator: OffsetEstimator = field(init=False)
    known: KnownMachines = field(default_factory=KnownMachines)
    state: MachineState = MachineState.ACTIVE
    alive: bool = True
    frozen_until: float = -math.inf
    streak_start: float = math.inf
    last_contact: float = -math.inf
    last_slot: int = -1
    wake_generation: int = 0

    def __post_init__(self):
        self.estimator = OffsetEstimator(self.clock)
        self._liveness = Liveness(self.config.dead_after, self.streak_start)

    def liveness(self) -> Liveness:
        return self._liveness

    def outlook(self) -> Outlook:
        """Heartbeat._outlook: a virtual node's database is always reachable (a frozen one does not know it stalled)."""
        return Outlook(True, self.state, self._liveness)

    def note_contact(self, db_time: float) -> None:
        """Heartbeat._note_contact: the stall rule's unbroken run of check-ins."""
        if db_time - self.last_contact > 2 * self.config.heartbeat:
            self.streak_start = db_time
            self._liveness = Liveness(self.config.dead_after, self.streak_start)
        self.last_contact = db_time


class Simulation:
    """The farm: its machines, the database, and the events between them in database time."""

    def __init__(self, args):
        self.rng = random.Random(args.seed)
        self.config = NodeConfig(period=args.period, heartbeat=args.heartbeat, misses=args.misses)
        self.latency = Latency(args.latency, args.tail, args.tail_cap, random.Random(args.seed + 1))
        self.db = Database()
        self.machines: dict[int, Machine] = {}
        self.now = 0.0
        self._events: list = []
        self._sequence = 0
        self.bound_ratio = 0.0  # the largest |estimate - truth| / error bound at a turn decision
        self.life: Counter = Counter()
        self.shared = None if args.per_node else SharedRosters()

    # -- the event loop ----------------------------------------------------

    def at(self, when: float, action, *args) -> None:
        assert when >= self.now, "an event in the past"
        self._sequence += 1
        heapq.heappush(self._events, (when, self._sequence, action, args))

    def run(self, until: float) -> None:
        while self._events and self._events[0][0] <= until:
            when, _, action, args = heapq.heappop(self._events)
            self.now = when
            action(*args)

    def round_trip(self) -> tuple[float, float]:
        """The delays to and from the database of one statement."""
        return self.latency(), self.latency()

    # -- a machine's life ----------------------------------------------------

    def join(self, machine_id: int, first_beat: float = 0.0, joined_before: float = 0.0) -> None:
        """Node.start: register, take a few clock samples, check in (no earlier than `first_beat`); then
        heartbeats and the turn timer. `joined_before`: the row says it joined that long ago (the farm was
        running before the simulation began)."""
        clock = VirtualClock(self, 1 + self.rng.uniform(-20e-6, 20e-6), self.rng.uniform(0, 1e6))
        known = KnownMachines() if self.shared is None else SharedKnown(self.shared)
        machine = self.machines[machine_id] = Machine(machine_id, clock, self.config, known=known)
        there, back = self.round_trip()
        self.at(self.now + there, self._register, machine, back, first_beat, joined_before)

    def _register(self, machine: Machine, back: float, first_beat: float, joined_before: float) -> None:
        self.db.register(machine.id, self.now, self.now - joined_before)
        self.at(self.now + back, self._sample, machine, SAMPLES_AT_START, first_beat)

    def _sample(self, machine: Machine, left: int, first_beat: float) -> None:
        """Store.sample_clock: a round trip that asks only the database's time."""
        there, back = self.round_trip()
        answered = self.now + there + back
        machine.estimator.add(Sample(machine.clock.monotonic(), machine.clock.at(answered), self.now + there))
        self.db.statements["clock sample"] += 1
        if left > 1:
            self.at(answered, self._sample, machine, left - 1, first_beat)
        else:
            self.send_heartbeat(machine, max(answered, first_beat))

    @contextlib.contextmanager
    def node_at(self, instant: float):
        """Run a node's own part at `instant`, a little after the event that led to it (its answer's return):
        it reads only its own clock and state, so nothing else need be simulated in between."""
        now, self.now = self.now, instant
        try:
            yield
        finally:
            self.now = now

    def send_heartbeat(self, machine: Machine, sent: float) -> None:
        """Heartbeat.checkin's read, sent at `sent`: it runs at the database after its delay."""
        self.at(sent + self.latency(), self._read_farm, machine, sent)

    def _read_farm(self, machine: Machine, sent: float) -> None:
        """The heartbeat read at the database; its answer is handled by the node when it returns."""
        if not machine.alive:
            return
        if sent < machine.frozen_until:  # frozen before it could send: it sends when it thaws
            self.send_heartbeat(machine, machine.frozen_until)
            return
        with self.node_at(sent):
            t0, before = machine.clock.monotonic(), machine.estimator.db_now() - self.config.stale
        read = self.db.read_farm(machine.id, before)
        self._answered(machine, t0, self.now, before, read, self.now + self.latency())

    def _answered(
        self, machine: Machine, t0: float, read_at: float, before: float, read: tuple, returned: float
    ) -> None:
        """The read's answer: clock sample, the stall rule's streak, then what changed in the roster."""
        if returned < machine.frozen_until:  # the answer waits for the process to thaw
            self.at(machine.frozen_until, self._answered, machine, t0, read_at, before, read, machine.frozen_until)
            return
        with self.node_at(returned):
            outlook = machine.outlook()
            machine.estimator.add(Sample(t0, machine.clock.monotonic(), read_at))
            machine.note_contact(read_at)
            version, wish, suspects = read
            if machine.known.current(version):
                stale = machine.known.stale(read_at, machine.liveness())  # as Heartbeat._learn_roster
                moved = machine.known.update(before, suspects) or stale
                self._learned(machine, read_at, wish, outlook, moved)
                return
            self.db.roster_rows_main += len(self.db.rows)  # main read every row here
            there, back = self.round_trip()  # Heartbeat._learn_roster: the rows changed, one more round trip
            if (behind := machine.known.behind(version)) is not None:
                heard = (read_at, before, suspects, wish, outlook)
                self.at(self.now + there, self._read_changes, machine, back, behind, heard)
            else:  # far behind: every row
                self.at(self.now + there, self._read_all, machine, back, read_at, before, wish, outlook)

    def _read_changes(self, machine: Machine, back: float, behind: tuple[int, int], heard: tuple) -> None:
        changes = self.db.read_changes(*behind)
        self.at(self.now + back, self._changes_answered, machine, changes, heard)

    def _changes_answered(self, machine: Machine, changes: tuple, heard: tuple) -> None:
        """KnownMachines.catch_up, or every row when a version is on no row (one more round trip)."""
        read_at, before, suspects, wish, outlook = heard
        if not machine.alive:
            return
        if machine.known.catch_up(*changes, before, suspects):
            self._learned(machine, read_at, wish, outlook, True)
            return
        there, back = self.round_trip()
        self.at(self.now + there, self._read_all, machine, back, read_at, before, wish, outlook)

    def _read_all(
        self, machine: Machine, back: float, read_at: float, before: float, wish: str | None, outlook: Outlook
    ) -> None:
        full = self.db.read_all()
        self.at(self.now + back, self._all_answered, machine, full, read_at, before, wish, outlook)

    def _all_answered(
        self, machine: Machine, full: tuple, read_at: float, before: float, wish: str | None, outlook: Outlook
    ) -> None:
        if machine.alive:
            machine.known.replace(*full, before)
            self._learned(machine, read_at, wish, outlook, True)

    def _learned(self, machine: Machine, read_at: float, wish: str | None, outlook: Outlook, moved: bool) -> None:
        """Bury the suspects found dead, apply the operator's wish, check in; plan the turn timer again if the
        check-in brought news (`outlook`: the node's before it, `moved`: new rows or suspects)."""
        for dead_id, last_seen in machine.known.dead(read_at, machine.liveness()):
            there = self.latency()
            self.at(self.now + there, self.db.bury, dead_id, last_seen)
        applied = None
        if wish in tuple(Wish):
            applied = wish
            machine.state = Wish(wish).leads_to
        there, back = self.round_trip()
        self.at(self.now + there, self.db.heartbeat, machine.id, machine.state, applied, self.now + there)
        self.send_heartbeat(machine, self.now + there + back + machine.clock.seconds(self.config.heartbeat))
        if outlook.news(machine.outlook(), moved, backlog=False):
            self.plan_turn(machine)

    # -- the turn timer ----------------------------------------------------

    def plan_turn(self, machine: Machine) -> None:
        """TurnTimer.next_wake (an idle node's): the node's own plan; a new plan drops the earlier one."""
        machine.wake_generation += 1
        if machine.state != MachineState.ACTIVE:
            return
        wait = turn_timer_wait(
            machine.known,
            machine.id,
            machine.estimator.db_now(),
            machine.liveness(),
            self.config,
            machine.last_slot,
            machine.estimator.error_bound(),
        )
        if wait is not None:
            self.at(self.now + machine.clock.seconds(wait), self._tick, machine, machine.wake_generation)

    def _tick(self, machine: Machine, generation: int) -> None:
        """TurnTimer.tick: take the turn if it is ours (the insert reaches the database after its delay)."""
        if not machine.alive or generation != machine.wake_generation:
            return
        if self.now < machine.frozen_until:
            self.at(machine.frozen_until, self._tick, machine, generation)
            return
        if machine.state == MachineState.ACTIVE:
            now = machine.estimator.db_now()
            bound = machine.estimator.error_bound()
            self.bound_ratio = max(self.bound_ratio, abs(now - self.now) / bound)
            ids = machine.known.roster(now, machine.liveness(), self.config.join_delay)
            slot = turn_to_take(ids, machine.id, now, self.config.period, bound, machine.last_slot)
            if slot is not None:
                machine.last_slot = slot
                recorded = self.now + self.latency()
                self.at(recorded, self.db.take_turn, slot, recorded, slot_end(slot, self.config.period))
        self.plan_turn(machine)

    # -- what happens to machines ------------------------------------------

    def kill(self, machine: Machine) -> None:
        machine.alive = False
        self.life["deaths"] += 1

    def pause(self, machine: Machine, wish: Wish) -> None:
        self.db._set(machine.id, wish=wish)
        self.db.statements["operator's wish"] += 1
        self.life[f"{wish}s"] += 1

    def freeze(self, machine: Machine, seconds: float) -> None:
        machine.frozen_until = self.now + seconds
        self.life["freezes"] += 1

    def churn(self, start: float, end: float, events: int, next_id: int) -> None:
        """Spread `events` of each kind over [start, end): joins (ids from `next_id`), deaths, pause-resume pairs,
        freezes."""
        for _ in range(events):
            self.at(self.rng.uniform(start, end), self.join, next_id)
            next_id += 1
            self.at(self.rng.uniform(start, end), self._random, self.kill)
            self.at(self.rng.uniform(start, end), self._random, lambda m: self._pause_for(m, self.rng.uniform(5, 60)))
            self.at(
                self.rng.uniform(start, end),
                self._random,
                lambda m: self.freeze(m, self.rng.uniform(1.5, 3) * self.config.dead_after),
            )

    def _pause_for(self, machine: Machine, seconds: float) -> None:
        self.pause(machine, Wish.PAUSE)
        self.at(self.now + seconds, self.pause, machine, Wish.RESUME)

    def _random(self, action) -> None:
        living = [m for m in self.machines.values() if m.alive and self.now >= m.frozen_until]
        action(self.rng.choice(living))


def judge(turns: dict[int, float], first: int, last: int, period: float) -> tuple[int, int]:
    """Double polls and missed slots: turns bucketed by the database time they were recorded at."""
    per_slot = Counter(slot_of(when, period) for when in turns.values())
    double = sum(1 for slot in range(first, last) if per_slot[slot] > 1)
    missed = sum(1 for slot in range(first, last) if per_slot[slot] == 0)
    return double, missed


def simulate(args) -> dict:
    sim = Simulation(args)
    for machine_id in range(1, args.machines + 1):  # a farm already running: heartbeats at random phases
        sim.at(sim.rng.uniform(0, 0.1), sim.join, machine_id, sim.rng.uniform(0.2, 0.2 + args.heartbeat), 60.0)
    first = slot_of(WARMUP, args.period)
    last = first + args.slots
    end = last * args.period
    sim.churn(WARMUP, end, args.churn, args.machines + 1)
    sim.run(WARMUP)
    statements_before, rows_before = Counter(sim.db.statements), sim.db.rows_returned
    roster_before, main_before, version_before = sim.db.roster_rows, sim.db.roster_rows_main, sim.db.version
    sim.run(end)
    double, missed = judge(sim.db.turns, first, last, args.period)
    seconds = end - WARMUP
    return dict(
        double=double,
        missed=missed,
        slots=args.slots,
        refused=sim.db.refused,
        late=sim.db.late,
        seconds=seconds,
        statements={k: (v - statements_before[k]) / seconds for k, v in sim.db.statements.items()},
        rows=(sim.db.rows_returned - rows_before) / seconds,
        roster_rows=(sim.db.roster_rows - roster_before) / seconds,
        roster_rows_main=(sim.db.roster_rows_main - main_before) / seconds,
        changes=(sim.db.version - version_before) / seconds,
        bound_ratio=sim.bound_ratio,
        life=dict(sim.life),
        machines=len(sim.machines),
        computed=sim.shared.computed if sim.shared else 0,
        lent=sim.shared.lent if sim.shared else 0,
    )


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machines", type=int, default=1000)
    parser.add_argument("--slots", type=int, default=10_000, help="slots measured after the warm-up")
    parser.add_argument(
        "--period",
        type=float,
        default=0.25,
        help="slot length, seconds (default 0.25: 10,000 slots in 42 minutes of farm time, four to a "
        "heartbeat, so a roster change's moment of disagreement spans four slots, not one)",
    )
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--misses", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.0005, help="median one-way delay, seconds")
    parser.add_argument("--tail", type=float, default=0.01, help="share of statements delayed by the tail")
    parser.add_argument("--tail-cap", type=float, default=0.5, help="longest tail delay, seconds")
    parser.add_argument(
        "--churn", type=int, default=5, help="joins, deaths, pauses and freezes (of each) during the measured slots"
    )
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--per-node",
        action="store_true",
        help="each node computes its own roster, none shared (the same figures, slower: to check the sharing)",
    )
    return parser.parse_args(argv)


def main() -> None:
    args = options()
    started = time.monotonic()
    result = simulate(args)
    print(
        f"{result['machines']} machines ({args.machines} at the start), {args.slots:,} slots of {args.period:g} s, "
        f"heartbeat {args.heartbeat:g} s, dead after {args.misses} misses; one-way latency median "
        f"{args.latency * 1000:g} ms, {args.tail:.0%} with a Pareto tail up to {args.tail_cap:g} s; "
        f"seed {args.seed}; during the slots: {result['life']}"
    )
    print(
        f"double polls {result['double']} (target 0), missed slots {result['missed']} "
        f"({100 * result['missed'] / result['slots']:.2f} %, target <= 1 %), turn inserts refused by the slot key "
        f"{result['refused']}, refused as late for their slot {result['late']}; largest clock error at a turn "
        f"decision {result['bound_ratio']:.2f} of its bound"
    )
    print(
        f"statements per second the farm would make on PostgreSQL: {sum(result['statements'].values()):.1f} "
        f"({sum(result['statements'].values()) / args.machines:.2f} per machine), rows returned by them "
        f"{result['rows']:.1f}/s"
    )
    print(
        f"rows read when the roster version moved: {result['roster_rows']:.1f}/s (the rows changed; every row when a "
        f"node is far behind or a version is on no row); main, every row each time: {result['roster_rows_main']:.1f}/s"
    )
    changes, rows, main_rows = result["changes"], result["roster_rows"], result["roster_rows_main"]
    per_node = changes * result["machines"]
    if changes:
        print(
            f"roster changes {changes:.2f}/s; rows read per change and node {rows / per_node:.2f} (main "
            f"{main_rows / per_node:,.1f}), by the whole farm {rows / changes:,.0f} (main {main_rows / changes:,.0f})"
        )
    for kind, rate in sorted(result["statements"].items(), key=lambda item: -item[1]):
        print(f"  {rate:9.2f}/s  {kind}")
    print(
        f"simulated in {time.monotonic() - started:.0f} s; rosters the node's code computed and shared "
        f"{result['computed']:,}, found computed by a peer {result['lent']:,} times (--per-node: none)"
    )


if __name__ == "__main__":
    main()
