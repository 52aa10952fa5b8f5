"""What the slots timeline and the runs Gantt share: one horizontal lane per machine, x in database time.

Plot items are created once; a refresh only feeds them new arrays
(`setOpts`), so a refresh costs the same whatever was shown before. A plot
that is not on screen (its tab is hidden) only keeps the latest snapshot and
draws it when shown, or when asked what it plots.
"""

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Signal
from PySide6.QtGui import QCursor
from PySide6.QtWidgets import QGraphicsItem, QToolTip, QVBoxLayout, QWidget

from . import theme

LANE_AXIS_WIDTH = 110  # both plots reserve the same width for lane names, so their x axes line up
EMPTY = np.zeros(0)


class Bars(pg.BarGraphItem):
    """Same-coloured bars without outlines (the fast drawRects path), bounded by their data alone.

    BarGraphItem pads its bounds by half a pen width worked out in pixels each time Qt asks for them
    (dozens of times a repaint); with no pen there is nothing to pad.
    """

    def pixelPadding(self):
        return 0


def bars(**opts) -> Bars:
    """An empty set of bars."""
    return Bars(x0=EMPTY, width=EMPTY, y0=EMPTY, height=EMPTY, pen=None, **opts)


class LanePlot(QWidget):
    """A pyqtgraph plot with machine lanes top to bottom and a date axis; subclasses fill the lanes."""

    manually_moved = Signal()

    def __init__(self, title: str, parent=None):
        super().__init__(parent)
        self.lanes: list[int] = []
        self.names: dict[int, str] = {}
        self.lane_index: dict[int, int] = {}
        self._pending: dict | None = None
        self.plot = pg.PlotWidget(axisItems={"bottom": pg.DateAxisItem()})
        self.plot.setTitle(title)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.invertY(True)
        self.plot.setMouseEnabled(x=True, y=False)
        self.plot.getPlotItem().getAxis("left").setWidth(LANE_AXIS_WIDTH)
        for name in ("left", "bottom"):
            # Axes are kept as pixmaps: new data repaints the plot area, and the axes next to it (the time
            # axis draws the grid across it) are copied rather than drawn again, label by label.
            self.plot.getPlotItem().getAxis(name).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self.plot.showGrid(x=True, y=False, alpha=0.15)
        self.view = self.plot.getViewBox()
        self.view.disableAutoRange()
        self.view.sigRangeChangedManually.connect(lambda *_: self.manually_moved.emit())
        self.stripes = bars()
        self.stripes.setZValue(-10)
        self.plot.addItem(self.stripes, ignoreBounds=True)
        self.plot.scene().sigMouseMoved.connect(self._hover)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.plot)
        self.restyle()

    def restyle(self) -> None:
        scheme = theme.current()
        self.plot.setBackground(scheme.plot_bg)
        for name in ("left", "bottom"):
            axis = self.plot.getPlotItem().getAxis(name)
            axis.setPen(scheme.border)
            axis.setTextPen(scheme.text)
        self.plot.getPlotItem().titleLabel.setText(self.plot.getPlotItem().titleLabel.text, color=scheme.muted)
        self.stripes.setOpts(brush=scheme.lane_bg)

    def show_snapshot(self, snapshot: dict) -> None:
        """Draw the snapshot if the plot is on screen; otherwise keep it for when it is."""
        self._pending = snapshot
        if self.isVisible():
            self.flush()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.flush()

    def flush(self) -> None:
        """Draw the snapshot that arrived while the plot was hidden, if any."""
        if self._pending is not None:
            snapshot, self._pending = self._pending, None
            self.draw(snapshot)

    def draw(self, snapshot: dict) -> None:
        """Feed the plot items the snapshot's arrays."""
        raise NotImplementedError

    def set_lanes(self, ids: list[int], names: dict[int, str]) -> None:
        """Lay out one lane per machine; only touches the axis when the machines changed."""
        labels = [names.get(i, f"#{i}") for i in ids]
        if ids == self.lanes and labels == [self.names.get(i) for i in ids]:
            return
        self.lanes, self.names = ids, {i: label for i, label in zip(ids, labels)}
        self.lane_index = {machine: n for n, machine in enumerate(ids)}
        self.plot.getPlotItem().getAxis("left").setTicks([[(n, _fit(label)) for n, label in enumerate(labels)], []])
        count = max(1, len(ids))
        self.view.setYRange(-0.5, count - 0.5, padding=0.02)
        # Room for every lane's name (up to a point: with many machines the lanes get thin).
        self.plot.setMinimumHeight(min(280, 70 + 16 * count))
        even = np.arange(0, len(ids), 2, dtype=float)
        # Stripes behind every other lane, from 1970 to 2096 in epoch seconds.
        self.stripes.setOpts(x0=np.zeros(len(even)), width=np.full(len(even), 4e9), y0=even - 0.5,
                             height=np.ones(len(even)))

    def _hover(self, position) -> None:
        if not self.plot.sceneBoundingRect().contains(position) or not self.lanes:
            return
        point: QPointF = self.view.mapSceneToView(position)
        lane = int(round(point.y()))
        tip = self.describe(point.x(), self.lanes[lane]) if 0 <= lane < len(self.lanes) else None
        if tip:
            QToolTip.showText(QCursor.pos(), tip, self.plot)
        else:
            QToolTip.hideText()

    def describe(self, x: float, machine_id: int) -> str | None:
        """Hover text for database time x in a machine's lane (None: nothing there)."""
        self.flush()
        return self.text_at(x, machine_id)

    def text_at(self, x: float, machine_id: int) -> str | None:
        raise NotImplementedError


def _fit(name: str, limit: int = 14) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"
