"""Steering a schedule from the Schedules tab, against a real farm (SQLite and PostgreSQL), the app's own real node
and real Qt widgets offscreen: Run now runs it once however often it is asked within one request, the edit
dialog previews the next five occurrences as the recurrence is typed and saves only what changed, and the last
runs show how late each started."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtWidgets import QDialogButtonBox  # noqa: E402

from queueprocessor.rules.schedules import PREVIEW, Recurrence  # noqa: E402
from tests.app import test_ui_window  # noqa: E402
from tests.app.test_ui_schedules import DESK, NOOP, _names, _rows, _tab  # noqa: E402
from tests.support.work import FAST  # noqa: E402
from ui import text  # noqa: E402
from ui.scheduledialog import occurrence_text  # noqa: E402

app, open_window = test_ui_window.app, test_ui_window.open_window  # the window tests' fixtures
WAIT = test_ui_window.WAIT
NEVER_SOON = "0 3 1 1 *"  # each 1 January at 03:00: no regular occurrence while a test runs


def _selected(farm, open_window, qtbot, name="yearly"):
    """The window on `farm` with the app's own node, its Schedules tab showing `name` selected and read whole."""
    window = open_window(farm.url, DESK)
    view = _tab(window)
    qtbot.waitUntil(lambda: name in _names(view.schedules_model), timeout=WAIT)
    view.select(view.schedules_view, name)
    qtbot.waitUntil(view.act_edit.isEnabled, timeout=WAIT)  # the snapshot holds its row and last runs
    return window, view


def test_run_now_asked_twice_in_one_request_runs_once_and_shows_in_the_last_runs(farm, open_window, qtbot):
    farm.settings(**FAST)
    farm.schedule("yearly", farm.python_spec(NOOP), cron=NEVER_SOON)
    window, view = _selected(farm, open_window, qtbot)
    assert view.runs_model.rowCount() == 0 and view.runs_title.text() == "Last runs of yearly"

    view.act_run_now.trigger()
    view.run_now()  # asked again before the worker answered (a second click, the shortcut): the same request
    assert not view.act_run_now.isEnabled()  # until the farm has answered
    qtbot.waitUntil(lambda: window.last_result is not None, timeout=WAIT)
    assert window.last_result[:2] == ("Run schedule yearly now", True)
    qtbot.waitUntil(view.act_run_now.isEnabled, timeout=WAIT)
    made = [j for j in farm.list_jobs() if (j["key"] or "").startswith("yearly@")]
    assert len(made) == 1 and made[0]["key"].startswith("yearly@run now ")
    assert f"as job {made[0]['id']};" in window.last_result[2]

    qtbot.waitUntil(lambda: [r["outcome"] for r in _rows(view.runs_model)] == ["succeeded"], timeout=WAIT)
    [run] = _rows(view.runs_model)
    assert run["job"] == made[0]["id"] and run["manual"] and run["machine_name"] == "desk"
    cells = [view.runs_model.index(0, column).data() for column in range(view.runs_model.columnCount())]
    assert cells[1] == "run now" and cells[4] == "desk" and cells[6].startswith("+")  # started after it was asked

    view.act_run_now.trigger()  # a new click once answered: a new request, one more run
    qtbot.waitUntil(lambda: len([j for j in farm.list_jobs() if (j["key"] or "").startswith("yearly@")]) == 2)


def test_the_edit_dialog_previews_the_next_five_and_saves_only_what_changed(farm, open_window, qtbot):
    farm.settings(**FAST)
    farm.schedule("yearly", farm.python_spec(NOOP), cron=NEVER_SOON, tz="Europe/Berlin")
    farm.pause_schedule("yearly")
    window, view = _selected(farm, open_window, qtbot)
    view.act_edit.trigger()
    dialog = view.dialog
    qtbot.waitUntil(dialog.isVisible, timeout=WAIT)

    def preview() -> list[str]:
        return dialog.preview.text().splitlines()

    yearly = Recurrence.parse(NEVER_SOON, "Europe/Berlin")
    assert preview() == [occurrence_text(yearly, t) for t in yearly.upcoming(dialog.start)]
    assert all(line.endswith(" · Europe/Berlin 03:00:00") for line in preview())  # its wall time in its zone

    dialog.cron.setText("*/5 * * * *")  # every keystroke previews again
    every5 = Recurrence.parse("*/5 * * * *", "Europe/Berlin")
    assert len(preview()) == PREVIEW and preview() == [
        occurrence_text(every5, t) for t in every5.upcoming(dialog.start)
    ]
    dialog.cron.setText("61 * * * *")
    assert preview()[0].startswith("malformed cron expression '61 * * * *'")
    save = dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok)
    save.click()  # refused: the dialog stays open
    assert dialog.isVisible() and dialog.error.text().startswith("malformed cron expression")

    dialog.kind.setCurrentIndex(dialog.kind.findData("every"))
    dialog.every.setValue(90)
    assert preview() == [text.clock(t, millis=False) for t in Recurrence(every=90.0).upcoming(dialog.start)]
    dialog.payload.setPlainText('{"day": 1}')
    save.click()
    assert dialog.changes == dict(cron=None, tz=None, every=90.0, payload='{"day":1}')
    qtbot.waitUntil(lambda: window.last_result is not None, timeout=WAIT)
    assert window.last_result[:3] == ("Edit schedule yearly", True, "saved; paused")
    row = farm.get_schedule("yearly")
    assert (row["every"], row["cron"], row["tz"], row["payload"], row["paused"]) == (
        90.0,
        None,
        None,
        '{"day":1}',
        True,
    )
    assert (row["target"], row["misfire"], row["grace"]) == (f"{NOOP}", "once", 3600.0)  # untouched


def test_the_edit_dialog_refuses_bad_work_with_the_field_named(farm, open_window, qtbot):
    farm.settings(**FAST)
    farm.schedule("yearly", farm.python_spec(NOOP), cron=NEVER_SOON)
    window, view = _selected(farm, open_window, qtbot)
    view.act_edit.trigger()
    dialog = view.dialog
    dialog.queue.setText("no spaces")
    dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
    assert dialog.isVisible() and dialog.error.text().startswith("“Queue” 'no spaces' is not a queue name")
    dialog.reject()
    assert farm.get_schedule("yearly")["queue"] == "default"
