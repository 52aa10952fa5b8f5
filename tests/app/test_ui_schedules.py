"""The Schedules tab against a real farm (SQLite and PostgreSQL), real nodes and real Qt widgets offscreen: it
lists the schedules and singletons the database holds, and its Pause, Resume and Remove change the database."""

import os
from datetime import datetime

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtWidgets import QMessageBox  # noqa: E402

from queueprocessor.nodeoptions import NodeConfig  # noqa: E402
from queueprocessor.rules.schedules import Recurrence, settling  # noqa: E402
from tests.app import test_ui_window  # noqa: E402
from tests.support.work import FAST, PYJOBS, Nodes  # noqa: E402
from ui import text, theme  # noqa: E402
from ui.models import BACKGROUND, FOREGROUND, ROW_ROLE  # noqa: E402

app, open_window = test_ui_window.app, test_ui_window.open_window  # the window tests' fixtures
WAIT = test_ui_window.WAIT

NOOP = f"{PYJOBS}:noop"
FEED = f"{PYJOBS}:wait_for_cancel"  # continuous work: runs until told to stop
DESK = NodeConfig(name="desk", capacity=2, allow_modules=(PYJOBS,))  # the app's own node


def _rows(model) -> list[dict]:
    return [model.index(row, 0).data(ROW_ROLE) for row in range(model.rowCount())]


def _cells(model, name) -> list[str]:
    row = model.row_of(name)
    return [model.index(row, column).data() for column in range(model.columnCount())]


def _names(model) -> list[str]:
    return [row["name"] for row in _rows(model)]


def _clock(epoch: float) -> str:
    """How the tab shows a time of today: the local clock."""
    return datetime.fromtimestamp(epoch).strftime("%H:%M:%S")


def _tab(window):
    window.tabs.setCurrentWidget(window.schedules)
    return window.schedules


def _confirm(view, qtbot, answer):
    """Answer the confirmation the Remove action asks for."""
    qtbot.waitUntil(lambda: view.confirm is not None and view.confirm.isVisible(), timeout=WAIT)
    view.confirm.button(answer).click()


def test_the_tab_lists_the_schedules_the_database_holds(farm, open_window, qtbot):
    farm.schedule("often", farm.python_spec(NOOP), every=5, misfire="skip", grace=60)
    farm.schedule("hourly", farm.command_spec(["sh", "-c", "true"]), cron="0 * * * *", tz="Europe/Paris")
    farm.schedule("nightly", farm.python_spec(NOOP), cron="30 2 * * *")
    farm.pause_schedule("nightly")
    window = open_window(farm.url)
    view = _tab(window)
    stored = farm.list_schedules()
    qtbot.waitUntil(lambda: _names(view.schedules_model) == [s["name"] for s in stored], timeout=WAIT)
    assert _names(view.schedules_model) == ["hourly", "nightly", "often"]  # by name

    now = window.snap.db_now
    for schedule in stored:
        recurrence = Recurrence(cron=schedule["cron"], tz=schedule["tz"], every=schedule["every"])
        cells = _cells(view.schedules_model, schedule["name"])
        _, how, work, misfire, _overlap, _jitter, _pauses, state, upcoming, last, machine, finished = cells
        assert how == recurrence.describe()
        assert work == f"{schedule['executor']} {schedule['target']}"
        assert misfire == f"{schedule['misfire']} · {text.duration(schedule['grace'])}"
        assert state == ("paused" if schedule["paused"] else "active")
        row = _rows(view.schedules_model)[view.schedules_model.row_of(schedule["name"])]
        if schedule["paused"]:
            assert row["next_at"] is None and upcoming == "–"
        else:  # the next occurrence in local time, and how far off it is in database time
            at = recurrence.after(max(now, schedule["created_at"] + settling(window.snap.period)))  # its first
            assert row["next_at"] == at
            assert datetime.fromtimestamp(at).strftime("%H:%M") in upcoming
            assert upcoming.endswith(f" · in {text.duration(at - now)}")
        # No node in this farm: nothing ran; an occurrence already due waits in the queue.
        if row["last_job"] is None:
            assert row["last_at"] is None and last == "not yet"
        else:
            assert farm._store.jobs.get(row["last_job"])["state"] == last == "queued"
        assert (machine, finished) == ("", "–")

    # Paused rows stand out: greyed text (still readable) on a tinted background, in every column.
    model, paused = view.schedules_model, view.schedules_model.row_of("nightly")
    scheme = theme.current()
    assert model.index(paused, 2).data(FOREGROUND).name() == theme.readable(scheme.muted, scheme.unsynced_bg)
    assert model.index(paused, 2).data(BACKGROUND).name() == scheme.unsynced_bg
    assert model.index(model.row_of("often"), 2).data(BACKGROUND) is None


