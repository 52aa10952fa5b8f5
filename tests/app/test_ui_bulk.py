"""Acting on many jobs from the app: a multi-row selection (shift and ctrl) and "All matching" with the count
confirmed first, on a real farm database, with real widgets offscreen."""

import os
import re

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402
from sqlalchemy import update  # noqa: E402

from queueprocessor.nodeoptions import NodeConfig  # noqa: E402
from queueprocessor.rules.job import JobSpec  # noqa: E402
from queueprocessor.store.schema import jobs  # noqa: E402
from queueprocessor.store.types import ClaimRequest
from tests.app import test_ui_window  # noqa: E402
from tests.app.test_ui_window import WAIT, _listed  # noqa: E402

app, open_window = test_ui_window.app, test_ui_window.open_window  # the window's fixtures

ELSEWHERE = "elsewhere"  # the app's node serves only this queue, so the jobs retried here stay queued


def _failed(farm, payloads, name="worker"):
    """Jobs that ran once and failed for good (max_attempts 1), through the claim and finish a node makes (on a
    machine row of `name`)."""
    store = farm._store
    machine = store.machines.register(name=name, host="h", instance=name, pid=1, version="t", capacity=50)
    ids = [store.jobs.enqueue(JobSpec(executor="http", target="/t", payload=p, max_attempts=1))[0] for p in payloads]
    for claimed in store.jobs.claim(ClaimRequest(machine, len(ids), lease=30)):
        store.runs.finish(claimed, machine, "failed", error="boom")
    return ids


def _window(farm, open_window, http_target):
    node = NodeConfig(name="gui", capacity=2, http_base=http_target.base_url, queues=ELSEWHERE)
    window = open_window(farm.url, node)
    window.tabs.setCurrentWidget(window.jobs)
    return window


def _click(window, row, modifier=Qt.KeyboardModifier.NoModifier):
    view = window.jobs.table
    QTest.mouseClick(
        view.viewport(), Qt.MouseButton.LeftButton, modifier, view.visualRect(view.model().index(row, 0)).center()
    )


def _states(farm, ids):
    return [farm.job(j)["state"] for j in ids]


def test_shift_and_ctrl_select_many_jobs_and_the_actions_act_on_all_of_them(farm, http_target, open_window, qtbot):
    ids = _failed(farm, [None] * 4)
    window = _window(farm, open_window, http_target)
    qtbot.waitUntil(lambda: _listed(window) == ids[::-1], timeout=WAIT)

    _click(window, 0)
    _click(window, 2, Qt.KeyboardModifier.ShiftModifier)  # rows 0 to 2
    _click(window, 1, Qt.KeyboardModifier.ControlModifier)  # less row 1
    chosen = [job["id"] for job in window.jobs.selected_jobs()]
    assert sorted(chosen) == sorted([ids[3], ids[1]])
    assert window.jobs.selected_job() is None  # details are for one job
    assert window.act.retry.isEnabled() and window.act.delete.isEnabled() and not window.act.cancel.isEnabled()

    window.act.retry.trigger()
    qtbot.waitUntil(lambda: window.last_result is not None, timeout=WAIT)
    assert window.last_result == ("Retry 2 jobs", True, "2 of 2 selected jobs changed")
    assert _states(farm, ids) == ["failed", "queued", "failed", "queued"]


def test_all_matching_counts_first_asks_and_then_acts_on_every_job_the_filter_picks(
    farm, http_target, open_window, qtbot
):
    mondays = _failed(farm, ['{"day": "monday"}'] * 3)
    [tuesday] = _failed(farm, ['{"day": "tuesday"}'], name="other")
    window = _window(farm, open_window, http_target)
    window.jobs.search.setText("day=monday")
    qtbot.waitUntil(lambda: sorted(_listed(window)) == sorted(mondays), timeout=WAIT)

    def ask(label):
        window.bulk.question = None
        [action] = [a for a in window.bulk.menu.actions() if a.text() == label]
        action.trigger()
        qtbot.waitUntil(lambda: window.bulk.question is not None and window.bulk.question.isVisible(), timeout=WAIT)
        return window.bulk.question

    question = ask("Retry all matching…")
    assert question.text() == "Retry 3 jobs?" and "day=monday" in question.informativeText()
    question.button(QMessageBox.StandardButton.Cancel).click()
    assert _states(farm, [*mondays, tuesday]) == ["failed"] * 4  # nothing happens unless confirmed

    window.last_result = None
    ask("Retry all matching…").button(QMessageBox.StandardButton.Yes).click()
    qtbot.waitUntil(
        lambda: window.last_result is not None and window.last_result[0] == "Retry all matching", timeout=WAIT
    )
    assert window.last_result == ("Retry all matching", True, "3 jobs queued again")
    assert _states(farm, [*mondays, tuesday]) == ["queued"] * 3 + ["failed"]
    qtbot.waitUntil(lambda: window.bulk.button.isVisible() and not window.bulk.stop.isVisible(), timeout=WAIT)


def test_a_search_that_cannot_be_read_says_why_in_one_line_and_keeps_the_last_good_one(
    farm, http_target, open_window, qtbot
):
    [job] = _failed(farm, ['{"day": "monday"}'])
    window = _window(farm, open_window, http_target)
    window.jobs.search.setText("day=monday")
    qtbot.waitUntil(
        lambda: window.connection.query.jobs_text == "day=monday" and _listed(window) == [job], timeout=WAIT
    )
    window.jobs.search.setText("day..x=1")
    qtbot.waitUntil(lambda: window.jobs.search_error.isVisible(), timeout=WAIT)
    assert "search term 'day..x=1' is not understood" in window.jobs.search_error.text()
    assert window.connection.query.jobs_text == "day=monday"


def test_stop_ends_an_all_matching_action_between_batches_and_says_how_far_it_got(
    farm, http_target, open_window, qtbot
):
    total = 50_000
    ids = farm.enqueue_http("/t", count=total, max_attempts=1)
    # As a final failure leaves them (a claim and finish of each would only slow the test).
    farm._store.count(update(jobs).values(state="failed", attempts=1, finished_at=1.0))
    window = _window(farm, open_window, http_target)
    qtbot.waitUntil(lambda: _listed(window)[:1] == [ids[-1]], timeout=WAIT)
    window.bulk.question = None
    [retry] = [a for a in window.bulk.menu.actions() if a.text() == "Retry all matching…"]
    retry.trigger()
    qtbot.waitUntil(lambda: window.bulk.question is not None and window.bulk.question.isVisible(), timeout=WAIT)
    assert window.bulk.question.text() == "Retry 50,000 jobs?"
    window.bulk.question.button(QMessageBox.StandardButton.Yes).click()
    qtbot.waitUntil(lambda: window.bulk.stop.isVisible() and window.bulk.progress.value() > 0, timeout=WAIT)
    window.bulk.stop.click()
    qtbot.waitUntil(
        lambda: window.last_result is not None and window.last_result[0] == "Retry all matching", timeout=WAIT
    )
    label, ok, message = window.last_result
    said = int(re.match(r"([\d,]+) jobs queued again before Stop$", message)[1].replace(",", ""))
    queued = farm.job_counts()["queued"]
    assert ok and 0 < said == queued < total
    qtbot.waitUntil(lambda: window.bulk.button.isVisible() and not window.bulk.stop.isVisible(), timeout=WAIT)
