"""Render the README's top screenshots: the demo as shipped, with its tour beside the window.

    QT_QPA_PLATFORM=offscreen python scripts/demo_screenshots.py [--out docs/screenshots] [--warmup 28]

`queueprocessor demo --headless` runs the demo's farm on a throwaway SQLite file (two of its nodes, the web
target, demo_mix's setup and feeder), and the window opens on it as the demo opens it, with the third node
(demo-3) in it. After the warm-up (the imports have failed, the partner queue's breaker is open) it shoots the
tour over the window, the Queues tab and the Job runs tab.
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from PySide6.QtGui import QPainter  # noqa: E402
from screenshots import pump, shoot  # noqa: E402

from queueprocessor import demo_mix  # noqa: E402
from queueprocessor.nodeoptions import NodeConfig  # noqa: E402
from ui.app import make_app  # noqa: E402
from ui.mainwindow import MainWindow  # noqa: E402


def shoot_tour(window: MainWindow, out: Path) -> None:
    """The window with the tour where the app puts it (Operator.show_tour), each grabbed on its own offscreen."""
    pump(1.0)
    tour = window.operator.tour
    picture, over = window.grab(), tour.grab()
    painter = QPainter(picture)
    painter.drawPixmap(tour.x() - window.x(), tour.y() - window.y(), over)
    painter.end()
    picture.save(str(out / "demo-tour.png"))
    print(f"wrote {out / 'demo-tour.png'}", flush=True)


def a_long_report(window: MainWindow) -> int | None:
    """A running job of the long reports the jobs table shows, to show its progress."""
    shown = window.snap.jobs if window.snap else []
    running = [job for job in shown if job["state"] == "running" and job["target"].endswith(":long_report")]
    return running[0]["id"] if running else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--warmup", type=float, default=28.0)
    args = parser.parse_args()
    url = f"sqlite:///{tempfile.mkdtemp(prefix='qp-demo-shots-')}/demo.db"
    command = [sys.executable, "-m", "queueprocessor.cli", "--db", url, "demo", "--headless", "--nodes", "2"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True) as farm:
        try:
            assert farm.stdout is not None
            base = farm.stdout.readline().split(" jobs from ")[1].split(",")[0]
            make_app([], "light")
            node = NodeConfig().given(name="demo-3", http_base=base, clock_skew=0.25, allow_modules=(demo_mix.MODULE,))
            window = MainWindow(url, node, interval=0.4)
            window.resize(1440, 900)
            window.show()
            pump(args.warmup)
            window.operator.show_tour()
            shoot_tour(window, args.out)
            window.operator.tour.close()
            window.tabs.setCurrentWidget(window.queues)
            shoot(window, args.out, "demo-queues")
            window.tabs.setCurrentWidget(window.jobs)
            report = a_long_report(window)
            if report is not None:
                window.jobs.select(report)
                pump(2.0)
            shoot(window, args.out, "demo-jobs")
            window.close()
            pump(15.0, lambda: not window.isVisible())
        finally:
            os.killpg(farm.pid, signal.SIGTERM)
            farm.wait(30)


if __name__ == "__main__":
    main()
