"""The runs Gantt: every run as a bar in its machine's lane, coloured by outcome.

Its x axis is linked to the slots timeline, so both always show the same
stretch of database time. A run still going is drawn up to now. Runs that
overlap on one machine (it runs several jobs at once) sit in sub-rows of its
lane (arrays.pack), and a bar is never narrower than MIN_PIXELS, so a run of
a few milliseconds still shows at any zoom.
"""

import numpy as np

from . import text, theme
from .arrays import OUTCOMES
from .lanes import LanePlot, bars
from .snapshot import Snapshot

MIN_PIXELS = 3


class RunsGantt(LanePlot):
    def __init__(self, parent=None):
        super().__init__("Job runs", parent)
        self.items = {outcome: bars(brush=colour) for outcome, colour in theme.OUTCOME.items()}
        for item in self.items.values():
            self.plot.addItem(item)
        self.runs: list[dict] = []
        self._bars: dict = {}
        self._starts = self._ends = self._lanes = self._tops = self._heights = np.zeros(0)
        self._pixel = 0.0  # seconds a pixel when the bars were last sized
        self.view.sigXRangeChanged.connect(lambda *_: self._rescaled())
        self.view.sigResized.connect(lambda *_: self._rescaled())

    def legend(self) -> list[tuple[str, str, str]]:
        return [("fill", theme.OUTCOME[outcome], outcome) for outcome in OUTCOMES]

    def draw(self, snapshot: Snapshot) -> None:
        plot = snapshot.plot
        self.set_lanes(plot.lanes, snapshot.names, snapshot.own_id)
        self.runs = snapshot.runs
        self._starts, self._ends, self._lanes = plot.run_start, plot.run_end, plot.run_lane
        self._tops, self._heights = plot.run_top, plot.run_height
        self._bars = plot.run_bars
        self._size_bars()

    def pixel(self) -> float:
        """Seconds of database time one pixel of the plot shows (0 before the plot has a size)."""
        width = self.view.width()
        left, right = self.view.viewRange()[0]
        return (right - left) / width if width > 0 else 0.0

    def _rescaled(self) -> None:
        """Widen the shortest bars again when a zoom or resize changed how long a pixel is (not on a scroll)."""
        pixel = self.pixel()
        if self._bars and abs(pixel - self._pixel) > 0.05 * max(pixel, self._pixel):
            self._size_bars()

    def _size_bars(self) -> None:
        self._pixel = pixel = self.pixel()
        least = MIN_PIXELS * pixel
        for outcome, (x0, width, y0, height) in self._bars.items():
            self.items[outcome].setOpts(x0=x0, width=np.maximum(width, least), y0=y0, height=height)

    def plotted_bars(self) -> list[dict]:
        """Every bar as drawn (machine, outcome, x0, width, y0, height): what tests check rows and widths on."""
        self.drawing.flush()
        shown = []
        for outcome, item in self.items.items():
            for x0, width, y0, height in zip(*(item.opts[key] for key in ("x0", "width", "y0", "height"))):
                shown.append(
                    dict(
                        machine=self.lanes[round(y0)],
                        outcome=outcome,
                        x0=float(x0),
                        width=float(width),
                        y0=float(y0),
                        height=float(height),
                    )
                )
        return shown

    def plotted_runs(self) -> list[tuple[int, float, str]]:
        """(run lane machine id, start, outcome) of every bar: what tests compare with the run log."""
        return sorted((bar["machine"], bar["x0"], bar["outcome"]) for bar in self.plotted_bars())

    def text_at(self, x: float, machine_id: int, y: float | None = None) -> str | None:
        lane = self.lane_index.get(machine_id)
        ends = np.maximum(self._ends, self._starts + MIN_PIXELS * self._pixel)
        hits = (self._lanes == lane) & (self._starts <= x) & (ends >= x)
        if y is not None:  # the sub-row under the pointer, if a bar is there
            inside = hits & (self._tops <= y) & (self._tops + self._heights >= y)
            hits = inside if inside.any() else hits
        hits = np.nonzero(hits)[0]
        if not len(hits):
            return None
        run = self.runs[hits[0]]
        took = text.duration((run["finished_at"] or x) - run["started_at"])
        lines = [
            f"Job {run['job_id']} · attempt {run['attempt']} · {self.names.get(machine_id)}",
            f"{run['method']} {run['target']}",
            f"{run['outcome']} · {took} · fence {run['fence']}",
            f"started {text.clock(run['started_at'])}",
        ]
        if run["error"]:
            lines.append(run["error"][:200])
        return "\n".join(lines)
