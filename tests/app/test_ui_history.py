"""The app reads the farm's stored history (docs/app.md): a window opened on a farm with hours and days behind it
charts them at once, and the span picker reaches back from an hour to two weeks. A real farm (SQLite and
PostgreSQL), real Qt widgets offscreen."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from sqlalchemy import insert  # noqa: E402

from queueprocessor.store.schema import history  # noqa: E402
from queueprocessor.store.stats import COUNTS, HOUR, MINUTE  # noqa: E402
from tests.app import test_ui_window  # noqa: E402

app, open_window = test_ui_window.app, test_ui_window.open_window  # the window tests' fixtures
WAIT = test_ui_window.WAIT


def stored(farm, queue: str, step: int, at: int, waiting: int, running: int) -> float:
    """A row of history as the farm's writer leaves it; the time its counts were taken (its bucket's end)."""
    zero = {name: 0 for name in COUNTS}
    values = dict(queue=queue, step=step, at=at, waiting=waiting, running=running, last_job=0)
    farm._store.count(insert(history).values(**(zero | values)))
    return float(at + step)


def test_a_window_opened_charts_the_stored_hours_and_reaches_back_two_weeks(farm, open_window, qtbot):
    now = farm._store.ask_time()
    minute = int(now // MINUTE * MINUTE)
    farm.enqueue_http("/reports/daily", delay=3600, queue="reports")  # the queue exists, one job waiting
    hours_ago = [stored(farm, "reports", MINUTE, minute - n * MINUTE, 40 + n, n % 7) for n in (150, 90, 30)]
    days_ago = stored(farm, "reports", HOUR, int((now - 9 * 86400) // HOUR * HOUR), 700, 5)
    window = open_window(farm.url)
    window.tabs.setCurrentWidget(window.queues)
    chart = lambda: window.queues.charts.charts.get("reports")  # noqa: E731

    def plotted_stored():
        return chart() is not None and [p for p in chart().plotted() if p[0] < now]

    qtbot.waitUntil(lambda: len(plotted_stored() or []) == 3, timeout=WAIT)
    assert plotted_stored() == [(hours_ago[0], 190, 3), (hours_ago[1], 130, 6), (hours_ago[2], 70, 2)]
    assert chart().plotted()[-1][1:] == (1, 0), "then the live samples"
    assert "6 hours" in window.queues.span.currentText()

    window.queues.span.setCurrentIndex(window.queues.span.findText("2 weeks"))
    qtbot.waitUntil(lambda: (plotted_stored() or [(0,)])[0][0] == days_ago, timeout=WAIT)
    assert plotted_stored()[0][1:] == (700, 5), "the hour's peak"
