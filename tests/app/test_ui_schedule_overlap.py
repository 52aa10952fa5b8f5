"""The Schedules tab's overlap policies, jitter, pause on failure and pause until, against a real farm (SQLite and
PostgreSQL), the app's own real node and real Qt widgets offscreen: the columns say each schedule's policy, the
last runs list an occurrence its overlap policy skipped with why, the pane beside them lists the next five starts
with jitter applied, and the edit and pause-until dialogs change what they say."""

import os
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QDateTime  # noqa: E402
from PySide6.QtWidgets import QDialogButtonBox  # noqa: E402

from queueprocessor.rules.output import format_time  # noqa: E402
from queueprocessor.rules.schedules import PREVIEW, Recurrence, upcoming_runs  # noqa: E402
from tests.app import test_ui_window  # noqa: E402
from tests.app.test_ui_schedule_steering import NEVER_SOON, _selected  # noqa: E402
from tests.app.test_ui_schedules import FEED, NOOP, _cells, _names, _rows, _tab  # noqa: E402
from tests.support.work import FAST  # noqa: E402
from ui import text  # noqa: E402
from ui.scheduledialog import occurrence_text  # noqa: E402

app, open_window = test_ui_window.app, test_ui_window.open_window  # the window tests' fixtures
WAIT = test_ui_window.WAIT
HEADERS = ["Schedule", "Recurrence", "Work", "Misfire", "Overlap", "Jitter", "Pauses", "State", "Next", "Last run"]


def _ok(dialog):
    dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()


def test_the_columns_say_each_schedules_overlap_jitter_pause_on_failure_and_pause_end(farm, open_window, qtbot):
    farm.schedule("plain", farm.python_spec(NOOP), cron=NEVER_SOON)
    farm.schedule("careful", farm.python_spec(NOOP), every=3600, overlap="skip", jitter=30, pause_on_failure=3)
    farm.schedule("resting", farm.python_spec(NOOP), every=3600, overlap="cancel-previous")
    until = time.time() + 7200
    farm.pause_schedule("resting", until=until)
    window = open_window(farm.url)
    view = _tab(window)
    qtbot.waitUntil(lambda: _names(view.schedules_model) == ["careful", "plain", "resting"], timeout=WAIT)
    model = view.schedules_model
    assert [column.title for column in model.columns][: len(HEADERS)] == HEADERS
    now = window.snap.db_now

    def policy(name):
        return _cells(model, name)[4:9]

    assert policy("plain")[:4] == ["allow", "–", "–", "active"]
    assert policy("careful")[:4] == ["skip", text.duration(30.0), "after 3", "active"]
    overlap, jitter, pauses, state, upcoming = policy("resting")
    assert (overlap, jitter, pauses, state) == ("cancel-previous", "–", "–", "paused")
    assert upcoming == f"resumes in {text.duration(until - now)}"
    assert model.index(model.row_of("resting"), 8).data(3) == f"{format_time(until)} UTC"  # 3: its tooltip
    row = model.row_of("resting")
    assert "paused until" in model.index(row, 0).data(3)  # 3: the tooltip says the farm resumes it then
    assert "skipped" in model.index(model.row_of("careful"), 4).data(3)  # what skip does


def test_an_occurrence_skipped_while_the_last_run_goes_on_is_listed_with_why(farm, open_window, qtbot):
    """Every second, work that runs until stopped: its first occurrence runs, and each one after it is skipped."""
    farm.settings(**FAST)
    farm.schedule("busy", farm.python_spec(FEED), every=1, overlap="skip")
    window, view = _selected(farm, open_window, qtbot, "busy")

    def skips():
        return [r for r in _rows(view.runs_model) if r["outcome"] == "cancelled"]

    qtbot.waitUntil(lambda: len(skips()) >= 2, timeout=3 * WAIT)
    runs = _rows(view.runs_model)
    [running] = [r for r in runs if r["outcome"] == "running"]
    for skip in skips():
        row = view.runs_model.row_of(skip["run"])
        cells = [view.runs_model.index(row, c).data() for c in range(view.runs_model.columnCount())]
        assert cells[1] == "skipped" and cells[3] == "–" and cells[4] == ""  # no attempt, no machine: it never ran
        assert skip["error"].startswith("skipped") and str(running["job"]) in skip["error"], skip["error"]
        assert cells[8] == skip["error"].split("\n")[0][:120]
    assert view.runs_title.text().startswith("Last runs of busy · ") and view.runs_title.text().endswith(" skipped")
    listed = {r["job"]: r["error"] for r in farm.schedule_runs("busy", limit=100) if r["outcome"] == "cancelled"}
    assert {skip["job"]: skip["error"] for skip in skips()}.items() <= listed.items()  # as the farm lists them
    farm.remove_schedule("busy")


