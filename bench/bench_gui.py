"""The desktop app under a big farm: time to refresh every view, and the app's memory.

    QT_QPA_PLATFORM=offscreen python bench/bench_gui.py [--quick] [--machines 32] [--runs 10000]
                                                         [--profile FILE] [--paint-times]

A PostgreSQL farm database is filled with `--machines` machines, `--runs` runs
(with their jobs) and a turn per slot, all inside the window the app shows.
The worker's read of that window (Dashboard.read) is timed on its own; then
the main window, shown offscreen at 1440x900 on its Job runs tab, is fed that
snapshot over and over (times shifted and new jobs on top each time, so
nothing is cached and the jobs table changes; the last two held, as the
app's worker holds them) and each refresh is timed from
the snapshot's arrival to the window painted: every model and plot updated,
then Qt's pending paint events run (the visible, changed parts drawn). Target: under 16 ms a refresh (one frame at
60 Hz), and the whole app under 250 MB resident.

The naive baseline draws the same runs the way a first attempt would: one
QGraphicsRectItem per run, re-created on every refresh.
"""

import argparse
import cProfile
import gc
import os
import random
import sys
import time
from collections import deque
from contextlib import ExitStack
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import farm as bench_farm  # noqa: E402
from common import load_average, percentile, print_table, rss_mb  # noqa: E402
from sqlalchemy import insert, text  # noqa: E402

from queueprocessor.farm import Farm  # noqa: E402
from queueprocessor.rules.states import JobState  # noqa: E402
from queueprocessor.store.schema import jobs, machines, runs, turns  # noqa: E402
from queueprocessor.views import Dashboard, FarmTiming, Query  # noqa: E402
from ui.arrays import prepare  # noqa: E402
from ui.snapshot import Snapshot  # noqa: E402

OUTCOMES = ("succeeded",) * 16 + ("failed", "timeout", "lost", "cancelled")
SPAN = 600.0  # seconds of database time in view


def fill(farm: Farm, machine_count: int, run_count: int) -> float:
    """Machines, jobs with one run each, and turns, spread over the last SPAN seconds. Returns db now."""
    store = farm._store
    now = store.ask_time()
    start = now - SPAN
    rng = random.Random(7)
    with store.engine.begin() as conn:
        conn.execute(
            insert(machines),
            [
                dict(
                    name=f"node-{n:02d}",
                    host=f"host-{n:02d}",
                    instance=f"bench-{n}",
                    pid=1000 + n,
                    version="bench",
                    state="active",
                    capacity=8,
                    running=0,
                    done_count=rng.randrange(5000),
                    failed_count=rng.randrange(50),
                    joined_at=start - 60,
                    last_seen=now - rng.random(),
                    clock_offset=rng.uniform(-2, 2),
                    rtt=rng.uniform(0.0005, 0.003),
                    error_bound=rng.uniform(0.0003, 0.002),
                )
                for n in range(machine_count)
            ],
        )
        ids = [row[0] for row in conn.execute(machines.select().with_only_columns(machines.c.id))]
        job_rows, run_rows = [], []
        for n in range(run_count):
            began = start + SPAN * n / run_count
            took = rng.uniform(0.05, 4.0)
            outcome = rng.choice(OUTCOMES)
            job_rows.append(
                dict(
                    id=n + 1,
                    executor="http",
                    target=f"/work/{n % 97}",
                    method="GET",
                    state=outcome if outcome in ("succeeded", "failed", "cancelled") else "failed",
                    priority=0,
                    run_at=began,
                    created_at=began - 0.2,
                    attempts=1,
                    max_attempts=3,
                    fence=n + 1,
                    started_at=began,
                    finished_at=began + took,
                    cancel_requested=False,
                )
            )
            run_rows.append(
                dict(
                    job_id=n + 1,
                    attempt=1,
                    machine_id=rng.choice(ids),
                    fence=n + 1,
                    started_at=began,
                    finished_at=began + took,
                    outcome=outcome,
                    error=None if outcome == "succeeded" else "HTTP 500",
                )
            )
        conn.execute(insert(jobs), job_rows)
        conn.execute(insert(runs), run_rows)
        first = int(start)
        conn.execute(
            insert(turns),
            [
                dict(slot=slot, machine_id=ids[slot % len(ids)], taken_at=slot + 0.01, claimed=slot % 3, backlog=False)
                for slot in range(first, int(now))
            ],
        )
    return now


