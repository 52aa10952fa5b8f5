"""A snoozed job in the app's job details: its state line counts its snoozes, and its attempts table shows the snoozed
run with its outcome's own colour (a real SQLite farm, its snooze written by the store)."""

import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from queueprocessor.farm import Farm  # noqa: E402
from queueprocessor.rules.job import Ending  # noqa: E402
from queueprocessor.rules.states import Outcome  # noqa: E402
from queueprocessor.store.types import ClaimRequest  # noqa: E402
from ui import theme  # noqa: E402
from ui.app import make_app  # noqa: E402
from ui.jobsview import JobDetails  # noqa: E402

WHY = "GET http://t/x answered HTTP 429, Retry-After 30; back in 30 s"


@pytest.fixture
def farm(tmp_path):
    with Farm(f"sqlite:///{tmp_path / 'farm.db'}") as the_farm:
        yield the_farm


def test_the_job_details_count_its_snoozes_and_show_the_snoozed_run(qapp, farm, tmp_path):
    make_app([], "light")
    store = farm._store
    me = store.machines.register(name="m", host="h", instance="m-1", pid=1, version="t", capacity=8)
    [job_id] = farm.enqueue_http("/x", max_attempts=3)
    for _ in range(2):
        [claimed] = store.jobs.claim(ClaimRequest(me, 8, 30.0))
        store.runs.finish_many(me, [Ending(claimed, Outcome.SNOOZED, WHY, 0.0, None, True)])
    details = JobDetails()
    details.resize(480, 520)
    details.show()
    details.show_job(farm.job(job_id), {me: "m"})
    QApplication.processEvents()
    assert details.fields["state"].text() == "queued · attempt 0 of 3 · snoozed 2 times"
    model = details.attempts
    outcome = next(c for c in range(model.columnCount()) if model.headerData(c, Qt.Orientation.Horizontal) == "Outcome")
    shown = [model.data(model.index(r, outcome)) for r in range(model.rowCount())]
    assert shown == ["snoozed", "snoozed"]
    assert theme.OUTCOME[Outcome.SNOOZED] not in {c for o, c in theme.OUTCOME.items() if o != Outcome.SNOOZED}
    if path := os.environ.get("QP_SHOT"):  # a picture to look at
        details.grab().save(path)
