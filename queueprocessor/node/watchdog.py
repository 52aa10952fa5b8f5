"""The watchdog: the node's qp-watchdog thread, which fences the node off (docs/design.md §3, §4).

It stops our runs before their leases run out when they could not be renewed in time. It has a thread of its own
so that a turn or a check-in stuck on a black-holed connection cannot keep it from stopping them; it sleeps while
the node holds no job, until told through `holding` that jobs started (by qp-turns, or by stop() to let it end).
"""

import logging
import threading
from typing import Protocol

from ..rules.clock import Clock
from ..rules.states import Outcome
from .config import NodeConfig
from .heartbeat import Heartbeat
from .runner import JobRunner
from .tally import Tally

log = logging.getLogger("queueprocessor.node")


class Fenced(Protocol):
    """What the watchdog reads of its node (node.Node): its parts, set once, and its heartbeat's last renewal."""

    config: NodeConfig
    clock: Clock
    tally: Tally
    runner: JobRunner | None
    heartbeat: Heartbeat


class Watchdog:
    """The qp-watchdog thread's work: the node runs `loop` on its thread."""

    def __init__(self, node: Fenced, stop: threading.Event) -> None:
        """`stop`: the node's latch, set once its jobs have stopped (the watchdog fences them until then)."""
        self.node = node
        self.config, self.clock = node.config, node.clock
        self._stop = stop
        self.holding = threading.Event()  # a notice: jobs started, watch them
        self._stall_told = False  # the runner's loop is blocked, and we said so (see _look_at_loop)

    @property
    def _runner(self) -> JobRunner:
        """The node's runner: started before the watchdog's thread."""
        assert self.node.runner is not None
        return self.node.runner

    def loop(self) -> None:
        """Watch while we hold jobs; while we hold none, sleep until the turn thread starts some (or stop())."""
        while not self._stop.is_set():
            if self._runner.count():
                self._stop.wait(self.config.watchdog_every)
                self._fence()
                self._look_at_loop()
                continue
            self.holding.clear()
            if not self._runner.count():  # looked again after clearing: a job started meanwhile is not missed
                self.holding.wait()

    def _fence(self) -> None:
        """Self-fencing: jobs whose leases we could not renew in time are stopped before they run out.
        A run's lease runs from the send time of its claim or of the last renewal that renewed it: a job
        claimed once the database came back is not stopped for the silence before it, and one claimed while a
        renewal was on its way is not credited with that renewal."""
        now = self.clock.monotonic()
        limit = self.config.lease - self.config.fence_margin
        overdue = [key for key, leased_at in self._runner.leases() if now - leased_at > limit]
        stopped = [key for key in overdue if self._runner.stop_job(key, Outcome.LOST)]
        if stopped:
            self.node.tally.fenced()
            log.warning(
                "no contact with the database for %.1f s: stopping %s jobs before their leases run out",
                now - self.node.heartbeat.renewed_at,
                len(stopped),
            )

    def _look_at_loop(self) -> None:
        """Say once per stall when a job blocks the runner's loop for longer than the fence margin, and where: while
        it does, no HTTP call or coroutine of this node can be stopped, by its timeout, an operator or this watchdog
        (commands and threads are stopped from here all the same: docs/design.md §3)."""
        late, where = self._runner.stalled_for()
        if late <= self.config.fence_margin:
            self._stall_told = False
        elif not self._stall_told:
            self._stall_told = True
            log.warning(
                "the runner's event loop has been blocked for %.1f s: an async def job is doing blocking work "
                "(CPU, time.sleep, a blocking call) on it; run that in a thread (asyncio.to_thread). Until it "
                "yields, its node's HTTP calls and coroutines cannot be stopped. The loop is at:\n%s",
                late,
                where,
            )
