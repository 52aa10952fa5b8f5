"""The app's graph of a workflow or group: what opening and following it costs, beside every box written in.

    QT_QPA_PLATFORM=offscreen python bench/bench_flowgraph.py [--members 50,1000,10000] [--repeat 5]

For each size, a real group of that many no-op HTTP jobs and a callback is enqueued on a throwaway SQLite farm
(nothing runs them). Timed on its own: the worker's read of a snapshot with the group in it (views.Query.flow_id)
beside the same read without it. Then the graph window (1200x760, offscreen) is given the group, GUI-thread CPU
time: opening it (the graph built and painted whole), a refresh where one member changed state (its box
recoloured, and what Qt then repaints) and a refresh where none did (each with a new snapshot's copy of the
flow). The baseline is the same graph with every box written in (what the app does up to ui.workflowview.WORDS
steps). Medians of `--repeat` runs.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import farm, load_average, print_table  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from queueprocessor.views import Dashboard, FarmTiming, Query  # noqa: E402
from ui import workflowview  # noqa: E402
from ui.app import make_app  # noqa: E402


def cpu_ms(action) -> float:
    """GUI-thread CPU of `action` and the paint it causes, in ms."""
    began = time.thread_time()
    action()
    QApplication.instance().processEvents()
    return (time.thread_time() - began) * 1000


def median_ms(action, repeat: int) -> float:
    return statistics.median(cpu_ms(action) for _ in range(repeat))


def wall_ms(action, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        action()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def graph_costs(flow: dict, repeat: int, words: int) -> tuple[float, float, float]:
    """Open, one state changed, none changed: GUI-thread CPU ms, with boxes written in up to `words` steps."""
    workflowview.WORDS = words
    window = workflowview.FlowWindow()
    window.resize(1200, 760)
    window.show()

    def opened():
        window.open_flow(flow["id"])
        window.graph.restyle()  # built anew each time
        window.show_flow(flow)
        window.graph.viewport().repaint()

    states = ("running", "queued")
    flips = iter(range(10**9))

    def one_changed():
        member = flow["steps"][0]
        member["state"] = states[next(flips) % 2]
        window.show_flow(dict(flow, steps=[dict(s) for s in flow["steps"]]))  # a new snapshot's copy

    def none_changed():
        window.show_flow(dict(flow, steps=[dict(s) for s in flow["steps"]]))

    costs = median_ms(opened, repeat), median_ms(one_changed, repeat), median_ms(none_changed, repeat)
    window.close()
    return costs


def costs_of(farm_, members: int, repeat: int, words: int) -> list[str]:
    """A group of `members` no-op HTTP jobs and a callback enqueued on `farm_`: the worker's read with and without
    it, and the graph's costs, ours beside every box written in."""
    group = farm_.group([farm_.http_spec("/ok") for _ in range(members)], callback=farm_.http_spec("/d", method="POST"))
    dashboard = Dashboard(farm_._store, FarmTiming.of(farm_.settings()))
    read_with = wall_ms(lambda: dashboard.read(Query(flow_id=group)), repeat)
    read_without = wall_ms(lambda: dashboard.read(Query()), repeat)
    flow = dashboard.read(Query(flow_id=group))["flow"]
    ours = graph_costs(flow, repeat, words)
    every = graph_costs(flow, repeat, 10**9)
    return [
        f"{members:,} + callback",
        f"{read_with:.1f} / {read_without:.1f}",
        " / ".join(f"{ms:.1f}" for ms in ours),
        " / ".join(f"{ms:.1f}" for ms in every),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", default="50,1000,10000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    make_app([], "light")
    words = workflowview.WORDS
    rows = []
    for members in (int(n) for n in args.members.split(",")):
        with farm(backend="sqlite") as run:  # nothing runs the jobs: no node
            rows.append(costs_of(run.farm, members, args.repeat, words))
    print(load_average())
    print_table(
        [
            "group",
            "worker's read with / without it, ms",
            "graph: open / one changed / none changed, GUI CPU ms",
            "baseline, every box written in",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
