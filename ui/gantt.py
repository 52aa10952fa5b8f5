"""The runs Gantt: every run as a bar in its machine's lane, coloured by outcome.

Its x axis is linked to the slots timeline, so both always show the same
stretch of database time. A run still going is drawn up to now.
"""

import numpy as np

from . import text, theme
from .lanes import LanePlot, bars


class RunsGantt(LanePlot):
    def __init__(self, parent=None):
        super().__init__("Job runs per machine, coloured by outcome", parent)
        self.items = {outcome: bars(brush=colour) for outcome, colour in theme.OUTCOME.items()}
        for item in self.items.values():
            self.plot.addItem(item)
        self.runs: list[dict] = []
        self._starts = self._ends = self._lanes = np.zeros(0)

    def draw(self, snapshot: dict) -> None:
        plot = snapshot["plot"]
        self.set_lanes(plot["lanes"], snapshot["names"])
        self.runs = snapshot["runs"]
        self._starts, self._ends, self._lanes = plot["run_start"], plot["run_end"], plot["run_lane"]
        for outcome, (x0, width, lane) in plot["run_bars"].items():
            self.items[outcome].setOpts(x0=x0, width=width, y0=lane - 0.32, height=np.full(len(x0), 0.64))

    def plotted_runs(self) -> list[tuple[int, float, str]]:
        """(run lane machine id, start, outcome) of every bar: what tests compare with the run log."""
        self.flush()
        shown = []
        for outcome, item in self.items.items():
            bars = zip(item.opts["x0"], item.opts["y0"])
            shown += [(self.lanes[round(y + 0.32)], float(x), outcome) for x, y in bars]
        return sorted(shown)

    def text_at(self, x: float, machine_id: int) -> str | None:
        lane = self.lane_index.get(machine_id)
        hits = np.nonzero((self._lanes == lane) & (self._starts <= x) & (self._ends >= x))[0]
        if not len(hits):
            return None
        run = self.runs[hits[0]]
        took = text.duration((run["finished_at"] or x) - run["started_at"])
        lines = [f"Job {run['job_id']} · attempt {run['attempt']} · {self.names.get(machine_id)}",
                 f"{run['method']} {run['target']}",
                 f"{run['outcome']} · {took} · fence {run['fence']}",
                 f"started {text.clock(run['started_at'])}"]
        if run["error"]:
            lines.append(run["error"][:200])
        return "\n".join(lines)
