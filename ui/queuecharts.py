"""Small multiples for the Queues tab: one little chart per queue, jobs waiting and running over time.

Two sources make each line: the farm's stored history (a row per queue per minute, per hour past a day: see
docs/design.md §11), read on the worker thread when the window opens and whenever the operator picks another
`span` (an hour to two weeks), and the snapshots, each of which adds one sample per queue (kept for `history`
seconds) after the stored rows. All charts show the same stretch of database time, so queues compare at a glance,
but each has its own y scale (a queue of 3 beside one of 3,000 would
otherwise be a flat line). A farm-wide limit is drawn as a dashed line at its
height, so a queue held at its cap reads as such. Like the other plots, they
draw only while on screen.
"""

import math
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
# What the charts can span: (seconds, label, seconds per stored row read for it), a few hundred points at most.
SPANS = (
    (3600, "1 hour", 60),
    (6 * 3600, "6 hours", 60),
    (86400, "1 day", 300),
    (3 * 86400, "3 days", 900),
    (14 * 86400, "2 weeks", 3600),
)
DEFAULT_SPAN = 6 * 3600
NO_ROWS = np.empty((0, 3))


def stored_points(rows: list[dict]) -> dict[str, np.ndarray]:
    """Farm.stats rows as each queue's (time, waiting, running) points, at the end of each row's bucket, when its
    counts were taken; NaN where a row has none."""
    points: dict[str, list[tuple[float, ...]]] = {}
    for row in rows:
        counts = (row["waiting"], row["running"])
        at = float(row["at"] + row["step"])
        points.setdefault(row["queue"], []).append((at, *(math.nan if n is None else float(n) for n in counts)))
    return {name: np.array(found, dtype=float) for name, found in points.items()}


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
        box.addStretch(1)  # a row taller than the chart (few queues) leaves its room below the plot, not above it
        self.lines = {state: self.plot.plot([], [], connect="finite") for state in SERIES}
        self.cap = pg.InfiniteLine(angle=0, movable=False)
        self.cap.hide()
        self.plot.addItem(self.cap)
        self.restyle()

    def add(self, now: float, info: QueueInfo, history: float) -> None:
        keep(self.samples, (now, info.waiting, info.running), history)

    def draw(self, info: QueueInfo, x_range: tuple[float, float], stored: np.ndarray = NO_ROWS) -> None:
        """Draw the stored points older than the first sample, then the samples."""
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
        if len(stored):
            data = np.concatenate((stored[stored[:, 0] < (data[0, 0] if len(data) else math.inf)], data))
        self.lines[JobState.QUEUED].setData(data[:, 0], data[:, 1])
        self.lines[JobState.RUNNING].setData(data[:, 0], data[:, 2])
        self.cap.setVisible(info.limit is not None)
        if info.limit is not None:
            self.cap.setValue(info.limit)
        peak = max(float(np.nanmax(data[:, 1:], initial=0.0)), float(info.limit or 0))
        self.plot.setXRange(*x_range, padding=0)
        self.plot.setYRange(0, peak * 1.1 + 1, padding=0)

    def plotted(self) -> list[tuple[float, int, int]]:
        """(time, waiting, running) as drawn: what tests compare with the farm."""
        times, waiting = self.lines[JobState.QUEUED].getData()
        _, running = self.lines[JobState.RUNNING].getData()
        if times is None:
            return []
        return [(float(t), _count(w), _count(r)) for t, w, r in zip(times, waiting, running)]

    def restyle(self) -> None:
        theme.paint_plot(self.plot)
        for state, line in self.lines.items():
            line.setPen(pg.mkPen(theme.JOB_STATE[state], width=2))
        # Seen on a running line at the limit.
        self.cap.setPen(pg.mkPen(theme.current().muted, width=1.5, style=Qt.PenStyle.DashLine))


def _count(value: float) -> int | None:
    return None if math.isnan(value) else int(value)


class QueueCharts(QScrollArea):
    """Every queue's chart in a grid, by name; charts come and go with their queues."""

    menu_requested = Signal(str, object)  # queue name, global position

    def __init__(self, history: float = 600.0, parent=None):
        super().__init__(parent)
        self.history = history
        self.span: float = DEFAULT_SPAN  # seconds shown at most
        self.stored: dict[str, np.ndarray] = {}  # each queue's stored points (stored_points)
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

    def load(self, span: float, rows: list[dict]) -> None:
        """Take the stored history read for `span` (Farm.stats rows); drawn from the next snapshot on."""
        self.span, self.stored = span, stored_points(rows)

    @property
    def reach(self) -> float:
        """How far back the charts go at most: the span picked, or without stored history the samples kept."""
        return self.span if self.stored else self.history

    def draw(self, now: float, queues: list[QueueInfo]) -> float:
        """Draw every chart over the same stretch: the stored points and samples there are, `span` seconds at
        most (`history`, without stored points). Returns where that stretch begins (database time)."""
        firsts = [chart.samples[0][0] for chart in self.charts.values() if chart.samples]
        firsts += [float(points[0, 0]) for points in self.stored.values() if len(points)]
        since = max(min(firsts, default=now), now - self.reach)
        for info in queues:
            self.charts[info.name].draw(info, (since, now), self.stored.get(info.name, NO_ROWS))
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
