"""A running job's progress in the app: a real node runs a function that reports it, and the jobs table draws it as
a bar (read from the model, and from the pixels the delegate paints offscreen), the details say it, and once the job
has ended the bar is gone while its run keeps what it said."""

import json
import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QSettings, Qt  # noqa: E402
from PySide6.QtGui import QColor  # noqa: E402
from PySide6.QtWidgets import QStyle, QStyleOptionViewItem  # noqa: E402

from queueprocessor.rules.job import JobSpec  # noqa: E402
from queueprocessor.rules.states import JobState, Outcome  # noqa: E402
from tests.support.work import PYJOBS  # noqa: E402
from ui import theme  # noqa: E402
from ui.app import make_app  # noqa: E402
from ui.jobsview import STATE_COLUMN  # noqa: E402
from ui.mainwindow import MainWindow  # noqa: E402
from ui.models import JobsModel  # noqa: E402
from ui.progressbar import ProgressDelegate  # noqa: E402

FAST = dict(period=0.25, heartbeat=0.25, misses=4)
WAIT = 30_000  # ms
SCREENSHOT = os.environ.get("QP_PROGRESS_SCREENSHOT")  # where to keep the window's picture, to look at it


@pytest.fixture
def window(qapp, qtbot, tmp_path):
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "settings"))
    make_app([], "light")
    opened = []

    def open_(url):
        shown = MainWindow(url, None, interval=0.1)
        shown.resize(1440, 900)
        shown.show()
        opened.append(shown)
        return shown

    yield open_
    for shown in opened:
        shown.close()
        qtbot.waitUntil(lambda: not shown.connection.poller.running, timeout=WAIT)


PROGRESS_COLUMN = 9  # JobsModel's "Progress" (hidden until asked for)


def filled_to(view, row: int) -> float:
    """How far the bar in `row`'s state cell is filled, from the pixels painted: the rightmost pixel of the running
    colour along the cell, as a fraction of the bar's width (from the end of the state's dot to the cell's end,
    less the bar's insets)."""
    rect = view.visualRect(view.model().index(row, STATE_COLUMN))
    image = view.viewport().grab().toImage()
    scale = image.width() / view.viewport().width()
    fill = QColor(theme.OUTCOME[Outcome.RUNNING])
    found = [
        x + 1
        for y in range(rect.top() + 5, rect.bottom() - 4)
        for x in range(rect.left(), rect.right())
        if image.pixelColor(int(x * scale), int(y * scale)) == fill
    ]
    if not found:
        return 0.0
    style = view.style()
    option = QStyleOptionViewItem()
    view.initViewItemOption(option)  # as the view hands it to its delegate: the icon's size, the widget
    view.itemDelegateForColumn(STATE_COLUMN).initStyleOption(option, view.model().index(row, STATE_COLUMN))
    option.rect = rect
    text = style.subElementRect(QStyle.SubElement.SE_ItemViewItemText, option, view)
    left, width = text.left() + 1, text.width() - 4
    return (max(found) - left) / width


def test_the_jobs_table_draws_a_running_jobs_progress_as_a_bar(farm, window, qtbot, tmp_path):
    farm.settings(**FAST)
    node = farm.node(name="worker", allow_modules=[PYJOBS]).start()
    try:
        gate = tmp_path / "gate"
        [job_id] = farm.enqueue(JobSpec(executor="python", target=f"{PYJOBS}:halfway", payload=json.dumps(str(gate))))
        shown = window(farm.url)
        shown.tabs.setCurrentWidget(shown.jobs)
        jobs = shown.jobs
        view, model = jobs.table, jobs.model
        assert isinstance(view.itemDelegateForColumn(STATE_COLUMN), ProgressDelegate)
        assert model.headerData(PROGRESS_COLUMN, Qt.Orientation.Horizontal) == "Progress"

        def cell():
            row = model.row_of(job_id)
            return row is not None and model.index(row, PROGRESS_COLUMN).data()

        qtbot.waitUntil(lambda: cell() == "50% half way", timeout=WAIT)
        row = model.row_of(job_id)
        assert model.index(row, STATE_COLUMN).data(Qt.ItemDataRole.ToolTipRole) == "running · 50% half way"
        qtbot.waitUntil(lambda: jobs.select(job_id), timeout=WAIT)
        qtbot.waitUntil(lambda: jobs.details.fields["progress"].text() == "50% half way", timeout=WAIT)
        view.clearSelection()  # the selected row is drawn in the selection's colour: read the bar unselected
        qtbot.wait(50)
        assert filled_to(view, model.row_of(job_id)) == pytest.approx(0.5, abs=0.03)
        if SCREENSHOT:
            shown.grab().save(SCREENSHOT)

        gate.touch()
        qtbot.waitUntil(lambda: model.index(model.row_of(job_id), 1).data() == JobState.SUCCEEDED, timeout=WAIT)
        assert cell() == ""  # an ended job has no bar: its run keeps what it said
        assert filled_to(view, model.row_of(job_id)) == 0.0
        qtbot.waitUntil(lambda: jobs.select(job_id), timeout=WAIT)
        qtbot.waitUntil(lambda: "its last run's" in jobs.details.fields["progress"].text(), timeout=WAIT)
        [run] = jobs.details.attempts.rows
        assert (run["outcome"], run["progress"], run["progress_message"]) == ("succeeded", 0.5, "half way")
    finally:
        node.stop(drain=False)


def test_progress_sorts_running_jobs_by_how_far_they_are_and_others_last(qapp):
    model = JobsModel()
    rows = [
        dict(id=n, state=state, method="GET", target="/t", attempts=1, max_attempts=3, owner=None, created_at=0.0)
        | dict(finished_at=None, last_error=None, queue="default", order_key=None)
        | dict(progress=progress, progress_message=None)
        for n, state, progress in (
            (1, JobState.RUNNING, 0.9),
            (2, JobState.SUCCEEDED, 1.0),
            (3, JobState.RUNNING, None),
            (4, JobState.RUNNING, 0.1),
        )
    ]
    model.set_rows(rows, {"names": {}})
    model.sort(PROGRESS_COLUMN)
    assert [model.rows[n]["id"] for n in range(4)][:2] in ([2, 3], [3, 2])
    assert [model.rows[n]["id"] for n in range(4)][2:] == [4, 1]
    assert [model.index(n, PROGRESS_COLUMN).data() for n in range(4)][2:] == ["10%", "90%"]
