"""The slots timeline: whose turn each slot was (solid, from the turn log) and will be (faint).

The x range follows database time ("now" stays near the right edge) until the
user drags or zooms; then it stays where they put it until Follow is turned
back on.
"""

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal

from queueprocessor.rules.states import Outcome

from . import text, theme
from .lanes import LanePlot, bars
from .snapshot import Snapshot


class SlotsTimeline(LanePlot):
    follow_changed = Signal(bool)

    def __init__(self, parent=None):
        super().__init__("Turns in database time", parent)
        self.period = 1.0
        self.span = 60.0
        self.ahead = 8.0
        self.follow = True
        self.turns: dict[int, dict] = {}
        self.upcoming: dict[int, int] = {}
        self.upcoming_bars = bars()
        self.turn_bars = bars()
        self.claim_bars = bars()
        for item in (self.upcoming_bars, self.turn_bars, self.claim_bars):
            self.plot.addItem(item)
        self.now_line = pg.InfiniteLine(angle=90, movable=False)
        self.now_line.setZValue(10)
        self.plot.addItem(self.now_line, ignoreBounds=True)
        self.manually_moved.connect(lambda: self.set_follow(False))
        self.restyle()

    def legend(self) -> list[tuple[str, str, str]]:
        scheme = theme.current()
        return [
            ("fill", scheme.turn_claimed, "claimed jobs"),
            ("fill", scheme.turn, "found nothing due"),
            ("outline", scheme.muted, "upcoming"),
            ("line", theme.OUTCOME[Outcome.FAILED], "now"),
        ]

    def restyle(self) -> None:
        super().restyle()
        if not hasattr(self, "now_line"):
            return
        scheme = theme.current()
        # Upcoming turns differ from taken ones by their outline, not by a shade (both schemes keep 3:1).
        self.upcoming_bars.setOpts(brush=scheme.faint_slot, pen=pg.mkPen(scheme.muted, width=1))
        self.turn_bars.setOpts(brush=scheme.turn)
        self.claim_bars.setOpts(brush=scheme.turn_claimed)
        self.now_line.setPen(pg.mkPen(theme.OUTCOME[Outcome.FAILED], width=2))

    def set_follow(self, follow: bool) -> None:
        if follow == self.follow:
            return
        self.follow = follow
        if follow:
            left, right = self.view.viewRange()[0]
            self.span = min(3600.0, max(5.0, right - left - self.ahead))
        self.follow_changed.emit(follow)

    def time_window(self) -> tuple[float, float] | None:
        """The database-time window the user is looking at, or None when following now."""
        if self.follow:
            return None
        left, right = self.view.viewRange()[0]
        return left, right

    def draw(self, snapshot: Snapshot) -> None:
        plot = snapshot.plot
        self.period = period = snapshot.period
        self.set_lanes(plot.lanes, snapshot.names, snapshot.own_id)
        self.turns = {t["slot"]: t for t in snapshot.turns}
        self.upcoming = {slot: machine for slot, machine in snapshot.upcoming if slot not in self.turns}
        width = period * 0.92
        slots, lanes = plot.next_slot, plot.next_lane
        self.upcoming_bars.setOpts(
            x0=slots * period, width=np.full(len(slots), width), y0=lanes - 0.3, height=np.full(len(slots), 0.6)
        )
        slots, lanes, claimed = plot.turn_slot, plot.turn_lane, plot.turn_claimed
        for item, mask in ((self.turn_bars, ~claimed), (self.claim_bars, claimed)):
            n = int(mask.sum())
            item.setOpts(
                x0=slots[mask] * period, width=np.full(n, width), y0=lanes[mask] - 0.36, height=np.full(n, 0.72)
            )

    def plotted_turns(self) -> list[tuple[int, int]]:
        """(slot, lane machine id) of every solid bar: what tests compare with the turn log."""
        self.drawing.flush()
        shown = []
        for item in (self.turn_bars, self.claim_bars):
            x0, y0 = item.opts["x0"], item.opts["y0"]
            shown += [(round(x / self.period), self.lanes[round(y + 0.36)]) for x, y in zip(x0, y0)]
        return sorted(shown)

    def tick(self, now: float) -> None:
        """Move the now-line (and the view, when following) to the database's current time."""
        self.now_line.setValue(now)
        if self.follow:
            self.view.setXRange(now - self.span, now + self.ahead, padding=0)

    def text_at(self, x: float, machine_id: int, y: float | None = None) -> str | None:
        slot = math.floor(x / self.period)
        name = self.names.get(machine_id, f"#{machine_id}")
        turn = self.turns.get(slot)
        if turn and turn["machine_id"] == machine_id:
            jobs = "1 job" if turn["claimed"] == 1 else f"{turn['claimed']} jobs"
            extra = " — found a backlog: idle machines claimed directly" if turn["backlog"] else ""
            return f"Slot {slot} · {name}\nturn taken at {text.clock(turn['taken_at'])}\n{jobs} claimed{extra}"
        if self.upcoming.get(slot) == machine_id:
            return f"Slot {slot} · {name}\nupcoming turn at {text.clock(slot * self.period)}"
        return None
