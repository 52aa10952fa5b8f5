"""The table models update in place: a refresh moves, adds and drops rows with row signals (never a reset),
so what the operator selected stays selected, and only rows whose values changed are repainted. Qt's own
model tester watches every signal."""

import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QPersistentModelIndex, Qt  # noqa: E402

from queueprocessor.rules.queues import OnFailure, QueueInfo  # noqa: E402
from queueprocessor.rules.states import JobState, MachineState, Outcome  # noqa: E402
from ui import theme  # noqa: E402
from ui.app import make_app  # noqa: E402
from ui.models import BACKGROUND, DECORATION, FOREGROUND, ROW_ROLE, TOOLTIP, JobsModel, PeersModel  # noqa: E402
from ui.queuesview import QueuesModel, row_of  # noqa: E402
from ui.schedulesview import SchedulesModel  # noqa: E402

NAMES = {"names": {1: "desk"}}


def _job(job_id, state="queued", **fields):
    return (
        dict(
            id=job_id,
            state=state,
            method="GET",
            target=f"/work/{job_id}",
            attempts=0,
            max_attempts=3,
            owner=None,
            created_at=1_700_000_000.0 + job_id,
            finished_at=None,
            last_error=None,
            queue="default",
            order_key=None,
        )
        | fields
    )


@pytest.fixture
def model(qapp, qtmodeltester, qtlog):
    model = JobsModel()
    qtmodeltester.check(model)  # Qt's QAbstractItemModelTester: checks every signal the model sends
    yield model
    failures = [record.message for record in qtlog.records if "FAIL" in record.message]
    assert failures == []


class Spy:
    """What the model told its views."""

    def __init__(self, model):
        self.changed, self.resets, self.inserted, self.removed, self.moved = [], [], [], [], []
        model.dataChanged.connect(lambda first, last, *_: self.changed.append((first.row(), last.row())))
        model.modelReset.connect(lambda: self.resets.append(True))
        model.rowsInserted.connect(lambda _, first, last: self.inserted.append((first, last)))
        model.rowsRemoved.connect(lambda _, first, last: self.removed.append((first, last)))
        model.layoutChanged.connect(lambda *_: self.moved.append(True))


def _ids(model):
    return [model.index(row, 0).data(ROW_ROLE)["id"] for row in range(model.rowCount())]


def test_new_jobs_on_top_are_inserted_and_a_selected_row_follows_its_job(model):
    model.set_rows([_job(n) for n in (5, 4, 3, 2, 1)], NAMES)
    selected = QPersistentModelIndex(model.index(2, 0))  # job 3, as a view's selection holds it
    spy = Spy(model)

    model.set_rows([_job(n) for n in (7, 6, 5, 4, 3)], NAMES)  # two new on top, the two oldest fall off

    assert _ids(model) == [7, 6, 5, 4, 3]
    assert (spy.removed, spy.inserted, spy.resets, spy.changed) == ([(3, 4)], [(0, 1)], [], [])
    assert selected.row() == 4 and selected.data(ROW_ROLE)["id"] == 3


def test_only_rows_whose_values_changed_are_repainted(model):
    model.set_rows([_job(n) for n in (3, 2, 1)], NAMES)
    spy = Spy(model)

    model.set_rows([_job(n) for n in (3, 2, 1)], NAMES)  # a fresh read of the same jobs
    assert spy.changed == []
    model.set_rows([_job(3), _job(2, "running", attempts=1, owner=1), _job(1)], NAMES)
    assert spy.changed == [(1, 1)]
    assert [model.index(1, column).data() for column in (1, 3, 4)] == ["running", "1/3", "desk"]
    model.set_rows([_job(3), _job(2, "running", attempts=1, owner=1), _job(1)], {"names": {1: "desk-2"}})
    assert spy.changed[1:] == [(0, 2)]  # a machine was renamed: every row may read differently
    assert spy.resets == spy.inserted == spy.removed == []


def test_rows_sorted_on_a_changing_column_move_with_their_selection(model):
    model.set_rows([_job(3, "queued"), _job(2, "queued"), _job(1, "succeeded")], NAMES)
    model.sort(1, Qt.SortOrder.AscendingOrder)  # by state
    assert _ids(model) == [3, 2, 1]
    selected = QPersistentModelIndex(model.index(0, 0))  # job 3
    spy = Spy(model)

    model.set_rows([_job(4, "failed"), _job(3, "succeeded"), _job(2, "queued")], NAMES)

    assert [(job, model.index(row, 1).data()) for row, job in enumerate(_ids(model))] == [
        (4, "failed"),
        (2, "queued"),
        (3, "succeeded"),
    ]
    assert selected.row() == 2 and selected.data(ROW_ROLE)["id"] == 3
    assert spy.resets == [] and spy.moved and spy.removed == [(2, 2)]
    model.sort(0, Qt.SortOrder.DescendingOrder)  # by job id, newest first
    assert _ids(model) == [4, 3, 2] and selected.row() == 1
    assert spy.resets == []


def _machine(machine_id, status, synced=True):
    return dict(
        id=machine_id,
        name=f"m{machine_id}",
        host="h",
        status=status,
        leader=False,
        clock_offset=0.001,
        error_bound=0.0005 if synced else 0.4,
        rtt=0.001,
        last_seen=990.0,
        capacity=2,
        running=0,
        done_count=0,
        failed_count=0,
        synced=synced,
        pid=7,
        version="t",
        queues=(),
        caps={},
    )


def _colour(icon) -> str:
    """The colour of a state dot, at its centre."""
    return icon.pixmap(10, 10).toImage().pixelColor(5, 5).name()


