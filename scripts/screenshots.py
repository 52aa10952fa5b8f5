"""Render the README's screenshots of the desktop app in a realistic state, light and dark.

    QT_QPA_PLATFORM=offscreen python scripts/screenshots.py [--out docs/screenshots] [--warmup 45]

A real farm on a throwaway SQLite database: five nodes with skewed clocks and
the app's own node, each serving its own queues, the demo's web server and job
feeder, a few schedules (one paused) and singletons, and named queues (one
limited, one rated with order keys, one paused); after the warm-up one machine
is paused and one crashes (it stops checking in, so it turns dead, and the
queue only it served is left unserved). The queues have six hours of stored
history behind them (a backlog that peaked hours ago), and the farm's event log
what the script and the nodes did. Shot at 1440x900, at 1024x640 (a laptop),
then a bulk retry asked, the Events tab, a read-only operator's window, and
last with MANY machines in the farm.
"""

import argparse
import math
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PySide6.QtCore import QItemSelectionModel, QSettings  # noqa: E402
from PySide6.QtGui import QPainter  # noqa: E402
from PySide6.QtWidgets import QApplication, QWidget  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from queueprocessor import JobFilter, work_spec  # noqa: E402
from queueprocessor.demo import start_web_server  # noqa: E402
from queueprocessor.demo_mix import Feeder  # noqa: E402
from queueprocessor.farm import Farm  # noqa: E402
from queueprocessor.nodeoptions import NodeConfig  # noqa: E402
from queueprocessor.rules.clock import SystemClock  # noqa: E402
from queueprocessor.rules.search import BulkAction  # noqa: E402
from queueprocessor.rules.states import HISTORY_COUNTS, JobState, Outcome, Wish  # noqa: E402
from queueprocessor.store.schema import history  # noqa: E402
from ui.app import make_app  # noqa: E402
from ui.mainwindow import MainWindow  # noqa: E402
from ui.models import ROW_ROLE  # noqa: E402

# name, clock skew, the queues it serves (None: every queue). Only old-box serves gpu: it dies.
PEERS = (
    ("web-01", 0.35, "default,partner-api,emails"),
    ("web-02", -0.8, "default,partner-api,emails"),
    ("batch-01", 1.6, "reports:1,default"),
    ("batch-02", 0.05, "reports,partner-api"),
    ("old-box", -2.4, None),
)
# queue, Farm.set_queue's settings; emails is paused as well.
QUEUES = (("reports", dict(limit=2)), ("partner-api", dict(rate="3/s", on_failure="block")), ("emails", {}))
# queue, demo page, order keys (0: none): what the queue feeder picks from.
QUEUE_WORK = (
    ("reports", "/slow?ms=2500", 0),
    ("partner-api", "/ok", 6),
    ("emails", "/ok", 0),
    ("gpu", "/slow?ms=4000", 0),
)
# name, demo page, how it recurs; the last one is paused.
SCHEDULES = (
    ("cache-warmup", "/ok?job=warmup", dict(every=5.0)),
    ("partner-sync", "/flaky", dict(every=15.0, misfire="all")),
    ("hourly-report", "/slow?ms=1200", dict(cron="0 * * * *", tz="Europe/Paris")),
    ("invoices-close", "/ok?job=invoices", dict(cron="0 9 1 * *", tz="America/New_York")),
    ("nightly-backup", "/slow?ms=2500", dict(cron="30 2 * * *", misfire="skip", grace=600.0)),
)
SINGLETONS = (("feed-poller", "/slow?ms=20000"), ("ledger-compactor", "/slow?ms=30000"))
MANY = 32  # machines in the last shot (the peers above, the app's node, and more nodes started for it)


def scratch_farm(prefix: str) -> str:
    """A scratch folder of its own for a run of shots: the app's settings kept there (not the user's), and the URL
    of a new SQLite farm in it."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(scratch / "settings"))
    return f"sqlite:///{scratch / 'farm.db'}"


def pump(seconds: float, until=lambda: False) -> None:
    """Let the window live for a while (the worker polls, timers tick), or less once `until()` holds."""
    app = QApplication.instance()
    end = time.monotonic() + seconds
    while time.monotonic() < end and not until():
        app.processEvents()
        time.sleep(0.01)


def feed(farm: Farm, stop: threading.Event) -> None:
    """The demo's plain jobs, a few a second: mostly quick, some slow, some flaky."""
    feeder = Feeder(farm)
    while not stop.wait(0.3):
        feeder.plain()


