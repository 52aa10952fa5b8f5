"""The queue at a glance: jobs by state now and over time, and finished runs per interval.

Counts by state are sampled from each snapshot (the database keeps no history
of them); throughput comes from the run log, so it is right from the first poll.
The interval still under way is drawn pale: its bar is not a drop, only not
finished. The x range follows now, like the slots timeline, until the user
drags or zooms (`manually_moved`); `set_follow(True)` brings it back.
"""

from collections import deque

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from queueprocessor.rules.states import JobState, Outcome

from . import theme
from .lanes import bars, header, header_text
from .onscreen import OnScreen
from .samples import keep
from .snapshot import Snapshot

# Throughput bars, stacked bottom to top.
STACK = (Outcome.SUCCEEDED, Outcome.FAILED, Outcome.TIMEOUT, Outcome.LOST, Outcome.CANCELLED, Outcome.SNOOZED)
LINES = (JobState.QUEUED, JobState.RUNNING)


class QueueGraph(QWidget):
    manually_moved = Signal()

    def __init__(self, history: float = 600.0, parent=None):
        super().__init__(parent)
        self.history = history
        self.follow = True
        self.samples: deque[tuple[float, dict]] = deque()
        self.drawing = OnScreen(self, self._draw)
        self._peak = 0.0
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        cards = QHBoxLayout()
        self.counts: dict[str, QLabel] = {}
        for state in JobState:
            card = QFrame(objectName="card")
            box = QVBoxLayout(card)
            box.setContentsMargins(12, 6, 12, 6)
            title = QLabel(state.capitalize(), objectName="cardTitle")
            value = QLabel("–", objectName="bigValue")
            box.addWidget(title)
            box.addWidget(value)
            cards.addWidget(card)
            self.counts[state] = value
        layout.addLayout(cards)
        self.states = pg.PlotWidget(axisItems={"bottom": pg.DateAxisItem()})
        self.flow = pg.PlotWidget(axisItems={"bottom": pg.DateAxisItem()})
        self.flow.setXLink(self.states)
        self.headers = {
            self.states: header("Jobs waiting and running"),
            self.flow: header("Runs finished per interval"),
        }
        for plot, label in self.headers.items():
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.showGrid(x=True, y=True, alpha=0.15)
            plot.setMouseEnabled(x=True, y=False)
            plot.getPlotItem().getAxis("left").setWidth(48)
            plot.getViewBox().sigRangeChangedManually.connect(lambda *_: self._moved())
            layout.addWidget(label)
            layout.addWidget(plot, 1)
        self.lines = {state: self.states.plot([], [], pen=pg.mkPen(theme.JOB_STATE[state], width=2)) for state in LINES}
        self.stack = {outcome: bars(brush=theme.OUTCOME[outcome]) for outcome in STACK}
        self.partial = {outcome: bars(brush=theme.OUTCOME[outcome] + "59") for outcome in STACK}
        for item in (*self.stack.values(), *self.partial.values()):
            self.flow.addItem(item)
        self.restyle()

    def legends(self) -> dict[str, list[tuple[str, str, str]]]:
        """Each plot's legend: (mark, colour, meaning) entries, shown above the plot."""
        return {
            "states": [("line", theme.JOB_STATE[state], state) for state in LINES],
            "flow": [("fill", theme.OUTCOME[outcome], outcome) for outcome in STACK]
            + [("outline", theme.current().muted, "interval so far (pale)")],
        }

    def set_follow(self, follow: bool) -> None:
        """Follow now (the slots timeline's Follow switch), or stay where the user scrolled."""
        self.follow = follow
        if follow:
            self.drawing.redraw()

    def _moved(self) -> None:
        self.follow = False
        self.manually_moved.emit()

    def restyle(self) -> None:
        scheme = theme.current()
        for plot in (self.states, self.flow):
            theme.paint_plot(plot)
        legends = self.legends()
        self.headers[self.states].setText(header_text("Jobs waiting and running", legends["states"]))
        self.headers[self.flow].setText(header_text("Runs finished per interval", legends["flow"]))
        for item in self.partial.values():
            item.setOpts(pen=pg.mkPen(scheme.muted, width=1, style=Qt.PenStyle.DashLine))
        # The numbers are text on the card: each state's colour, darkened or lightened to read (4.5:1).
        for state, label in self.counts.items():
            label.setStyleSheet(f"color: {theme.readable(theme.JOB_STATE[state], scheme.base)}")

    def show_snapshot(self, snapshot: Snapshot) -> None:
        """Keep the sample, hidden or not; draw while on screen."""
        keep(self.samples, (snapshot.db_now, snapshot.job_counts), self.history)
        self.drawing.show(snapshot)

    def _draw(self, snapshot: Snapshot) -> None:
        now, counts = snapshot.db_now, snapshot.job_counts
        for state, label in self.counts.items():
            label.setText(f"{counts.get(state, 0):,}")
        times = np.fromiter((t for t, _ in self.samples), dtype=float, count=len(self.samples))
        for state, line in self.lines.items():
            line.setData(
                times, np.fromiter((c.get(state, 0) for _, c in self.samples), dtype=float, count=len(self.samples))
            )
        self._show_throughput(snapshot.throughput, snapshot.bucket, now)
        if self.follow:
            # Show the history there is (a farm that started a minute ago fills the width), up to `history`.
            oldest = min([times[0]] + [row["start"] for row in snapshot.throughput])
            self.states.setXRange(max(oldest, now - self.history), now + snapshot.bucket, padding=0.02)
        peak = max((max(c.get(state, 0) for state in LINES) for _, c in self.samples), default=0)
        self.states.setYRange(0, peak * 1.08 + 1, padding=0)
        self.flow.setYRange(0, self._peak * 1.08 + 1, padding=0)

    def _show_throughput(self, rows: list[dict], bucket: float, now: float) -> None:
        starts = sorted({r["start"] for r in rows})
        index = {start: n for n, start in enumerate(starts)}
        table = np.zeros((len(STACK), len(starts)))
        for row in rows:
            if row["outcome"] in STACK:
                table[STACK.index(row["outcome"]), index[row["start"]]] = row["count"]
        x0 = np.array(starts, dtype=float) + bucket * 0.06
        done = x0 + bucket * 0.94 <= now  # the interval under way goes to the pale bars
        base = np.zeros(len(starts))
        for n, outcome in enumerate(STACK):
            for items, mask in ((self.stack, done), (self.partial, ~done)):
                items[outcome].setOpts(
                    x0=x0[mask], width=np.full(int(mask.sum()), bucket * 0.88), y0=base[mask], height=table[n][mask]
                )
            base += table[n]
        self._peak = float(base.max()) if len(base) else 0.0

    def plotted_throughput(self) -> dict[str, int]:
        """Total finished runs per outcome in the bars (the pale interval under way too): what tests compare
        with the run log."""
        return {
            outcome: int(np.sum(self.stack[outcome].opts["height"]) + np.sum(self.partial[outcome].opts["height"]))
            for outcome in STACK
        }
