"""The slots timeline: whose turn each slot was (solid, from the turn log) and will be (faint), and the farm's
events (the Events tab's) as marks: in a machine's lane for what happened to it, along the top for the rest.

The x range follows database time ("now" stays near the right edge) until the
user drags or zooms; then it stays where they put it until Follow is turned
back on.
"""

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal

from queueprocessor.rules.events import machine_in
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
        self.events: list[dict] = []  # the events read last (EventsView), marked where they happened
        self.event_marks = pg.ScatterPlotItem(symbol="t", size=11)
        self.event_marks.setZValue(11)
        self.plot.addItem(self.event_marks, ignoreBounds=True)
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
            ("event", scheme.accent, "event"),
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
        self.event_marks.setBrush(pg.mkBrush(scheme.accent))
        self.event_marks.setPen(pg.mkPen(scheme.window, width=1))

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
        self._mark_events()  # the lanes may have moved
        slots, lanes, claimed = plot.turn_slot, plot.turn_lane, plot.turn_claimed
        for item, mask in ((self.turn_bars, ~claimed), (self.claim_bars, claimed)):
            n = int(mask.sum())
            item.setOpts(
                x0=slots[mask] * period, width=np.full(n, width), y0=lanes[mask] - 0.36, height=np.full(n, 0.72)
            )

    def show_events(self, rows: list[dict]) -> None:
        """Mark these events (Farm.events rows) from now on."""
        self.events = rows
        self._mark_events()

    def _mark_y(self, event: dict) -> float:
        """A mark's height: the lane of the machine the event is about, else the top edge."""
        lane = self.lane_index.get(machine_in(event["subject"]))
        return -0.35 if lane is None else float(lane)

    def _mark_events(self) -> None:
        self.event_marks.setData(x=[e["at"] for e in self.events], y=[self._mark_y(e) for e in self.events])

    def plotted_events(self) -> list[tuple[float, float]]:
        """(time, height) of every event mark: what tests compare with the log."""
        x, y = self.event_marks.getData()
        return [(float(a), float(b)) for a, b in zip(x, y)]

    def _event_text(self, x: float, y: float | None) -> str | None:
        """The hover text of the event marks at (x, y), if any (none when the height is not known)."""
        if y is None:
            return None
        left, right = self.view.viewRange()[0]
        near = [e for e in self.events if abs(e["at"] - x) <= (right - left) / 150 and abs(self._mark_y(e) - y) < 0.3]
        lines = [f"{text.clock(e['at'])} {e['kind']} · {e['subject']}: {e['detail'] or ''}".rstrip(": ") for e in near]
        return "\n".join(lines[:5]) or None

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
        if (marked := self._event_text(x, y)) is not None:
            return marked
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
