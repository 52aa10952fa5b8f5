"""PostgreSQL as a whole: restarted mid-run, and frozen (every server process SIGSTOPped) past the dead timeout."""

import signal
import threading
import time

from common import RUNS, postgres_pids, wait_for
from sqlalchemy.exc import OperationalError

from queueprocessor.farm import Farm

from .judge import tally_of
from .rig import LONG, QUICK, Outcome, Rig, first_after, secs, signal_all, turns_out_of_turn, wait_checked_in


def postgres_restart(server, quick: bool) -> Outcome:
    """PostgreSQL restarted (fast shutdown: every connection cut) while jobs flow."""
    timing = QUICK if quick else LONG
    count = 300 if quick else 2000
    rig = Rig(server, timing)
    try:
        nodes = [rig.start(f"restart-{i}") for i in range(3)]
        ids = rig.wait_roster(nodes)
        rig.farm.enqueue_http("/sleep/0.05", count=count)
        wait_for(lambda: rig.farm._store.jobs.counts()["succeeded"] > count // 4, 60, "work to flow")
        down = time.time()
        server.restart()
        up = time.time()
        checked_in = wait_checked_in(rig, ids, up, 30)
        rig.settle(120)
        resumed = first_after(rig, f"SELECT min(started_at) FROM {RUNS} r WHERE started_at > :t", up)
        alive = all(n.alive() for n in nodes)
    finally:
        rig.close()
    tally = tally_of(rig)
    return Outcome(
        "restart",
        f"PostgreSQL restarted mid-run (3 nodes, {count} jobs)",
        tally,
        recovery=f"down {secs(up - down)}; every node checked in {secs(checked_in)} and the first job started "
        f"{secs(resumed)} after it was back",
        facts={
            "down": up - down,
            "checked_in": checked_in,
            "resumed": resumed,
            "nodes_alive": alive,
            "heartbeat": timing.heartbeat,
        },
    )


class StatusWatcher:
    """Polls Farm.status() as an operator's screen would, noting every live machine it shows as dead."""

    def __init__(self, url: str, ids: list[int]):
        self.farm = Farm(url)
        self.ids = set(ids)
        self.dead_polls: list[tuple[float, int]] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="faults-status", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            try:
                report = self.farm.status()
            except OperationalError:  # the database is frozen or restarting: that is the point
                continue
            self.polls += 1
            for row in report["machines"]:
                if row["id"] in self.ids and row["status"] == "dead":
                    self.dead_polls.append((time.time(), row["id"]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.farm.close()


def postgres_freeze(server, quick: bool) -> Outcome:
    """Every PostgreSQL process SIGSTOPped for twice the dead timeout, then continued."""
    timing = QUICK if quick else LONG
    count = 300 if quick else 2000
    frozen_for = 2 * timing.lease + timing.heartbeat
    rig = Rig(server, timing)
    watcher = None
    try:
        nodes = [rig.start(f"freeze-{i}") for i in range(3)]
        ids = rig.wait_roster(nodes)
        formed = time.time()  # turns before this were taken under a roster still forming (join delays)
        watcher = StatusWatcher(rig.url, ids)
        rig.farm.enqueue_http(f"/sleep/{2 * timing.lease:g}", count=3)  # in flight across the stall
        rig.farm.enqueue_http("/sleep/0.05", count=count)
        wait_for(lambda: rig.farm._store.jobs.counts()["succeeded"] > count // 5, 60, "work to flow")
        before = time.time()
        pids = postgres_pids(server)
        signal_all(pids, signal.SIGSTOP)
        frozen = time.time()
        time.sleep(frozen_for)
        signal_all(reversed(pids), signal.SIGCONT)
        thawed = time.time()
        checked_in = wait_checked_in(rig, ids, thawed, 30)
        rig.settle(120)
        watcher.stop()
        first_turn = first_after(rig, "SELECT min(taken_at) FROM qp_turns WHERE taken_at > :t", thawed)
        resumed = first_after(rig, f"SELECT min(started_at) FROM {RUNS} r WHERE started_at > :t", thawed)
        wrong_turns, turns = turns_out_of_turn(rig, ids, max(formed, before - 5 * timing.period), time.time())
        shown_dead = [(t, m) for t, m in watcher.dead_polls if t >= thawed]
        alive = all(n.alive() for n in nodes)
    finally:
        if watcher is not None:
            watcher.stop()
        rig.close()
    tally = tally_of(rig)
    return Outcome(
        "freeze",
        f"PostgreSQL frozen (SIGSTOP) for {frozen_for:g} s, dead timeout {timing.lease:g} s "
        f"(3 nodes, {count + 3} jobs)",
        tally,
        recovery=f"every node checked in {secs(checked_in)}, first turn {secs(first_turn)}, first job "
        f"{secs(resumed)} after the thaw (heartbeat {timing.heartbeat:g} s)",
        facts={
            "frozen_for": thawed - frozen,
            "checked_in": checked_in,
            "first_turn": first_turn,
            "resumed": resumed,
            "wrong_turns": wrong_turns,
            "turns": turns,
            "nodes_alive": alive,
            "status_dead_polls": len(shown_dead),
            "status_polls": watcher.polls,
            "status_dead_for": (max(t for t, _ in shown_dead) - thawed) if shown_dead else 0.0,
            "heartbeat": timing.heartbeat,
        },
    )
