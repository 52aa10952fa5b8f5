"""A snapshot as the arrays the lane plots draw, made on the worker thread (numpy only, no Qt).

Turning 10,000 run rows into coordinates is the expensive part of a refresh;
doing it beside the database read leaves the GUI thread only `setOpts` calls.
"""

from dataclasses import dataclass

import numpy as np

from queueprocessor.rules.states import Outcome

# Drawing order, and the legend's: a run still going first.
OUTCOMES = (
    Outcome.RUNNING,
    Outcome.SUCCEEDED,
    Outcome.FAILED,
    Outcome.TIMEOUT,
    Outcome.LOST,
    Outcome.CANCELLED,
    Outcome.SNOOZED,
)
LANE = 0.72  # of a lane's height, for its runs; overlapping runs split it into sub-rows
PACK_GAP = 1 / 300  # of the window: runs closer than this share no sub-row (a short run is drawn wider)

EMPTY = np.zeros(0)


@dataclass(frozen=True)
class LaneArrays:
    """Lane order, and per run / turn / upcoming slot its x and lane, as the lane plots feed them to setOpts."""

    lanes: list[int]  # machine ids, top to bottom
    run_start: np.ndarray
    run_end: np.ndarray
    run_lane: np.ndarray
    run_top: np.ndarray
    run_height: np.ndarray
    run_bars: dict[Outcome, tuple]  # outcome: (x0, width, y0, height) of its runs
    turn_slot: np.ndarray
    turn_lane: np.ndarray
    turn_claimed: np.ndarray
    next_slot: np.ndarray
    next_lane: np.ndarray


def lane_ids(reading: dict) -> list[int]:
    """Machines to draw a lane for: the ones on show, and any that took turns or ran jobs in the window."""
    ids = {m["id"] for m in reading["machines"]}
    ids.update(t["machine_id"] for t in reading["turns"])
    ids.update(r["machine_id"] for r in reading["runs"])
    return sorted(ids)


def prepare(reading: dict) -> LaneArrays:
    """The lane plots' arrays for a dashboard reading (views.Dashboard.read()'s dict)."""
    lanes = lane_ids(reading)
    lane = {machine: n for n, machine in enumerate(lanes)}
    runs, turns, now = reading["runs"], reading["turns"], reading["db_now"]
    count = len(runs)
    starts = np.fromiter((r["started_at"] for r in runs), dtype=float, count=count)
    ends = np.fromiter((r["finished_at"] or now for r in runs), dtype=float, count=count)
    code = {outcome: n for n, outcome in enumerate(OUTCOMES)}
    taken = {t["slot"] for t in turns}
    upcoming = [(slot, machine) for slot, machine in reading["upcoming"] if slot not in taken]
    lanes_of_runs = np.fromiter((lane[r["machine_id"]] for r in runs), dtype=float, count=count)
    codes = np.fromiter((code.get(r["outcome"], -1) for r in runs), dtype=np.int8, count=count)
    window = reading["until"] - reading["since"]
    rows, depth = pack(starts, ends + max(window, 1.0) * PACK_GAP, lanes_of_runs)
    row_height = LANE / depth[lanes_of_runs.astype(int)] if count else EMPTY
    tops = lanes_of_runs - LANE / 2 + rows * row_height
    heights = row_height * 0.86  # a gap between sub-rows
    bars = {}
    for n, outcome in enumerate(OUTCOMES):
        mask = codes == n
        bars[outcome] = (starts[mask], ends[mask] - starts[mask], tops[mask], heights[mask])
    return LaneArrays(
        lanes=lanes,
        run_start=starts,
        run_end=ends,
        run_lane=lanes_of_runs,
        run_top=tops,
        run_height=heights,
        run_bars=bars,
        turn_slot=np.fromiter((t["slot"] for t in turns), dtype=float, count=len(turns)),
        turn_lane=np.fromiter((lane[t["machine_id"]] for t in turns), dtype=float, count=len(turns)),
        turn_claimed=np.fromiter((t["claimed"] > 0 for t in turns), dtype=bool, count=len(turns)),
        next_slot=np.array([slot for slot, _ in upcoming], dtype=float),
        next_lane=np.array([lane.get(machine, -1) for _, machine in upcoming], dtype=float),
    )


def pack(starts: np.ndarray, ends: np.ndarray, lanes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sub-rows for runs that overlap on one machine (it runs several jobs at once), so none hides another.

    Greedy in start order: each run takes the lowest sub-row of its lane that is free by its start. Returns
    each run's sub-row and each lane's number of sub-rows (at least 1).
    """
    rows = [0] * len(starts)
    depth = np.ones(int(lanes.max()) + 1 if len(lanes) else 0)
    free: dict[float, list[float]] = {}  # lane: when each of its sub-rows is free again
    start_of, end_of, lane_of = starts.tolist(), ends.tolist(), lanes.tolist()
    for n in np.lexsort((starts, lanes)).tolist():
        row_ends = free.setdefault(lane_of[n], [])
        start = start_of[n]
        for row, end in enumerate(row_ends):
            if end <= start:
                row_ends[row] = end_of[n]
                break
        else:
            row = len(row_ends)
            row_ends.append(end_of[n])
        rows[n] = row
    for lane, row_ends in free.items():
        depth[int(lane)] = len(row_ends)
    return np.array(rows, dtype=float), depth