def shifted(reading: dict, seconds: float, new_jobs: int) -> Snapshot:
    """The same farm `seconds` later with `new_jobs` more jobs on top of the list: new objects everywhere,
    as a fresh read gives, and the jobs table's rows change, as they do on a busy farm."""
    move = ("started_at", "finished_at")
    copy = dict(
        reading, db_now=reading["db_now"] + seconds, since=reading["since"] + seconds, until=reading["until"] + seconds
    )
    copy["runs"] = [dict(r, **{k: r[k] + seconds for k in move if r[k] is not None}) for r in reading["runs"]]
    copy["turns"] = [dict(t, taken_at=t["taken_at"] + seconds) for t in reading["turns"]]
    copy["machines"] = [dict(m, last_seen=m["last_seen"] + seconds) for m in reading["machines"]]
    top = reading["jobs"][0]
    fresh = [dict(top, id=top["id"] + n, state=JobState.QUEUED) for n in range(new_jobs, 0, -1)]
    copy["jobs"] = fresh + [dict(j) for j in reading["jobs"][: len(reading["jobs"]) - new_jobs]]
    return Snapshot.of(copy, node=None, read_ms=0.0, mono=time.monotonic())


def live_pauses(app, window, seconds: float) -> None:
    """The window with its own worker polling the farm every 0.4 s, for `seconds` as started, then for
    `seconds` settled (ui.app.settle, which the app runs once its window is up): the garbage collector's full
    passes (the CPU time of each, on whichever thread triggers it, holding the interpreter lock) and the GUI
    thread's longest waits between two 5 ms timer ticks."""
    import threading

    from PySide6.QtCore import QTimer

    from ui.app import settle

    window.connection.poller.interval = 0.4
    window.connection.refresh()
    rows = []
    for phase in ("as started", "settled"):
        if phase == "settled":
            settle()
        passes: list[tuple[str, float]] = []
        started = {}

        def watch(stage, info):
            if info["generation"] == 2:
                if stage == "start":
                    started["cpu"] = time.thread_time()
                else:
                    passes.append((threading.current_thread().name, time.thread_time() - started["cpu"]))

        gaps, last, polls = [], [time.perf_counter()], []

        def beat():
            now = time.perf_counter()
            gaps.append(now - last[0])
            last[0] = now

        timer = QTimer()
        timer.timeout.connect(beat)
        window.connection.snapshot.connect(polls.append)
        gc.callbacks.append(watch)
        timer.start(5)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()
            time.sleep(0.002)
        timer.stop()
        gc.callbacks.remove(watch)
        window.connection.snapshot.disconnect(polls.append)
        cpu = [took for _, took in passes]
        on_worker = sum(name != threading.main_thread().name for name, _ in passes)
        rows.append(
            [
                phase,
                str(len(polls)),
                f"{len(passes)} ({on_worker} on the worker)",
                f"{percentile(cpu, 50) * 1000:.1f} / {max(cpu, default=float('nan')) * 1000:.1f}",
                f"{percentile(gaps, 99) * 1000:.0f} / {max(gaps) * 1000:.0f}",
            ]
        )
        polls.clear()
    print(f"the window's own worker polling every 0.4 s, {seconds:g} s each way")
    print_table(
        [
            "objects made at startup",
            "polls",
            "full GC passes",
            "CPU ms a pass, median / max",
            "GUI waits ms, p99 / max",
        ],
        rows,
    )


def search_times(farm: Farm, extra: int, repeats: int) -> None:
    """The worker's jobs list with `extra` more finished jobs (one in ten with an error): the newest 500 as
    the table shows them unfiltered, and the text search (find_jobs), which scans the table when little
    matches."""
    with farm._store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO qp_jobs (id, executor, target, method, kind, state, priority, run_at, created_at,"
                " attempts, max_attempts, fence, cancel_requested, last_error)"
                " SELECT (SELECT max(id) FROM qp_jobs) + g, 'http', '/archive/' || (g % 97), 'GET', 'job', 'succeeded',"
                " 0, 0, 0, 1, 3, 1, false, CASE WHEN g % 10 = 0 THEN 'HTTP 502 from upstream' END"
                " FROM generate_series(1, :n) g"
            ),
            {"n": extra},
        )
        conn.execute(text("ANALYZE qp_jobs"))
    cases = [
        ("newest 500 jobs, no filter (store.list_jobs)", lambda: farm._store.jobs.newest(None, 500)),
        ("text search, 500 of many matches ('upstream')", lambda: farm._store.views.find_jobs("upstream")),
        ("text search, nothing matches (a full scan)", lambda: farm._store.views.find_jobs("no such text")),
    ]
    rows = []
    for label, read in cases:
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            read()
            times.append(time.perf_counter() - began)
        rows.append([label, f"{percentile(times, 50) * 1000:.1f}", f"{percentile(times, 95) * 1000:.1f}"])
    print(f"worker: the jobs list among {sum(farm._store.jobs.counts().values()):,} jobs")
    print_table(["what", "median ms", "p95 ms"], rows)