def test_the_next_five_runs_are_shown_with_jitter_applied(farm, open_window, qtbot):
    farm.settings(**FAST)
    farm.schedule("spread", farm.python_spec(NOOP), every=600, jitter=300)
    window, view = _selected(farm, open_window, qtbot, "spread")
    qtbot.waitUntil(lambda: bool(window.snap.schedule_next), timeout=WAIT)
    snap = window.snap
    times = upcoming_runs(farm.get_schedule("spread"), snap.db_now)
    assert list(snap.schedule_next) == times and len(times) == PREVIEW
    nominal = Recurrence(every=600.0).upcoming(snap.db_now - 300, PREVIEW + 1)
    delays = [t - max(o for o in nominal if o <= t) for t in times]
    assert all(0 <= d < 300 for d in delays) and len(set(delays)) > 1  # each its own delay, within the jitter
    lines = view.next_runs.text().splitlines()
    assert lines[:PREVIEW] == [f"{text.clock(t, millis=False)} · in {text.duration(t - snap.db_now)}" for t in times]
    assert lines[PREVIEW] == f"(each up to {text.duration(300.0)} late by its jitter)"

    farm.pause_schedule("spread")  # paused for good: nothing comes
    qtbot.waitUntil(lambda: view.next_runs.text() == "None: paused until resumed", timeout=WAIT)


def test_the_edit_dialog_sets_overlap_jitter_and_pause_on_failure(farm, open_window, qtbot):
    farm.settings(**FAST)
    farm.schedule("yearly", farm.python_spec(NOOP), cron=NEVER_SOON)
    farm.pause_schedule("yearly")
    window, view = _selected(farm, open_window, qtbot)
    view.act_edit.trigger()
    dialog = view.dialog
    qtbot.waitUntil(dialog.isVisible, timeout=WAIT)
    assert (dialog.overlap.currentText(), dialog.jitter.text(), dialog.pause_on_failure.text()) == (
        "allow",
        "none",
        "never",
    )
    yearly = Recurrence.parse(NEVER_SOON)
    assert dialog.preview.text().splitlines() == [occurrence_text(yearly, t) for t in yearly.upcoming(dialog.start)]
    dialog.overlap.setCurrentText("buffer-one")
    dialog.jitter.setValue(45)  # the preview shows the runs with it
    jittered = upcoming_runs(farm.get_schedule("yearly") | dict(jitter=45.0, paused=False), dialog.start)
    assert dialog.preview.text().splitlines() == [occurrence_text(yearly, t) for t in jittered]
    assert jittered != yearly.upcoming(dialog.start)
    dialog.pause_on_failure.setValue(2)
    _ok(dialog)
    assert dialog.changes == dict(overlap="buffer-one", jitter=45.0, pause_on_failure=2)
    qtbot.waitUntil(lambda: window.last_result is not None, timeout=WAIT)
    assert window.last_result[:3] == ("Edit schedule yearly", True, "saved; paused")
    row = farm.get_schedule("yearly")
    assert (row["overlap"], row["jitter"], row["pause_on_failure"], row["cron"]) == ("buffer-one", 45.0, 2, NEVER_SOON)
    qtbot.waitUntil(lambda: _cells(view.schedules_model, "yearly")[4:7] == ["buffer-one", "45.0 s", "after 2"])

    window.last_result = None
    view.act_edit.trigger()  # back to none and never
    dialog = view.dialog
    dialog.jitter.setValue(0)
    dialog.pause_on_failure.setValue(0)
    _ok(dialog)
    assert dialog.changes == dict(jitter=0.0, pause_on_failure=None)
    qtbot.waitUntil(lambda: window.last_result is not None, timeout=WAIT)
    assert (farm.get_schedule("yearly")["jitter"], farm.get_schedule("yearly")["pause_on_failure"]) == (0.0, None)


def test_pause_until_pauses_the_schedule_until_the_time_chosen(farm, open_window, qtbot):
    farm.settings(**FAST)
    farm.schedule("hourly", farm.python_spec(NOOP), every=3600)
    window, view = _selected(farm, open_window, qtbot, "hourly")
    assert view.act_pause_until.isEnabled()
    view.act_pause_until.trigger()
    dialog = view.dialog
    qtbot.waitUntil(dialog.isVisible, timeout=WAIT)
    dialog.when.setDateTime(QDateTime.fromSecsSinceEpoch(int(dialog.start) - 60))  # the past: refused
    _ok(dialog)
    assert dialog.isVisible() and dialog.error.text() == "“Until” must be later than now"
    until = int(dialog.start) + 5400
    dialog.when.setDateTime(QDateTime.fromSecsSinceEpoch(until))
    _ok(dialog)
    qtbot.waitUntil(lambda: window.last_result is not None, timeout=WAIT)
    assert window.last_result[0].startswith("Pause schedule hourly until ") and window.last_result[1]
    row = farm.get_schedule("hourly")
    assert row["paused"] and row["paused_until"] == until
    qtbot.waitUntil(lambda: _cells(view.schedules_model, "hourly")[8].startswith("resumes "), timeout=WAIT)
    assert view.schedules_model.index(view.schedules_model.row_of("hourly"), 8).data(3) == f"{format_time(until)} UTC"
    assert view.act_resume.isEnabled()
