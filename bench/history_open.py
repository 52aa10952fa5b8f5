"""The farm's stored history (docs/design.md §10): what it costs in rows and bytes, and how fast a freshly opened
window charts two weeks of it.

    QT_QPA_PLATFORM=offscreen python bench/history_open.py [--queues 10] [--tries 3]

A PostgreSQL farm database gets `--queues` queues, each with one job waiting and 14 days of history as the writer
and the hourly roll-up leave it: a row a minute for the last day, a row an hour for the 13 days before. The rows
and bytes per queue per day are read off the table (pg_total_relation_size, indexes included), the minutes'
alone and the hours' alone. Then the app's main window, watching that farm, is opened on its Queues tab with the
charts spanning two weeks, and timed from its construction to the first paint that shows every queue's stored
history; the baseline is the same window on the same queues with no history stored, in the same run.
Target: at most 2 s to the first paint with 14 days of history.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fresh_database, load_average, postgres, print_table, query  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from queueprocessor.farm import Farm  # noqa: E402
from queueprocessor.rules.states import HISTORY_COUNTS  # noqa: E402
from queueprocessor.store.schema import history  # noqa: E402
from queueprocessor.store.stats import HOUR, MINUTE  # noqa: E402

DAYS = 14
TWO_WEEKS = DAYS * 86400


def farm_with(server, queues: int, days: int) -> str:
    """A farm database with `queues` queues, one job waiting in each, and `days` days of history per queue."""
    url = fresh_database(server, "history")
    with Farm(url) as farm:
        for q in range(queues):
            farm.enqueue_http("/later", delay=3600, queue=f"q{q}")
        now = farm._store.ask_time()
        minute = int(now // MINUTE * MINUTE)
        rows = []
        for q in range(queues):
            ats = [(MINUTE, minute - n * MINUTE) for n in range(1, 1441)] if days else []
            first_hour = (minute - 1440 * MINUTE) // HOUR * HOUR
            ats += [(HOUR, first_hour - n * HOUR) for n in range(1, 24 * (days - 1) + 1)] if days else []
            for step, at in ats:
                counts = {name: (at // step + q) % 7 for name in HISTORY_COUNTS}
                rows.append(
                    dict(counts, queue=f"q{q}", step=step, at=at, waiting=(at // 600) % 50, running=q % 4)
                    | dict(p50=0.2, p95=1.5, last_job=q)
                )
        with farm._store.engine.begin() as conn:
            for start in range(0, len(rows), 5000):
                conn.execute(insert(history), rows[start : start + 5000])
    return url


def table_bytes(url: str) -> int:
    query(url, "VACUUM ANALYZE qp_history")
    return query(url, "SELECT pg_total_relation_size('qp_history')")[0][0]


def cost(url: str, queues: int) -> list[list]:
    """Rows and bytes per queue per day: of the day kept by the minute, and of a day kept by the hour."""
    whole = table_bytes(url)
    query(url, "DELETE FROM qp_history WHERE step = 60")
    query(url, "VACUUM FULL qp_history")
    hours = table_bytes(url)
    per_hour_day = hours / queues / (DAYS - 1)
    minutes = whole - hours
    return [
        ["a day by the minute (the last day)", 1440, f"{minutes / queues / 1024:.0f} KiB"],
        ["a day by the hour (each older day)", 24, f"{per_hour_day / 1024:.1f} KiB"],
        [f"{DAYS} days, per queue", 1440 + 24 * (DAYS - 1), f"{whole / queues / 1024:.0f} KiB"],
    ]


def first_paint(url: str, queues: int, stored: bool) -> float:
    """Seconds from the window's construction, on the Queues tab spanning two weeks, to the first paint showing
    every queue's chart (and, if `stored`, its stored history, back to its first days)."""
    from PySide6.QtWidgets import QApplication

    from ui.mainwindow import MainWindow

    started = time.perf_counter()
    window = MainWindow(url, None, interval=0.4)
    window.queues.span.setCurrentIndex(window.queues.span.findData(TWO_WEEKS))
    window.tabs.setCurrentWidget(window.queues)
    window.resize(1440, 900)
    window.show()
    charts = window.queues.charts

    def shown() -> bool:
        plotted = [charts.charts[f"q{q}"].plotted() if f"q{q}" in charts.charts else [] for q in range(queues)]
        if not all(plotted):
            return False
        return not stored or all(points[0][0] < time.time() - 12 * 86400 for points in plotted)

    deadline = time.monotonic() + 120
    while not shown():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not shown in 120 s: {window.connection.state}, charts {sorted(charts.charts)}")
        QApplication.instance().processEvents()
        time.sleep(0.001)
    window.repaint()
    took = time.perf_counter() - started
    window.close()
    while window.connection.poller.running:
        QApplication.instance().processEvents()
        time.sleep(0.01)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=10)
    parser.add_argument("--tries", type=int, default=3)
    args = parser.parse_args()
    print(f"history: {args.queues} queues, {DAYS} days; {load_average()}")
    from ui.app import make_app

    make_app([], "light")
    with postgres() as server:
        full, empty = farm_with(server, args.queues, DAYS), farm_with(server, args.queues, 0)
        times = {"14 days of history": [], "no history (baseline)": []}
        for _ in range(args.tries):
            times["no history (baseline)"].append(first_paint(empty, args.queues, stored=False))
            times["14 days of history"].append(first_paint(full, args.queues, stored=True))
        print_table(
            ["window opened on", "first paint, median", "max", "target"],
            [
                [label, f"{statistics.median(t):.2f} s", f"{max(t):.2f} s", "<= 2 s" if "14" in label else "-"]
                for label, t in times.items()
            ],
        )
        print_table(["stored", "rows per queue", "bytes per queue"], cost(full, args.queues))


if __name__ == "__main__":
    main()
