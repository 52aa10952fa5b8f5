"""The app shows the farm's event log (docs/app.md): the Events tab lists what happened and who did it, newest
first, filtered by kind, and the turn-slot timeline marks each event, in the lane of the machine it is about. A real
farm (SQLite and PostgreSQL), a real node, real Qt widgets offscreen."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from queueprocessor.rules.events import machine_label  # noqa: E402
from tests.app import test_ui_window  # noqa: E402
from tests.support.work import Nodes  # noqa: E402
from ui.models import ROW_ROLE  # noqa: E402

app, open_window = test_ui_window.app, test_ui_window.open_window  # the window tests' fixtures
WAIT = test_ui_window.WAIT


def listed(view) -> list[tuple[str, str]]:
    rows = (view.model.index(n, 0).data(ROW_ROLE) for n in range(view.model.rowCount()))
    return [(row["kind"], row["subject"]) for row in rows]


def shown(view, expected) -> None:
    """For qtbot.waitUntil: on a timeout it reports the last listing seen, not just that it never matched."""
    assert listed(view) == expected


def test_the_events_tab_lists_the_log_and_the_timeline_marks_it(farm, open_window, qtbot):
    nodes = Nodes(farm)
    try:
        worker = nodes("worker")
        farm.enqueue_http("/later", delay=3600, queue="reports")
        farm.pause_queue("reports")
        farm.steer("worker", "pause")
        window = open_window(farm.url)
        view = window.event_log
        window.tabs.setCurrentWidget(view)
        me = machine_label("worker", worker.id)
        expected = [("machine.paused", me), ("machine.asked", me), ("queue.paused", "reports"), ("machine.joined", me)]
        qtbot.waitUntil(lambda: shown(view, expected), timeout=WAIT)
        assert view.model.index(1, 4).data().startswith("queueprocessor"), "who asked: this program, its host, pid"

        timeline = window.timeline
        logged = {e["kind"]: e["at"] for e in farm.events()}
        qtbot.waitUntil(lambda: len(timeline.plotted_events()) == 4, timeout=WAIT)
        lane = float(timeline.lane_index[worker.id])
        assert sorted(timeline.plotted_events()) == sorted(
            [(at, -0.35 if kind.startswith("queue") else lane) for kind, at in logged.items()]
        )
        assert "queue.paused · reports" in timeline._event_text(logged["queue.paused"], -0.35)

        view.kind.setCurrentIndex(view.kind.findData("queue"))
        qtbot.waitUntil(lambda: shown(view, [("queue.paused", "reports")]), timeout=WAIT)
    finally:
        nodes.stop_all()
