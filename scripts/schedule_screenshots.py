"""Render docs/app.md's picture of schedules that never overlap themselves: the Schedules tab with each schedule's
overlap policy, jitter and pause on failure, one paused until tomorrow morning, and the selected one's last runs
(the occurrences it skipped while its long run went on, each saying why) beside its next five runs with jitter.

    QT_QPA_PLATFORM=offscreen python scripts/schedule_screenshots.py [--out docs/screenshots]

A real farm on a throwaway SQLite database: two nodes call the demo's web server, the app only watches, at the
default window size (1440x900).
"""

import argparse
import os
import sys
from datetime import datetime, timedelta
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from screenshots import pump, scratch_farm  # noqa: E402  (scripts/screenshots.py, beside this file)

from queueprocessor.demo import start_web_server  # noqa: E402
from queueprocessor.farm import Farm  # noqa: E402
from ui.app import make_app  # noqa: E402
from ui.mainwindow import MainWindow  # noqa: E402

SELECTED = "inventory-sync"
# name, demo page, Farm.schedule's keywords. inventory-sync runs 7 s every 3 s: most occurrences are skipped.
SCHEDULES = (
    (SELECTED, "/slow?ms=7000", dict(every=3.0, overlap="skip")),
    ("cache-warmup", "/ok?job=warmup", dict(every=5.0, jitter=2.0)),
    ("partner-export", "/flaky", dict(cron="*/15 * * * *", overlap="buffer-one", jitter=120.0, pause_on_failure=3)),
    ("hourly-report", "/slow?ms=1200", dict(cron="0 * * * *", tz="Europe/Paris", overlap="cancel-previous")),
    ("nightly-backup", "/slow?ms=2500", dict(cron="30 2 * * *", misfire="skip", jitter=600.0)),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/screenshots", help="Folder for the PNG files.")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    url = scratch_farm("qp-schedule-shots-")
    web = start_web_server()
    base = f"http://127.0.0.1:{web.server_address[1]}/"
    farm = Farm(url, client="queueprocessor ops-laptop")
    farm.settings(period=0.5, heartbeat=0.5)
    for name, page, keywords in SCHEDULES:
        farm.schedule(name, farm.http_spec(page), **keywords)
    morning = datetime.now().replace(hour=6, minute=0, second=0, microsecond=0) + timedelta(days=1)
    farm.pause_schedule("nightly-backup", until=morning.timestamp())
    nodes = [farm.node(name=f"web-0{n}", http_base=base, capacity=4).start() for n in (1, 2)]
    make_app([], "light")
    window = MainWindow(url, None, interval=0.4)
    window.resize(1440, 900)
    window.show()
    try:
        window.tabs.setCurrentWidget(window.schedules)
        view = window.schedules
        pump(10, lambda: view.select(view.schedules_view, SELECTED))
        pump(40, lambda: view.runs_title.text().endswith(" skipped") and view.runs_model.rowCount() >= 6)
        pump(1.0)
        path = out / "schedules-overlap.png"
        window.grab().save(str(path))
        print(f"wrote {path}")
    finally:
        window.close()
        while window.isVisible():
            pump(0.1)
        for node in nodes:
            node.stop(drain=False)
        farm.close()
        web.shutdown()


if __name__ == "__main__":
    main()
