"""The queue at a glance: jobs by state now and over time, and finished runs per interval.

Counts by state are sampled from each snapshot (the database keeps no history
of them); throughput comes from the run log, so it is right from the first poll.
"""

from collections import deque

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from queueprocessor.store import JOB_STATES

from . import theme
from .lanes import bars

# Throughput bars, stacked bottom to top.
STACK = ("succeeded", "failed", "timeout", "lost", "cancelled")
LINES = ("queued", "running")


class QueueGraph(QWidget):
    def __init__(self, history: float = 600.0, parent=None):
        super().__init__(parent)
        self.history = history
        self.samples: deque[tuple[float, dict]] = deque()
        self.latest: dict | None = None
        self._peak = 0.0
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        cards = QHBoxLayout()
        self.counts: dict[str, QLabel] = {}
        for state in JOB_STATES:
            card = QFrame(objectName="card")
            box = QVBoxLayout(card)
            box.setContentsMargins(12, 6, 12, 6)
            title = QLabel(state.capitalize(), objectName="cardTitle")
            value = QLabel("–", objectName="bigValue")
            value.setStyleSheet(f"color: {theme.JOB_STATE[state]}")
            box.addWidget(title)
            box.addWidget(value)
            cards.addWidget(card)
            self.counts[state] = value
        layout.addLayout(cards)
        self.states = pg.PlotWidget(axisItems={"bottom": pg.DateAxisItem()})
        self.states.setTitle("Jobs waiting and running")
        self.flow = pg.PlotWidget(axisItems={"bottom": pg.DateAxisItem()})
        self.flow.setTitle("Runs finished per interval, by outcome")
        self.flow.setXLink(self.states)
        for plot in (self.states, self.flow):
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.showGrid(x=True, y=True, alpha=0.15)
            plot.setMouseEnabled(x=True, y=False)
            plot.getPlotItem().getAxis("left").setWidth(48)
            layout.addWidget(plot, 1)
        self.legend = self.states.addLegend(offset=(10, 5), colCount=len(LINES))
        self.lines = {state: self.states.plot([], [], name=state, pen=pg.mkPen(theme.JOB_STATE[state], width=2))
                      for state in LINES}
        self.stack = {outcome: bars(brush=theme.OUTCOME[outcome]) for outcome in STACK}
        self.flow_legend = self.flow.addLegend(offset=(10, 5), colCount=len(STACK))
        for outcome, item in self.stack.items():
            self.flow.addItem(item)
            self.flow_legend.addItem(item, outcome)
        self.restyle()

    def restyle(self) -> None:
        scheme = theme.current()
        for plot in (self.states, self.flow):
            plot.setBackground(scheme.plot_bg)
            for name in ("left", "bottom"):
                axis = plot.getPlotItem().getAxis(name)
                axis.setPen(scheme.border)
                axis.setTextPen(scheme.text)
            title = plot.getPlotItem().titleLabel
            title.setText(title.text, color=scheme.muted)
        for legend in (self.legend, self.flow_legend):
            legend.setLabelTextColor(scheme.text)
            legend.setBrush(pg.mkBrush(scheme.base + "d0"))
            legend.setPen(pg.mkPen(scheme.border))

    def show_snapshot(self, snapshot: dict) -> None:
        """Keep the sample; draw only while on screen (showEvent draws the latest when the tab opens)."""
        now, counts = snapshot["db_now"], snapshot["job_counts"]
        self.samples.append((now, counts))
        while self.samples and self.samples[0][0] < now - self.history:
            self.samples.popleft()
        self.latest = snapshot
        if self.isVisible():
            self._draw(snapshot)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self.latest is not None:
            self._draw(self.latest)

    def _draw(self, snapshot: dict) -> None:
        now, counts = snapshot["db_now"], snapshot["job_counts"]
        for state, label in self.counts.items():
            label.setText(f"{counts.get(state, 0):,}")
        times = np.fromiter((t for t, _ in self.samples), dtype=float, count=len(self.samples))
        for state, line in self.lines.items():
            line.setData(times, np.fromiter((c.get(state, 0) for _, c in self.samples), dtype=float,
                                            count=len(self.samples)))
        self._show_throughput(snapshot["throughput"], snapshot["bucket"])
        # Show the history there is (a farm that started a minute ago fills the width), up to `history`.
        oldest = min([times[0]] + [row["start"] for row in snapshot["throughput"]])
        self.states.setXRange(max(oldest, now - self.history), now + snapshot["bucket"], padding=0.02)
        # Headroom above the data for the legend row.
        peak = max((max(c.get(state, 0) for state in LINES) for _, c in self.samples), default=0)
        self.states.setYRange(0, peak * 1.4 + 1, padding=0)
        self.flow.setYRange(0, self._peak * 1.4 + 1, padding=0)

    def _show_throughput(self, rows: list[dict], bucket: float) -> None:
        starts = sorted({r["start"] for r in rows})
        index = {start: n for n, start in enumerate(starts)}
        table = np.zeros((len(STACK), len(starts)))
        for row in rows:
            if row["outcome"] in STACK:
                table[STACK.index(row["outcome"]), index[row["start"]]] = row["count"]
        base = np.zeros(len(starts))
        x0 = np.array(starts, dtype=float) + bucket * 0.06
        for n, outcome in enumerate(STACK):
            self.stack[outcome].setOpts(x0=x0, width=np.full(len(starts), bucket * 0.88), y0=base.copy(),
                                        height=table[n])
            base += table[n]
        self._peak = float(base.max()) if len(base) else 0.0

    def plotted_throughput(self) -> dict[str, int]:
        """Total finished runs per outcome in the bars: what tests compare with the run log."""
        return {outcome: int(np.sum(item.opts["height"])) for outcome, item in self.stack.items()}
