"""Small multiples for the Queues tab: one little chart per queue, jobs waiting and running over time.

The database keeps no history of a queue's counts, so each snapshot adds one
sample per queue (kept for `history` seconds) and the charts draw those. All
charts show the same stretch of database time, so queues compare at a glance,
but each has its own y scale (a queue of 3 beside one of 3,000 would
otherwise be a flat line). A farm-wide limit is drawn as a dashed line at its
height, so a queue held at its cap reads as such. Like the other plots, they
draw only while on screen.
"""

from collections import deque

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QGridLayout, QLabel, QScrollArea, QVBoxLayout, QWidget

from queueprocessor.rules.queues import QueueInfo
from queueprocessor.rules.states import JobState

from . import theme
from .lanes import header_text
from .queuestate import QueueState
from .samples import keep

CHART_WIDTH = 300  # pixels a chart needs to read well: as many per row as fit the width
CHART_HEIGHT = 96  # pixels of plot under each chart's title
SERIES = (JobState.QUEUED, JobState.RUNNING)  # the job states whose colours draw waiting and running


class QueueChart(QWidget):
    """One queue's chart: its title (name, state, latest counts) over a plot of waiting and running."""

    menu_requested = Signal(str, object)  # queue name, global position

    def __init__(self, name: str, parent=None):
        super().__init__(parent)
        self.name = name
        self.samples: deque[tuple[float, int, int]] = deque()  # (db time, waiting, running)
        box = QVBoxLayout(self)
        box.setContentsMargins(0, 0, 0, 0)
        box.setSpacing(2)
        self.title = QLabel(objectName="plotHeader")
        self.title.setTextFormat(Qt.TextFormat.RichText)
        self.title.setWordWrap(True)  # a narrow chart's legend wraps rather than widen the grid
        box.addWidget(self.title)
        self.plot = pg.PlotWidget()
        self.plot.setFixedHeight(CHART_HEIGHT)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideAxis("bottom")  # every chart spans the same minutes, said once above them
        self.plot.getPlotItem().getAxis("left").setWidth(36)
        self.plot.showGrid(y=True, alpha=0.15)
        self.plot.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.plot.customContextMenuRequested.connect(
            lambda position: self.menu_requested.emit(self.name, self.plot.mapToGlobal(position))
        )
        box.addWidget(self.plot)
        self.lines = {state: self.plot.plot([], []) for state in SERIES}
        self.cap = pg.InfiniteLine(angle=0, movable=False)
        self.cap.hide()
        self.plot.addItem(self.cap)
        self.restyle()

    def add(self, now: float, info: QueueInfo, history: float) -> None:
        keep(self.samples, (now, info.waiting, info.running), history)

    def draw(self, info: QueueInfo, x_range: tuple[float, float]) -> None:
        state = QueueState.of(info)
        running = f"{info.running:,}" if info.limit is None else f"{info.running:,} of {info.limit:,}"
        self.title.setText(
            header_text(
                info.name,
                [
                    ("fill", theme.readable(theme.QUEUE_STATE[state], theme.current().window), state),
                    ("line", theme.JOB_STATE[JobState.QUEUED], f"{info.waiting:,} waiting"),
                    ("line", theme.JOB_STATE[JobState.RUNNING], f"{running} running"),
                ],
            )
        )
        data = np.array(self.samples, dtype=float).reshape(-1, 3)
        self.lines[JobState.QUEUED].setData(data[:, 0], data[:, 1])
        self.lines[JobState.RUNNING].setData(data[:, 0], data[:, 2])
        self.cap.setVisible(info.limit is not None)
        if info.limit is not None:
            self.cap.setValue(info.limit)
        peak = max(float(data[:, 1:].max()) if len(data) else 0.0, float(info.limit or 0))
        self.plot.setXRange(*x_range, padding=0)
        self.plot.setYRange(0, peak * 1.1 + 1, padding=0)

    def plotted(self) -> list[tuple[float, int, int]]:
        """(time, waiting, running) as drawn: what tests compare with the farm."""
        times, waiting = self.lines[JobState.QUEUED].getData()
        _, running = self.lines[JobState.RUNNING].getData()
        if times is None:
            return []
        return [(float(t), int(w), int(r)) for t, w, r in zip(times, waiting, running)]

    def restyle(self) -> None:
        theme.paint_plot(self.plot)
        for state, line in self.lines.items():
            line.setPen(pg.mkPen(theme.JOB_STATE[state], width=2))
        # Seen on a running line at the limit.
        self.cap.setPen(pg.mkPen(theme.current().muted, width=1.5, style=Qt.PenStyle.DashLine))


class QueueCharts(QScrollArea):
    """Every queue's chart in a grid, by name; charts come and go with their queues."""

    menu_requested = Signal(str, object)  # queue name, global position

    def __init__(self, history: float = 600.0, parent=None):
        super().__init__(parent)
        self.history = history
        self.charts: dict[str, QueueChart] = {}
        self.columns = 1
        self.setWidgetResizable(True)
        self.setFrameShape(QScrollArea.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        inner = QWidget()
        self.grid = QGridLayout(inner)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.grid.setHorizontalSpacing(14)
        self.grid.setVerticalSpacing(10)
        self.grid.setAlignment(Qt.AlignmentFlag.AlignTop)
        self.setWidget(inner)

    def add(self, now: float, queues: list[QueueInfo]) -> None:
        """Sample every queue (whether or not the charts are on screen); drop the charts of queues gone."""
        names = sorted(info.name for info in queues)
        if names != sorted(self.charts):
            self._arrange(names)
        for info in queues:
            self.charts[info.name].add(now, info, self.history)

    def draw(self, now: float, queues: list[QueueInfo]) -> float:
        """Draw every chart over the same stretch: the samples there are, `history` seconds at most. Returns
        where that stretch begins (database time)."""
        oldest = min((chart.samples[0][0] for chart in self.charts.values() if chart.samples), default=now)
        since = max(oldest, now - self.history)
        for info in queues:
            self.charts[info.name].draw(info, (since, now))
        return since

    def _arrange(self, names: list[str]) -> None:
        for name in set(self.charts) - set(names):
            chart = self.charts.pop(name)
            self.grid.removeWidget(chart)
            chart.deleteLater()
        for name in names:
            if name not in self.charts:
                chart = self.charts[name] = QueueChart(name)
                chart.menu_requested.connect(self.menu_requested)
        self._place()

    def _place(self) -> None:
        """Lay the charts out by name, `columns` to a row, each column as wide as the others."""
        for chart in self.charts.values():
            self.grid.removeWidget(chart)
        for n, name in enumerate(sorted(self.charts)):
            self.grid.addWidget(self.charts[name], n // self.columns, n % self.columns)
        for column in range(self.grid.columnCount()):
            self.grid.setColumnStretch(column, 1 if column < self.columns else 0)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        columns = max(1, self.viewport().width() // CHART_WIDTH)
        if columns != self.columns:
            self.columns = columns
            self._place()

    def restyle(self) -> None:
        for chart in self.charts.values():
            chart.restyle()
