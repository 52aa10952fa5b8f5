"""A snapshot as the arrays the lane plots draw, made on the worker thread (numpy only, no Qt).

Turning 10,000 run rows into coordinates is the expensive part of a refresh;
doing it beside the database read leaves the GUI thread only `setOpts` calls.
"""

import numpy as np

OUTCOMES = ("running", "succeeded", "failed", "timeout", "lost", "cancelled")
LANE = 0.72  # of a lane's height, for its runs; overlapping runs split it into sub-rows
PACK_GAP = 1 / 300  # of the window: runs closer than this share no sub-row (a short run is drawn wider)

EMPTY = np.zeros(0)


def lane_ids(snapshot: dict) -> list[int]:
    """Machines to draw a lane for: the ones on show, and any that took turns or ran jobs in the window."""
    ids = {m["id"] for m in snapshot["machines"]}
    ids.update(t["machine_id"] for t in snapshot["turns"])
    ids.update(r["machine_id"] for r in snapshot["runs"])
    return sorted(ids)


def prepare(snapshot: dict) -> dict:
    """Add snapshot["plot"]: lane order, and per run / turn / upcoming slot its x and lane as arrays."""
    lanes = lane_ids(snapshot)
    lane = {machine: n for n, machine in enumerate(lanes)}
    runs, turns, now = snapshot["runs"], snapshot["turns"], snapshot["db_now"]
    count = len(runs)
    starts = np.fromiter((r["started_at"] for r in runs), dtype=float, count=count)
    ends = np.fromiter((r["finished_at"] or now for r in runs), dtype=float, count=count)
    code = {outcome: n for n, outcome in enumerate(OUTCOMES)}
    taken = {t["slot"] for t in turns}
    upcoming = [(slot, machine) for slot, machine in snapshot["upcoming"] if slot not in taken]
    lanes_of_runs = np.fromiter((lane[r["machine_id"]] for r in runs), dtype=float, count=count)
    codes = np.fromiter((code.get(r["outcome"], -1) for r in runs), dtype=np.int8, count=count)
    window = snapshot.get("until", now) - snapshot.get("since", now)
    rows, depth = pack(starts, ends + max(window, 1.0) * PACK_GAP, lanes_of_runs)
    row_height = LANE / depth[lanes_of_runs.astype(int)] if count else EMPTY
    tops = lanes_of_runs - LANE / 2 + rows * row_height
    heights = row_height * 0.86  # a gap between sub-rows
    bars = {}
    for n, outcome in enumerate(OUTCOMES):
        mask = codes == n
        bars[outcome] = (starts[mask], ends[mask] - starts[mask], tops[mask], heights[mask])
    snapshot["plot"] = {
        "lanes": lanes,
        "run_start": starts,
        "run_end": ends,
        "run_lane": lanes_of_runs,
        "run_top": tops,
        "run_height": heights,
        "run_bars": bars,  # outcome: (x0, width, y0, height) of its runs
        "turn_slot": np.fromiter((t["slot"] for t in turns), dtype=float, count=len(turns)),
        "turn_lane": np.fromiter((lane[t["machine_id"]] for t in turns), dtype=float, count=len(turns)),
        "turn_claimed": np.fromiter((t["claimed"] > 0 for t in turns), dtype=bool, count=len(turns)),
        "next_slot": np.array([slot for slot, _ in upcoming], dtype=float),
        "next_lane": np.array([lane.get(machine, -1) for _, machine in upcoming], dtype=float),
    }
    return snapshot


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
