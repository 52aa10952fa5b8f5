"""A user's key cannot take the place of a schedule's occurrence or a singleton (one key namespace): a grab or a
key of their form is refused in one line, and the occurrence and the singleton are made as they would be."""

import pytest

from queueprocessor.rules.errors import InvalidJob
from queueprocessor.rules.schedules import Recurrence
from tests.support import pyjobs
from tests.support.work import FAST, run_cli


def test_a_grab_cannot_take_a_schedules_next_occurrence(farm):
    farm.settings(**FAST)
    farm.schedule("report", farm.python_spec(pyjobs.noop), every=3600)
    upcoming = farm.get_schedule("report")["next_run"]
    label = Recurrence(every=3600).label(upcoming)
    with pytest.raises(InvalidJob, match=r"has the form of a schedule's occurrence \(NAME@TIME\), kept for schedules"):
        farm.grab("report", label, farm.python_spec(pyjobs.noop))
    with pytest.raises(InvalidJob, match="kept for schedules"):
        farm.enqueue_python(pyjobs.noop, key="report@run now nightly")
    assert farm.grab("report", "2026-11-22", farm.python_spec(pyjobs.noop)), "a date is an instance like any"
    farm.run_schedule("report", request="nightly")
    assert farm._store.jobs.keyed(key="report@run now nightly")["origin"] == "schedule report"


def test_a_key_cannot_take_a_singletons_name(farm, capsys):
    assert (
        run_cli("--db", farm.url, "enqueue", "python", "--key", "singleton:nightly", "tests.support.pyjobs:noop") == 1
    )
    assert capsys.readouterr().err == (
        "error: key 'singleton:nightly' begins with 'singleton:', kept for singletons: use another key\n"
    )
    farm.singleton("nightly", farm.python_spec(pyjobs.noop))
    assert [s["name"] for s in farm.list_singletons()] == ["nightly"]
