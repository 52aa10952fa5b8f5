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

    def show_snapshot(self, snapshot: dict, ids: list[int]) -> None:
        self.set_lanes(ids, snapshot["names"])
        runs = self.runs = snapshot["runs"]
        now = snapshot["db_now"]
        count = len(runs)
        starts = np.fromiter((r["started_at"] for r in runs), dtype=float, count=count)
        ends = np.fromiter((r["finished_at"] or now for r in runs), dtype=float, count=count)
        # A run shorter than a few milliseconds would vanish: give every bar a visible minimum.
        ends = np.maximum(ends, starts + 0.04)
        lanes = self.lanes_of([r["machine_id"] for r in runs])
        outcomes = np.array([r["outcome"] for r in runs], dtype=object)
        self._starts, self._ends, self._lanes = starts, ends, lanes
        for outcome, item in self.items.items():
            mask = outcomes == outcome
            n = int(mask.sum())
            item.setOpts(x0=starts[mask], width=ends[mask] - starts[mask], y0=lanes[mask] - 0.32,
                         height=np.full(n, 0.64))

    def plotted_runs(self) -> list[tuple[int, float, str]]:
        """(run lane machine id, start, outcome) of every bar: what tests compare with the run log."""
        shown = []
        for outcome, item in self.items.items():
            shown += [(self.lanes[round(y + 0.32)], float(x), outcome) for x, y in zip(item.opts["x0"], item.opts["y0"])]
        return sorted(shown)

    def describe(self, x: float, machine_id: int) -> str | None:
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
