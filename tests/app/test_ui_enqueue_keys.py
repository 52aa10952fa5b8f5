"""The enqueue dialog's unique key on its own terms (how long it is held, on conflict, debounce), against a real
farm (SQLite and PostgreSQL) and real Qt widgets offscreen: each field reaches the job as `enqueue --key ...`
gives it, a choice the core refuses is refused in the dialog in its one line, with the field named, and the
window says what an enqueue of a held key did."""

import os
import re

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QDateTime  # noqa: E402

from queueprocessor import work_spec  # noqa: E402
from queueprocessor.rules.keys import KeyTerms  # noqa: E402
from tests.app import test_ui_window  # noqa: E402
from tests.app.test_ui_schedules import DESK  # noqa: E402
from ui.dialogs import EnqueueDialog  # noqa: E402

app, open_window = test_ui_window.app, test_ui_window.open_window  # the window tests' fixtures
WAIT = test_ui_window.WAIT


def _choose(combo, value):
    combo.setCurrentIndex(combo.findData(value))


def test_the_key_fields_reach_the_job_spec_and_bad_choices_are_refused_in_one_line(app, qtbot):
    dialog = EnqueueDialog()
    qtbot.addWidget(dialog)
    fields = dialog.key_fields
    dialog.accept()  # nothing chosen: the job as before
    assert dialog.result() == 1 and dialog.options["spec"].terms == KeyTerms()

    def refused(start: str) -> None:
        dialog.setResult(0)
        dialog.accept()
        said = dialog.error.text()
        assert dialog.result() == 0 and said.startswith(start) and "\n" not in said, said

    _choose(fields.on_conflict, "existing")
    refused("“On conflict” needs “Unique key”")  # a policy for a key, without a key
    _choose(fields.on_conflict, "reject")
    fields.debounce.setValue(30)
    refused("“Debounce” needs “Unique key”")
    dialog.key.setText("nightly-report")
    dialog.count.setValue(2)
    refused("“Debounce” answers an enqueue of one job: give no “Copies” with it")
    dialog.count.setValue(1)
    dialog.delay.setValue(5)
    refused("“Debounce” sets the job's time: give no “Delay” with it")
    dialog.delay.setValue(0)
    _choose(fields.scope, "unfinished")
    refused("“Debounce” moves a job that has not started")
    _choose(fields.scope, "waiting")
    fields.max_delay.setValue(10)
    refused("“Max delay” ")  # less than the debounce
    fields.max_delay.setValue(120)
    _choose(fields.on_conflict, "replace")
    dialog.setResult(0)
    dialog.accept()
    assert dialog.result() == 1, dialog.error.text()
    assert dialog.options["spec"] == work_spec(
        "http", "/ok", key="nightly-report", key_scope="waiting", on_conflict="replace", debounce=30.0, max_delay=120.0
    )

    fields.debounce.setValue(0)
    fields.max_delay.setValue(0)
    _choose(fields.scope, "kept")
    fields.held_for.setValue(600)
    fields.until_on.setChecked(True)
    refused("give “Held until” or “Held after success”, not both")
    fields.held_for.setValue(0)
    fields.until.setDateTime(QDateTime.fromSecsSinceEpoch(2_000_000_000))
    dialog.setResult(0)
    dialog.accept()
    assert dialog.result() == 1, dialog.error.text()
    assert dialog.options["spec"].terms == KeyTerms(scope="until", hold=2_000_000_000.0, on_conflict="replace")


def _enqueue(window, qtbot, key, **chosen) -> str:
    """Enqueue /ok later (a minute ahead, nothing runs it) with `key` and the key fields `chosen`; the window's
    answer."""
    window.operator.enqueue()
    dialog = window.findChildren(EnqueueDialog)[-1]
    dialog.key.setText(key)
    for name, value in chosen.items():
        field = getattr(dialog.key_fields, name)
        _choose(field, value) if isinstance(value, str) else field.setValue(value)
    if "debounce" not in chosen:
        dialog.delay.setValue(60)
    window.last_result = None
    dialog.accept()
    qtbot.waitUntil(lambda: window.last_result is not None, timeout=WAIT)
    label, ok, message = window.last_result
    assert label == "Enqueue" and ok, message
    return message


def test_an_enqueue_of_a_held_key_says_what_it_did_with_the_holder(farm, open_window, qtbot):
    window = open_window(farm.url, DESK)  # a window with a node of its own may write
    first = _enqueue(window, qtbot, "k1")
    holder = int(re.search(r"job (\d+)", first).group(1))
    again = _enqueue(window, qtbot, "k1", on_conflict="existing")
    assert again == f"key k1 is held by job {holder}: answered with it, nothing enqueued"
    debounced = _enqueue(window, qtbot, "d1", debounce=30.0)
    job = int(re.search(r"job (\d+)", debounced).group(1))
    due = farm.job(job)["run_at"]
    moved = _enqueue(window, qtbot, "d1", debounce=40.0)
    assert moved.startswith(f"key d1 is held by job {job}, waiting: its time moved by the debounce")
    assert farm.job(job)["run_at"] > due
    assert [j["key"] for j in farm.list_jobs()].count("d1") == 1