def feed_queues(farm: Farm, stop: threading.Event) -> None:
    """Work for the named queues, a few jobs a second; partner-api's with order keys (one account at a time)."""
    while not stop.wait(0.3):
        queue, page, keys = random.choice(QUEUE_WORK)
        order_key = f"account-{random.randrange(keys)}" if keys else None
        farm.enqueue_http(page, queue=queue, order_key=order_key)


def past(farm: Farm, hours: int = 6) -> None:
    """Store `hours` of each named queue's history, a row a minute as the farm's writer leaves them, up to a few
    minutes ago: a reports backlog that peaked three hours back and drained, steady traffic elsewhere."""
    minute = int(farm._store.ask_time() // 60 * 60)
    rows = []
    for n in range(3, hours * 60):
        peak = math.exp(-(((n - 180) / 35) ** 2))  # the reports backlog, n minutes ago
        wave, jitter = math.sin(n / 45), random.random()
        for queue, waiting, running in (
            ("reports", int(900 * peak * (0.9 + 0.2 * jitter)), 2 if peak > 0.05 else int(jitter * 2.5)),
            ("partner-api", int(9 + 4 * wave + 2 * jitter), int(3.5 + 1.5 * math.sin(n / 20) + jitter)),
            ("emails", int(1.5 + math.sin(n / 70) + jitter), int(jitter * 1.8)),
            ("default", int(5 + 3 * math.sin(n / 30) + 2 * jitter), int(2.5 + math.sin(n / 25) + jitter)),
        ):
            counts = dict.fromkeys(HISTORY_COUNTS, 0) | dict(started=running * 20, succeeded=running * 19)
            counts |= dict(enqueued=running * 20 + (60 if queue == "reports" and 150 < n < 190 else 0))
            rows.append(dict(counts, queue=queue, step=60, at=minute - n * 60, waiting=waiting, running=running))
    with farm._engine.begin() as conn:
        conn.execute(insert(history), [dict(row, last_job=0, p50=0.4, p95=2.5) for row in rows])


def crash(node) -> None:
    """Stop a node's threads without telling the farm, as a power cut would."""
    node._stop.set()
    for thread in node._threads:
        thread.join(5)
    node.runner.stop_all(Outcome.LOST)
    node.runner.stop()


def shoot(window: MainWindow, out: Path, name: str) -> None:
    pump(1.0)
    path = out / f"{name}.png"
    window.grab().save(str(path))
    print(f"wrote {path}")


def shoot_over(window: MainWindow, box: QWidget, out: Path, name: str) -> None:
    """The window with a dialog over it, as the operator sees them (each is grabbed on its own offscreen)."""
    pump(1.0)
    picture = window.grab()
    over = box.grab()
    painter = QPainter(picture)
    painter.drawPixmap((picture.width() - over.width()) // 2, (picture.height() - over.height()) // 3, over)
    painter.end()
    path = out / f"{name}.png"
    picture.save(str(path))
    print(f"wrote {path}")


def shoot_bulk(window: MainWindow, out: Path) -> None:
    """The failed jobs, several of them selected, and "All matching" asked to retry them: the count confirmed."""
    window.tabs.setCurrentWidget(window.jobs)
    window.jobs.state.setCurrentIndex(window.jobs.state.findData(JobState.FAILED.value))
    model = window.jobs.table.model()
    pump(
        10.0,
        until=lambda: (
            model.rowCount() >= 4
            and all(model.index(row, 0).data(ROW_ROLE)["state"] == JobState.FAILED for row in range(model.rowCount()))
        ),
    )
    selection = window.jobs.table.selectionModel()
    for row in (0, 1, 3):
        flags = QItemSelectionModel.SelectionFlag.Select | QItemSelectionModel.SelectionFlag.Rows
        selection.select(model.index(row, 0), flags)
    window.bulk.ask(BulkAction.RETRY)
    pump(10.0, until=lambda: window.bulk.question is not None)
    shoot_over(window, window.bulk.question, out, "jobs-bulk-light")
    window.bulk.question.reject()
    window.jobs.state.setCurrentIndex(0)


def shoot_reader(url: str, node: NodeConfig, out: Path) -> None:
    """The app opened by an operator who may only read (SQLite opened read-only): every action disabled."""
    reader = MainWindow(f"sqlite:///file:{url.removeprefix('sqlite:///')}?mode=ro&uri=true", node, interval=0.4)
    reader.resize(1440, 900)
    reader.show()
    try:
        pump(10.0, until=lambda: reader.snap is not None and reader.jobs.table.model().rowCount() > 0)
        reader.tabs.setCurrentWidget(reader.jobs)
        reader.jobs.state.setCurrentIndex(reader.jobs.state.findData(JobState.FAILED.value))
        pump(5.0, until=lambda: reader.jobs.table.model().index(0, 1).data() == JobState.FAILED.value)
        reader.jobs.table.selectRow(0)
        pump(2.0)
        shoot(reader, out, "readonly-light")
    finally:
        reader.close()
        pump(1.0, until=lambda: not reader.isVisible())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/screenshots", help="Folder for the PNG files.")
    parser.add_argument("--warmup", type=float, default=45.0, help="Seconds of farm activity before the shots.")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    url = scratch_farm("qp-shots-")

    web = start_web_server()
    base = f"http://127.0.0.1:{web.server_address[1]}/"
    farm = Farm(url, client="queueprocessor ops-laptop")
    past(farm)
    for name, page, when in SCHEDULES:
        farm.schedule(name, work_spec("http", page), **when)
    farm.pause_schedule(SCHEDULES[-1][0])
    for name, page in SINGLETONS:
        farm.singleton(name, work_spec("http", page))
    nodes = {
        name: farm.node(name=name, http_base=base, capacity=3, clock=SystemClock(skew), queues=queues).start()
        for name, skew, queues in PEERS
    }
    for name, settings in QUEUES:  # queues the nodes serve by name: they exist now
        farm.set_queue(name, **settings)
    farm.pause_queue("emails")
    stop = threading.Event()
    for work in (feed, feed_queues):
        threading.Thread(target=work, args=(farm, stop), daemon=True).start()

    make_app([], "light")
    window = MainWindow(
        url,
        NodeConfig().given(name="ops-desk", capacity=4, http_base=base, clock_skew=0.9, queues="default,reports"),
        interval=0.4,
    )
    window.resize(1440, 900)
    window.show()
    try:
        pump(args.warmup)
        farm.steer("batch-02", Wish.PAUSE)
        crash(nodes.pop("old-box"))
        farm.edit_schedule("hourly-report", cron="15 * * * *")
        farm.cancel_jobs(JobFilter(queue="emails", older_than=30.0))  # the paused queue's oldest mail
        pump(6.0)

        window.tabs.setCurrentWidget(window.peers_view)
        shoot(window, out, "peers-light")
        window.tabs.setCurrentWidget(window.jobs)
        retried = [j for j in window.snap.jobs if j["attempts"] > 1 and j["state"] != JobState.RUNNING]
        if retried:
            window.jobs.select(retried[0]["id"])
            pump(1.0)
        shoot(window, out, "jobs-light")
        window.tabs.setCurrentWidget(window.queue)
        shoot(window, out, "queue-light")
        window.tabs.setCurrentWidget(window.schedules)
        window.schedules.select(window.schedules.schedules_view, "partner-sync")
        farm.run_schedule("partner-sync")  # one run now among its regular runs, in the Last runs panel
        pump(3.0)
        shoot(window, out, "schedules-light")
        window.schedules.edit()
        window.schedules.dialog.cron.setText("*/20 * * * *")
        window.schedules.dialog.kind.setCurrentIndex(0)  # the preview follows what is typed
        pump(0.5)
        window.schedules.dialog.grab().save(str(out / "schedule-edit-light.png"))
        print(f"wrote {out / 'schedule-edit-light.png'}")
        window.schedules.dialog.reject()
        window.tabs.setCurrentWidget(window.queues)
        window.queues.table.selectRow(window.queues.model.row_of("reports"))
        shoot(window, out, "queues-light")
        shoot_bulk(window, out)
        window.tabs.setCurrentWidget(window.event_log)
        window.event_log.read()
        shoot(window, out, "events-light")
        shoot_reader(url, NodeConfig().given(name="reader-desk", capacity=1), out)

        window.resize(1024, 640)
        window.tabs.setCurrentWidget(window.peers_view)
        shoot(window, out, "peers-light-1024")
        window.tabs.setCurrentWidget(window.jobs)
        shoot(window, out, "jobs-light-1024")
        window.resize(1440, 900)

        window.set_scheme("dark")
        window.tabs.setCurrentWidget(window.peers_view)
        shoot(window, out, "peers-dark")
        window.tabs.setCurrentWidget(window.jobs)
        shoot(window, out, "jobs-dark")

        window.set_scheme("light")
        more = MANY - len(PEERS) - 1
        nodes.update(
            (
                f"rack-{n:02d}",
                farm.node(name=f"rack-{n:02d}", http_base=base, capacity=2, clock=SystemClock(0.02 * n)).start(),
            )
            for n in range(more)
        )
        pump(args.warmup / 2)
        shoot(window, out, f"jobs-light-{MANY}")
    finally:
        stop.set()
        window.close()
        while window.isVisible():
            pump(0.1)
        for node in nodes.values():
            node.stop(drain=False)
        farm.close()
        web.shutdown()


if __name__ == "__main__":
    main()
