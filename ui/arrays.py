"""A snapshot as the arrays the lane plots draw, made on the worker thread (numpy only, no Qt).

Turning 10,000 run rows into coordinates is the expensive part of a refresh;
doing it beside the database read leaves the GUI thread only `setOpts` calls.
"""

import numpy as np

OUTCOMES = ("running", "succeeded", "failed", "timeout", "lost", "cancelled")
MIN_RUN = 0.04  # seconds: a run shorter than this would vanish, so every bar is at least this wide


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
    ends = np.maximum(ends, starts + MIN_RUN)
    lanes_of_runs = np.fromiter((lane[r["machine_id"]] for r in runs), dtype=float, count=count)
    codes = np.fromiter((code.get(r["outcome"], -1) for r in runs), dtype=np.int8, count=count)
    bars = {}
    for n, outcome in enumerate(OUTCOMES):
        mask = codes == n
        bars[outcome] = (starts[mask], ends[mask] - starts[mask], lanes_of_runs[mask])
    snapshot["plot"] = {
        "lanes": lanes,
        "run_start": starts,
        "run_end": ends,
        "run_lane": lanes_of_runs,
        "run_bars": bars,  # outcome: (x0, width, lane) of its runs
        "turn_slot": np.fromiter((t["slot"] for t in turns), dtype=float, count=len(turns)),
        "turn_lane": np.fromiter((lane[t["machine_id"]] for t in turns), dtype=float, count=len(turns)),
        "turn_claimed": np.fromiter((t["claimed"] > 0 for t in turns), dtype=bool, count=len(turns)),
        "next_slot": np.array([slot for slot, _ in upcoming], dtype=float),
        "next_lane": np.array([lane.get(machine, -1) for _, machine in upcoming], dtype=float),
    }
    return snapshot