def paint_timer():
    """The application, made to add up each widget's paint events while `.on` (call before make_app)."""
    from PySide6.QtCore import QEvent
    from PySide6.QtWidgets import QApplication

    class PaintTimer(QApplication):
        def __init__(self):
            super().__init__([])
            self.on = False
            self.totals: dict[str, float] = {}

        def notify(self, receiver, event):
            if not self.on or event.type() != QEvent.Type.Paint:
                return super().notify(receiver, event)
            began = time.thread_time()
            try:
                return super().notify(receiver, event)
            finally:
                name = self.name(receiver)
                self.totals[name] = self.totals.get(name, 0.0) + time.thread_time() - began

        @staticmethod
        def name(widget) -> str:
            """The app's own widget it belongs to, then the Qt widget (a scroll area's viewport by its view)."""
            what = type(widget).__name__
            if widget.objectName() == "qt_scrollarea_viewport":
                what = f"{type(widget.parent()).__name__} viewport"
            owner = widget.parent()
            while owner is not None and not type(owner).__module__.startswith("ui."):
                owner = owner.parent()
            return f"{type(owner).__name__ if owner is not None else ''} {what}".strip()

    return PaintTimer()


def naive_gantt(plot, snapshot: Snapshot, items: list):
    """The baseline: throw the old bars away and add one rectangle item per run."""
    from PySide6.QtGui import QBrush, QColor, QPen
    from PySide6.QtWidgets import QGraphicsRectItem

    for item in items:
        plot.removeItem(item)
    items.clear()
    lanes = {m["id"]: n for n, m in enumerate(snapshot.machines)}
    brush, pen = QBrush(QColor("#22a05b")), QPen()
    for run in snapshot.runs:
        rect = QGraphicsRectItem(
            run["started_at"],
            lanes[run["machine_id"]] - 0.3,
            (run["finished_at"] or snapshot.db_now) - run["started_at"],
            0.6,
        )
        rect.setBrush(brush)
        rect.setPen(pen)
        plot.addItem(rect)
        items.append(rect)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=32)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--refreshes", type=int, default=60)
    parser.add_argument("--quick", action="store_true", help="A short run (fewer refreshes).")
    parser.add_argument("--profile", metavar="FILE", help="Also profile the timed refreshes (cProfile) into FILE.")
    parser.add_argument(
        "--live",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="Then let the window's own worker poll for SECONDS, before and after settling (0: skip).",
    )
    parser.add_argument(
        "--search-jobs",
        type=int,
        default=500_000,
        metavar="N",
        help="Then add N finished jobs and time the jobs list and its text search (0: skip).",
    )
    parser.add_argument(
        "--paint-times",
        action="store_true",
        help="Also list which widgets' paint events took the refreshes' time (adds overhead).",
    )
    args = parser.parse_args()
    refreshes = 15 if args.quick else args.refreshes
    print(load_average())
    base_rss = rss_mb(os.getpid())

    harness = ExitStack()  # the server, the farm's database and the Farm: closed in the finally below
    try:
        farm = harness.enter_context(bench_farm()).farm
        now = fill(farm, args.machines, args.runs)
        dashboard = Dashboard(farm._store, FarmTiming.of(farm.settings()))
        query = Query(since=now - SPAN, until=now + 5, jobs_limit=500, job_id=args.runs // 2)
        reads, prepares = [], []
        for _ in range(5 if args.quick else 15):
            began = time.perf_counter()
            reading = dashboard.read(query)
            reads.append(time.perf_counter() - began)
            began = time.perf_counter()
            prepare(reading)
            prepares.append(time.perf_counter() - began)
        assert (len(reading["runs"]), len(reading["machines"])) == (args.runs, args.machines), (
            len(reading["runs"]),
            len(reading["machines"]),
        )

        import pyqtgraph as pg
        from PySide6.QtWidgets import QApplication

        from ui.app import make_app
        from ui.mainwindow import MainWindow

        paints = paint_timer() if args.paint_times else None
        app = make_app([], "light")
        window = MainWindow(farm.url, None, interval=3600)  # its own poller stays idle: we feed it
        window.resize(1440, 900)
        window.show()
        window.tabs.setCurrentWidget(window.jobs)
        window.timeline.set_follow(False)
        app.processEvents()
        window.jobs.gantt.view.setXRange(reading["since"], reading["until"], padding=0)

        def snaps(count):
            """Fresh snapshots one at a time, made off the clock as the worker thread makes them. Like the
            worker (Poller.send), hold the last two sent, so an old one is freed here, not in a refresh."""
            sent = deque(maxlen=2)
            for n in range(count):
                sent.append(shifted(reading, 0.001 * n, n + 1))
                yield sent[-1]

        def refresh(snap):
            """What the GUI thread does when a snapshot arrives: update every view, then let Qt paint
            what changed (the pending paint events), as its event loop would."""
            window.show_snapshot(snap)
            app.processEvents()

        for snap in snaps(3):  # warm-up: first layout, font caches
            refresh(snap)
        ours = []
        cpu = []  # the GUI thread's own CPU time: what other processes on the cores cannot inflate
        profiler = cProfile.Profile() if args.profile else None
        for snap in snaps(refreshes):
            began, began_cpu = time.perf_counter(), time.thread_time()
            if profiler:
                profiler.enable()
            if paints is not None:
                paints.on = True
            refresh(snap)
            if paints is not None:
                paints.on = False
            if profiler:
                profiler.disable()
            ours.append(time.perf_counter() - began)
            cpu.append(time.thread_time() - began_cpu)
        if profiler:
            profiler.dump_stats(args.profile)
        gc.collect()
        app_rss = rss_mb(os.getpid())

        plot = pg.PlotWidget()
        plot.resize(1100, 300)
        plot.show()
        plot.setXRange(reading["since"], reading["until"], padding=0)
        plot.setYRange(-1, args.machines)
        items: list = []
        naive = []
        for snap in snaps(max(3, refreshes // 5)):
            began = time.perf_counter()
            naive_gantt(plot, snap, items)
            plot.repaint()
            naive.append(time.perf_counter() - began)
        gantt_only = []
        for snap in snaps(refreshes):
            began = time.perf_counter()
            window.jobs.gantt.show_snapshot(snap)
            window.jobs.gantt.repaint()
            gantt_only.append(time.perf_counter() - began)

        print(
            f"{args.machines} machines, {args.runs:,} runs and {len(reading['turns'])} turns in view, "
            f"{len(reading['jobs'])} jobs listed; {len(ours)} refreshes; window 1440x900 offscreen"
        )
        print_table(
            ["what", "median ms", "p95 ms", "target"],
            [
                [
                    "worker: read one snapshot (PostgreSQL)",
                    f"{percentile(reads, 50) * 1000:.1f}",
                    f"{percentile(reads, 95) * 1000:.1f}",
                    "off the GUI thread",
                ],
                [
                    "worker: snapshot to plot arrays (numpy)",
                    f"{percentile(prepares, 50) * 1000:.1f}",
                    f"{percentile(prepares, 95) * 1000:.1f}",
                    "off the GUI thread",
                ],
                [
                    "GUI: refresh all views + paint",
                    f"{percentile(ours, 50) * 1000:.1f}",
                    f"{percentile(ours, 95) * 1000:.1f}",
                    "< 16",
                ],
                [
                    "GUI: the same, CPU time of the GUI thread",
                    f"{percentile(cpu, 50) * 1000:.1f}",
                    f"{percentile(cpu, 95) * 1000:.1f}",
                    "< 16",
                ],
                [
                    "GUI: runs Gantt alone (setData bars)",
                    f"{percentile(gantt_only, 50) * 1000:.1f}",
                    f"{percentile(gantt_only, 95) * 1000:.1f}",
                    "",
                ],
                [
                    "naive Gantt: one rect item per run",
                    f"{percentile(naive, 50) * 1000:.1f}",
                    f"{percentile(naive, 95) * 1000:.1f}",
                    "baseline",
                ],
            ],
        )
        if paints is not None:
            print_table(
                ["paint events during the refreshes", "ms a refresh"],
                [
                    [name, f"{total / len(ours) * 1000:.2f}"]
                    for name, total in sorted(paints.totals.items(), key=lambda item: -item[1])
                    if total / len(ours) * 1000 >= 0.05
                ],
            )
        print_table(
            ["memory", "MB resident"],
            [
                ["python + imports, before the app", f"{base_rss:.0f}"],
                ["the app after the refreshes (target < 250)", f"{app_rss:.0f}"],
            ],
        )
        print(load_average())
        plot.close()
        items.clear()
        if args.live:
            live_pauses(app, window, args.live)
        window.close()
        while window.isVisible():
            app.processEvents()
            time.sleep(0.01)
        QApplication.instance().processEvents()
        if args.search_jobs:
            search_times(farm, args.search_jobs, 3 if args.quick else 10)
    finally:
        harness.close()


if __name__ == "__main__":
    main()
