"""The event log's words (rules/events.py): every kind is in a family `events --kind` takes, and a machine named in
an event can be found again (the app marks its lane)."""

from queueprocessor.rules.events import FAMILIES, EventKind, machine_in, machine_label


def test_every_kind_belongs_to_a_family_and_every_family_has_kinds():
    assert {kind.split(".")[0] for kind in EventKind} == set(FAMILIES)


def test_a_machine_label_names_its_machine_and_other_subjects_none():
    assert machine_in(machine_label("web #3", 12)) == 12
    assert machine_in("reports") is None and machine_in("nightly #x") is None
