"""What the slots timeline and the runs Gantt share: one horizontal lane per machine, x in database time.

Plot items are created once; a refresh only feeds them new arrays
(`setOpts`), so a refresh costs the same whatever was shown before. A plot
that is not on screen (its tab is hidden) draws only the latest snapshot, when
shown (OnScreen), or when asked what it plots.
"""

import math
from html import escape

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtGui import QCursor, QFont, QFontMetrics
from PySide6.QtWidgets import QGraphicsItem, QLabel, QToolTip, QVBoxLayout, QWidget

from . import theme
from .onscreen import OnScreen
from .snapshot import Snapshot

LANE_AXIS_WIDTH = 110  # both plots reserve the same width for lane names, so their x axes line up
EMPTY = np.zeros(0)
SMALL_POINTS = 7  # lane names shrink to this when lanes are thinner than a line of normal text
MARKS = {"fill": "■", "outline": "□", "line": "┃", "event": "▼"}  # how a legend entry shows its colour


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


def header(title: str) -> QLabel:
    """The label above a plot that holds its title and legend. It wraps when the plot is narrow: a plot's own
    title would not, and would hold the window at its width; a legend inside the plot would cover data."""
    label = QLabel(objectName="plotHeader")
    label.setWordWrap(True)
    label.setTextFormat(Qt.TextFormat.RichText)
    label.setAccessibleName(title)
    return label


def header_text(title: str, legend: list[tuple[str, str, str]]) -> str:
    """The title, then each (mark, colour, meaning) legend entry, in the current scheme's colours."""
    scheme = theme.current()
    # Entries are joined by ordinary spaces, so the label wraps between them and never inside one.
    entries = " ".join(
        f'<span style="color:{colour}">{MARKS[mark]}</span>&nbsp;{escape(label).replace(" ", "&nbsp;")}&nbsp;&nbsp;'
        for mark, colour, label in legend
    )
    return (
        f'<span style="color:{scheme.text}; font-weight:600">{escape(title)}</span>&nbsp;&nbsp;&nbsp; '
        f'<span style="color:{scheme.muted}">{entries}</span>'
    )


class LanePlot(QWidget):
    """A pyqtgraph plot with machine lanes top to bottom and a date axis; subclasses fill the lanes."""

    manually_moved = Signal()

    def __init__(self, title: str, parent=None):
        super().__init__(parent)
        self.title = title
        self.lanes: list[int] = []
        self.names: dict[int, str] = {}
        self.lane_index: dict[int, int] = {}
        self.own: int | None = None  # this machine's lane (its node runs in this app)
        self._labels: tuple = ()  # what the lane axis shows: (lane names, stride, small font, own lane)
        self.drawing = OnScreen(self, self.draw)
        self.header = header(title)
        self.plot = pg.PlotWidget(axisItems={"bottom": pg.DateAxisItem()})
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
        self.own_band = bars()
        self.own_band.setZValue(-9)
        self.plot.addItem(self.own_band, ignoreBounds=True)
        self.plot.scene().sigMouseMoved.connect(self._hover)
        self.view.sigResized.connect(lambda *_: self._label_lanes())
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.header)
        layout.addWidget(self.plot, 1)
        self.restyle()

    def legend(self) -> list[tuple[str, str, str]]:
        """(mark, colour, what it means) for each legend entry; mark is a key of MARKS."""
        return []

    def legend_labels(self) -> list[str]:
        return [label for _, _, label in self.legend()]

    def restyle(self) -> None:
        scheme = theme.current()
        theme.paint_plot(self.plot)
        self.stripes.setOpts(brush=scheme.lane_bg)
        self.own_band.setOpts(brush=pg.mkBrush(scheme.accent + "30"))
        self.header.setText(header_text(self.title, self.legend()))

    def show_snapshot(self, snapshot: Snapshot) -> None:
        self.drawing.show(snapshot)

    def draw(self, snapshot: Snapshot) -> None:
        """Feed the plot items the snapshot's arrays."""
        raise NotImplementedError

    def set_lanes(self, ids: list[int], names: dict[int, str], own: int | None = None) -> None:
        """Lay out one lane per machine, `own` (this machine's) highlighted; only touches the axis when the
        machines changed."""
        labels = [names.get(i, f"#{i}") for i in ids]
        if ids == self.lanes and labels == [self.names.get(i) for i in ids] and own == self.own:
            return
        self.lanes, self.names, self.own = ids, {i: label for i, label in zip(ids, labels)}, own
        self.lane_index = {machine: n for n, machine in enumerate(ids)}
        count = max(1, len(ids))
        self.view.setYRange(-0.5, count - 0.5, padding=0.02)
        # Room for every lane's name (up to a point: with many machines the lanes get thin and names thin out).
        self.plot.setMinimumHeight(min(200, 40 + 14 * count))
        even = np.arange(0, len(ids), 2, dtype=float)
        # Stripes behind every other lane, from 1970 to 2096 in epoch seconds.
        self.stripes.setOpts(
            x0=np.zeros(len(even)), width=np.full(len(even), 4e9), y0=even - 0.5, height=np.ones(len(even))
        )
        mine = [self.lane_index[own]] if own in self.lane_index else []
        self.own_band.setOpts(
            x0=np.zeros(len(mine)),
            width=np.full(len(mine), 4e9),
            y0=np.array(mine, dtype=float) - 0.5,
            height=np.ones(len(mine)),
        )
        self._label_lanes()

    def _label_lanes(self) -> None:
        """Name every lane if the names fit; when lanes are thinner than a line, a smaller font, then every
        n-th lane's name (and always this machine's, marked ▸)."""
        count = len(self.lanes)
        lane_px = self.view.height() / max(1, count)
        axis = self.plot.getPlotItem().getAxis("left")
        small = lane_px < QFontMetrics(axis.font()).height()
        font = QFont(axis.font())
        if small:
            font.setPointSize(SMALL_POINTS)
        stride = max(1, math.ceil(QFontMetrics(font).height() / max(lane_px, 1e-6))) if count else 1
        own = self.lane_index.get(self.own)
        names = [self.names[i] for i in self.lanes]
        wanted = (tuple(names), stride, small, own)
        if wanted == self._labels:
            return
        self._labels = wanted
        axis.setStyle(tickFont=font if small else None)
        ticks = [
            (n, ("▸ " if n == own else "") + _fit(name))
            for n, name in enumerate(names)
            if n == own or (n % stride == 0 and (own is None or abs(n - own) >= stride))
        ]
        axis.setTicks([ticks, []])

    def shown_lane_names(self) -> list[str]:
        """The lane names the axis shows, top to bottom: what tests check for overlap."""
        ticks = self.plot.getPlotItem().getAxis("left")._tickLevels
        return [label for _, label in ticks[0]] if ticks else []

    def _hover(self, position) -> None:
        if not self.plot.sceneBoundingRect().contains(position) or not self.lanes:
            return
        point: QPointF = self.view.mapSceneToView(position)
        lane = int(round(point.y()))
        tip = self.describe(point.x(), self.lanes[lane], point.y()) if 0 <= lane < len(self.lanes) else None
        if tip:
            QToolTip.showText(QCursor.pos(), tip, self.plot)
        else:
            QToolTip.hideText()

    def describe(self, x: float, machine_id: int, y: float | None = None) -> str | None:
        """Hover text for database time x in a machine's lane, at height y if known (None: nothing there)."""
        self.drawing.flush()
        return self.text_at(x, machine_id, y)

    def text_at(self, x: float, machine_id: int, y: float | None = None) -> str | None:
        raise NotImplementedError


def _fit(name: str, limit: int = 14) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"