def test_each_column_styles_its_own_cells_over_the_rows_style(qapp):
    peers = PeersModel()
    peers.set_rows(
        [
            _machine(1, MachineState.ACTIVE),
            _machine(2, MachineState.DEAD),
            _machine(3, MachineState.STOPPED),
            _machine(4, MachineState.ACTIVE, synced=False),
        ],
        {"db_now": 1000.0},
    )
    state = next(n for n, column in enumerate(peers.columns) if column.title == "State")
    scheme = theme.current()

    # The Machine column shows each machine's state as a dot; no other column has an icon.
    assert [_colour(peers.index(row, 0).data(DECORATION)) for row in range(4)] == [
        theme.MACHINE_STATE[s]
        for s in (MachineState.ACTIVE, MachineState.DEAD, MachineState.STOPPED, MachineState.ACTIVE)
    ]
    assert peers.index(1, state).data(DECORATION) is None
    # The State column writes "dead" in red (a shade that reads on the dead row); the row's other cells keep the
    # normal text colour.
    assert peers.index(1, state).data(FOREGROUND).name() == theme.readable(
        theme.MACHINE_STATE[MachineState.DEAD], scheme.dead_bg
    )
    assert peers.index(1, 0).data(FOREGROUND) is None and peers.index(0, state).data(FOREGROUND) is None
    # Row styles: a stopped machine greyed out, the dead and the unsynced one shaded, each with its reason.
    assert {peers.index(2, column).data(FOREGROUND).name() for column in range(12)} == {scheme.muted}
    assert peers.index(1, 5).data(BACKGROUND).name() == scheme.dead_bg
    assert peers.index(3, 5).data(BACKGROUND).name() == scheme.unsynced_bg
    assert peers.index(0, 5).data(BACKGROUND) is None
    assert peers.index(1, 3).data(TOOLTIP) == "m2 has not checked in for 10.0 s"
    assert "clock estimate is too loose" in peers.index(3, 3).data(TOOLTIP)
    assert peers.index(0, 3).data(TOOLTIP) == "machine 1 · pid 7 · version t"

    jobs = JobsModel()
    jobs.set_rows(
        [_job(1, JobState.FAILED, last_error="HTTP 500\nbody: upstream down"), _job(2, "no such state")], NAMES
    )
    assert _colour(jobs.index(0, 1).data(DECORATION)) == theme.JOB_STATE[JobState.FAILED]
    assert _colour(jobs.index(1, 1).data(DECORATION)) == theme.OUTCOME[Outcome.CANCELLED]  # grey: a state unknown
    assert jobs.index(0, 7).data() == "HTTP 500" and jobs.index(0, 7).data(TOOLTIP) == "HTTP 500\nbody: upstream down"
    assert jobs.index(0, 2).data(TOOLTIP) is None and jobs.index(1, 7).data(TOOLTIP) is None


def _looks(model, row) -> tuple:
    """How a row stands out: its background and text colours (None: as any row)."""
    colours = (model.index(row, 1).data(role) for role in (BACKGROUND, FOREGROUND))
    return tuple(colour.name() if colour is not None else None for colour in colours)


@pytest.fixture(params=["light", "dark"])
def scheme(qapp, request):
    """Each colour scheme in turn (then light again, as the other tests expect)."""
    make_app([], request.param)
    yield theme.current()
    make_app([], "light")


def test_rows_that_mean_the_same_stand_out_the_same_in_every_table_and_read_in_either_scheme(scheme):
    """A dead machine and an unserved queue alarm alike; a paused queue and a paused schedule are shaded and
    greyed alike; a stopped machine is greyed only. Every cell's text keeps WCAG AA contrast on its row's shading
    (the dead machine's red state and the greyed rows read as well as any)."""
    peers = PeersModel()
    peers.set_rows(
        [
            _machine(1, MachineState.DEAD),
            _machine(2, MachineState.STOPPED),
            _machine(3, MachineState.ACTIVE),
            _machine(4, MachineState.ACTIVE, synced=False),
        ],
        {"db_now": 1000.0},
    )
    queues = QueuesModel()
    queues.set_rows(
        [
            row_of(QueueInfo(name, 2, 0, None, None, 0, paused, OnFailure.SKIP, serving), {})
            for name, paused, serving in (
                ("gpu", False, ()),
                ("emails", True, ("web-1",)),
                ("default", False, ("web-1",)),
            )
        ]
    )
    schedules = SchedulesModel()
    schedules.set_rows([dict(name="nightly", paused=True), dict(name="often", paused=False)])
    assert _looks(peers, 0) == _looks(queues, queues.row_of("gpu")) == (scheme.dead_bg, None)
    paused = _looks(queues, queues.row_of("emails"))
    assert paused == _looks(schedules, 0) and paused[0] == scheme.unsynced_bg and paused[1] not in (None, scheme.text)
    assert _looks(peers, 1)[0] is None and _looks(peers, 1)[1] not in (None, scheme.text)
    assert _looks(peers, 2) == _looks(queues, queues.row_of("default")) == _looks(schedules, 1) == (None, None)
    for model in (peers, queues, schedules):
        for row in range(model.rowCount()):
            for column in range(model.columnCount()):
                index = model.index(row, column)
                text, shade = (index.data(role) for role in (FOREGROUND, BACKGROUND))
                for background in [shade.name()] if shade else [scheme.base, scheme.alt_base]:
                    ink = text.name() if text else scheme.text
                    assert theme.contrast(ink, background) >= 4.5, (model.columns[column].title, row, ink)