def test_pause_resume_and_remove_from_the_tab_change_the_database(farm, open_window, qtbot):
    farm.settings(**FAST)
    farm.schedule("often", farm.python_spec(NOOP), every=3600)
    farm.schedule("other", farm.python_spec(NOOP), every=7200)
    window = open_window(farm.url, DESK)
    view = _tab(window)
    qtbot.waitUntil(lambda: _names(view.schedules_model) == ["often", "other"], timeout=WAIT)
    table = view.schedules_view
    assert not any(action.isEnabled() for action in view.schedule_actions)  # nothing selected yet

    # Right-click a row: it is selected, and the menu offers what fits its state.
    view._menu(table, view.schedule_actions, table.visualRect(view.schedules_model.index(0, 0)).center())
    assert view.selected(table)["name"] == "often"
    assert [(a.text(), a.isEnabled()) for a in view.menu.actions()] == [
        ("Run now", True),
        ("Edit…", view.details is not None),  # once a snapshot has read the selected schedule whole
        ("Pause", True),
        ("Pause until…", True),
        ("Resume", False),
        ("Remove", True),
    ]
    view.menu.close()
    assert all(action.toolTip() for action in view.schedule_actions)

    view.act_pause.trigger()
    qtbot.waitUntil(
        lambda: farm.get_schedule("often")["paused"] and _cells(view.schedules_model, "often")[7] == "paused",
        timeout=WAIT,
    )
    assert window.last_result[:2] == ("Pause schedule often", True)
    qtbot.waitUntil(view.act_resume.isEnabled, timeout=WAIT)
    assert not view.act_pause.isEnabled()

    # The selection stays on its schedule through refreshes, even when a new one is listed above it.
    farm.schedule("early", farm.python_spec(NOOP), every=60)
    qtbot.waitUntil(lambda: _names(view.schedules_model) == ["early", "often", "other"], timeout=WAIT)
    assert view.selected(table)["name"] == "often"

    view.act_resume.trigger()
    qtbot.waitUntil(
        lambda: not farm.get_schedule("often")["paused"] and _cells(view.schedules_model, "often")[7] == "active",
        timeout=WAIT,
    )
    assert view.selected(table)["name"] == "often"

    # Remove asks first; Cancel leaves the schedule alone.
    window.last_result = None
    view.act_remove.trigger()
    _confirm(view, qtbot, QMessageBox.StandardButton.Cancel)
    qtbot.wait(500)  # time enough for a command to run, had one been sent
    assert window.last_result is None and [s["name"] for s in farm.list_schedules()] == ["early", "often", "other"]
    view.act_remove.trigger()
    _confirm(view, qtbot, QMessageBox.StandardButton.Yes)
    qtbot.waitUntil(lambda: window.last_result is not None, timeout=WAIT)
    assert window.last_result[:2] == ("Remove schedule often", True)
    qtbot.waitUntil(lambda: _names(view.schedules_model) == ["early", "other"], timeout=WAIT)
    assert [s["name"] for s in farm.list_schedules()] == ["early", "other"]
    assert view.selected(table) is None and not view.act_remove.isEnabled()


def test_watch_only_the_tab_changes_nothing(farm, open_window, qtbot):
    farm.schedule("often", farm.python_spec(NOOP), every=3600)
    job_id = farm.singleton("feed", farm.python_spec(FEED))
    window = open_window(farm.url)  # --observe
    view = _tab(window)
    qtbot.waitUntil(
        lambda: _names(view.schedules_model) == ["often"] and _names(view.singletons_model) == ["feed"], timeout=WAIT
    )
    view.select(view.schedules_view, "often")
    view.select(view.singletons_view, "feed")
    actions = view.schedule_actions + [view.act_remove_singleton]
    assert not any(action.isEnabled() for action in actions)
    for action in actions:
        action.trigger()  # a disabled action does nothing
    view._menu(
        view.schedules_view,
        view.schedule_actions,
        view.schedules_view.visualRect(view.schedules_model.index(0, 0)).center(),
    )
    assert not any(action.isEnabled() for action in view.menu.actions())
    view.menu.close()
    # Even asked directly, the watching app's database connection refuses the write.
    view.pause()
    qtbot.waitUntil(lambda: window.last_result is not None, timeout=WAIT)
    assert window.last_result[:2] == ("Pause schedule often", False)
    assert view.confirm is None
    assert not farm.get_schedule("often")["paused"]
    assert farm._store.jobs.get(job_id)["state"] == "queued"


def test_the_tab_shows_who_ran_each_occurrence_and_who_holds_each_singleton(farm, open_window, qtbot):
    farm.settings(**FAST)
    nodes = Nodes(farm)
    try:
        nodes("worker-1")
        farm.schedule("tick", farm.python_spec(NOOP), every=0.5)
        job_id = farm.singleton("feed", farm.python_spec(FEED))
        window = open_window(farm.url, DESK)
        view = _tab(window)

        def ran():
            row = view.schedules_model.row_of("tick")
            return row is not None and _rows(view.schedules_model)[row]["last_state"] == "succeeded"

        qtbot.waitUntil(ran, timeout=WAIT)
        tick = _rows(view.schedules_model)[view.schedules_model.row_of("tick")]
        job = farm.job(tick["last_job"])
        assert job["key"] == f"tick@{Recurrence(every=0.5).label(tick['last_at'])}" and job["state"] == "succeeded"
        [run] = job["runs"]
        cells = _cells(view.schedules_model, "tick")
        assert cells[9:] == ["succeeded", window.snap.names[run["machine_id"]], _clock(job["finished_at"])]

        def held():
            cells = _cells(view.singletons_model, "feed") if view.singletons_model.row_of("feed") is not None else []
            return bool(cells) and cells[2] == "running" and cells[3] != ""

        qtbot.waitUntil(held, timeout=WAIT)
        holder = farm.job(job_id)
        _, work, _, machine, since, fence, _ = _cells(view.singletons_model, "feed")
        assert (work, machine, since, fence) == (
            f"python {FEED}",
            window.snap.names[holder["owner"]],
            _clock(holder["started_at"]),
            str(holder["fence"]),
        )

        view.select(view.singletons_view, "feed")
        qtbot.waitUntil(view.act_remove_singleton.isEnabled, timeout=WAIT)
        view.act_remove_singleton.trigger()
        _confirm(view, qtbot, QMessageBox.StandardButton.Yes)
        qtbot.waitUntil(
            lambda: (
                farm.job(job_id)["state"] == "cancelled"
                and _cells(view.singletons_model, "feed")[2:4] == ["cancelled", ""]
            ),
            timeout=WAIT,
        )
        assert not view.act_remove_singleton.isEnabled()
    finally:
        nodes.stop_all()
