"""The Schedules tab: recurring schedules and singletons, and an operator's Run now, Edit, Pause, Resume and
Remove for them.

Like Hangfire's "Recurring jobs" page: each schedule with how it recurs, its
policy (misfire, overlap, jitter, pause on failure), its next occurrence (or
when its pause ends) and what became of its last one; below, the last runs of
the selected one (due, late, outcome, the occurrences it skipped and why) beside
its next runs with jitter applied, then each singleton with the machine holding
it. The tab never touches the database: an operator's
action is a call of the window's `Commands` (run on the worker thread), and
the next snapshot shows its effect.
"""

import uuid
from typing import cast

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QLabel, QMenu, QMessageBox, QSplitter, QTableView, QToolBar, QVBoxLayout, QWidget

from queueprocessor.rules.states import JobState, MachineState

from . import text, theme
from .commands import Commands
from .dialogs import confirm
from .models import ROW_ROLE, Column, Mark, SnapshotModel, dot, full_text, marked
from .scheduledialog import PauseDialog, ScheduleDialog
from .scheduleplan import POLICY, next_runs_text, next_text, next_tip, says_skipped, skipped
from .scheduleruns import ScheduleRunsModel, run_rows
from .snapshot import Snapshot
from .tables import table

ASCENDING = Qt.SortOrder.AscendingOrder


def _machine(machine_id: int | None, context: dict) -> str:
    return context["names"].get(machine_id, f"#{machine_id}") if machine_id is not None else ""


def _state(row: dict) -> MachineState:
    """A schedule is active or paused, in the words (and colours) of a machine's."""
    return MachineState.PAUSED if row["paused"] else MachineState.ACTIVE


def _last(row: dict, _context) -> str:
    if row["last_at"] is None:
        return "not yet"
    if row["last_state"] is None or says_skipped(row["last_error"]):
        return "skipped"  # by its misfire policy (no job), or its overlap policy (a job cancelled, saying why)
    return row["last_state"]


def _last_run_tip(row: dict, _context) -> str | None:
    if row["last_at"] is None:
        return None
    job = f"job {row['last_job']}" if row["last_job"] else "no job (its misfire policy skipped it)"
    error = f"\n{row['last_error']}" if row["last_error"] else ""
    finished = f", finished {text.stamp(row['last_finished'])}" if row["last_finished"] else ""
    return f"Occurrence of {text.stamp(row['last_at'])}: {job}{finished}{error}"


def _paused_tip(row: dict, _context) -> str | None:
    if not row["paused"]:
        return None
    why = f" ({row['paused_why']})" if row["paused_why"] else ""
    if row["paused_until"] is not None:
        return f"{row['name']} is paused until {text.stamp(row['paused_until'])}{why}: the farm resumes it then"
    return f"{row['name']} is paused{why}: Resume starts it again from its next occurrence"


class SchedulesModel(SnapshotModel):
    """Every recurring schedule, by name; paused ones greyed out."""

    key = "name"
    columns = [
        Column("Schedule", lambda r, c: r["name"]),
        Column("Recurrence", lambda r, c: r["recurrence"], tip="A cron expression in its time zone, or an interval"),
        Column("Work", lambda r, c: f"{r['executor']} {r['target']}", tip="What each occurrence runs"),
        Column(
            "Misfire",
            lambda r, c: f"{r['misfire']} · {text.duration(r['grace'])}",
            tip="Occurrences the farm noticed late: skip them, run the newest once, or run all; "
            "older than the grace, they are dropped",
        ),
        *POLICY,
        Column(
            "State",
            lambda r, c: _state(r),
            tip="Paused schedules make no jobs",
            icon=lambda r, c: theme.dot(theme.MACHINE_STATE[_state(r)]),
        ),
        Column(
            "Next",
            lambda r, c: next_text(r, c["db_now"]),
            lambda r, c: r["next_at"] or r["paused_until"] or float("inf"),
            tip="The next occurrence (before its jitter), in your time zone, and how far off it is in database "
            "time; for a schedule paused until a time, how far off that is",
            cell_tip=next_tip,
        ),
        Column(
            "Last run",
            _last,
            tip="What became of the last occurrence's job",
            icon=dot(theme.JOB_STATE, "last_state"),
            cell_tip=_last_run_tip,
        ),
        Column("Machine", lambda r, c: _machine(r["last_machine"], c), tip="The machine that ran the last occurrence"),
        Column(
            "Finished",
            lambda r, c: text.clock(r["last_finished"], millis=False),
            lambda r, c: r["last_finished"] or 0,
            tip="When the last occurrence's job finished (in your time zone)",
        ),
    ]
    row_styles = marked(lambda row: Mark.PAUSED if row["paused"] else None, _paused_tip)


def _holding(row: dict) -> bool:
    return row["state"] == JobState.RUNNING


class SingletonsModel(SnapshotModel):
    """Every singleton, by name, with the machine holding it."""

    key = "name"
    columns = [
        Column("Singleton", lambda r, c: r["name"]),
        Column("Work", lambda r, c: f"{r['executor']} {r['target']}"),
        Column(
            "State",
            lambda r, c: "stopping" if _holding(r) and r["cancel_requested"] else r["state"],
            tip="running (held by a machine), queued (waiting for a turn to start it), stopping or cancelled (removed)",
            icon=dot(theme.JOB_STATE, "state"),
        ),
        Column(
            "Machine", lambda r, c: _machine(r["owner"], c) if _holding(r) else "", tip="The machine holding it now"
        ),
        Column(
            "Since",
            lambda r, c: text.clock(r["started_at"], millis=False) if _holding(r) else "",
            lambda r, c: r["started_at"] or 0,
            tip="When this machine took it (in your time zone)",
        ),
        Column(
            "Fence",
            lambda r, c: str(r["fence"]),
            "fence",
            True,
            "Bumped by every takeover: a holder quoting an older fence has lost it",
        ),
        Column(
            "Last error", lambda r, c: (r["last_error"] or "").split("\n")[0][:120], cell_tip=full_text("last_error")
        ),
    ]


class SchedulesView(QWidget):
    schedule_selected = Signal(object)  # the selected schedule's name (None: none), whose last runs to read
    run_answered = Signal(str)  # a run-now request of this schedule came back from the worker (emitted there)

    def __init__(self, commands: Commands, watch_only: bool = False, parent=None):
        super().__init__(parent)
        self.commands = commands
        self.watch_only = watch_only
        self.schedules_model = SchedulesModel(self)
        self.singletons_model = SingletonsModel(self)
        # Misfire (a setting, seldom read), the last run's Machine and Finished (in its tooltip) hidden at first:
        # the rest fits at 1440 px beside the dock.
        self.schedules_view = table(
            self.schedules_model,
            (120, 175, 125, 96, 105, 56, 70, 80, 170, 100, 80, 90),
            order=ASCENDING,
            menu=lambda at: self._menu(self.schedules_view, self.schedule_actions, at),
            hidden=(3, 10, 11),
        )
        self.singletons_view = table(
            self.singletons_model,
            (140, 240, 100, 90, 150, 50),
            order=ASCENDING,
            menu=lambda at: self._menu(self.singletons_view, [self.act_remove_singleton], at),
        )
        self.act_pause = self._action(
            "pause",
            "Pause",
            "Stop making jobs of the selected schedule; its occurrences waiting in the queue are cancelled",
            self.pause,
        )
        self.act_pause_until = self._action(
            "pause",
            "Pause until…",
            "Stop making jobs of the selected schedule until a time you choose; the farm resumes it itself then",
            self.pause_until,
        )
        self.act_resume = self._action(
            "resume",
            "Resume",
            "Start the selected schedule again from its next occurrence (those in the pause are not run)",
            self.resume,
        )
        self.act_remove = self._action(
            "cancel",
            "Remove",
            "Delete the selected schedule; its occurrences waiting in the queue are cancelled",
            self.remove,
        )
        self.act_remove_singleton = self._action(
            "cancel",
            "Remove",
            "Stop the selected singleton for good (its machine stops it within a heartbeat)",
            self.remove_singleton,
        )
        self._build_steering()
        self.schedule_actions = [
            self.act_run_now,
            self.act_edit,
            self.act_pause,
            self.act_pause_until,
            self.act_resume,
            self.act_remove,
        ]
        self.menu: QMenu | None = None
        self.confirm: QMessageBox | None = None
        self.split = self._lay_out()
        self._selected: dict[QTableView, str | None] = {self.schedules_view: None, self.singletons_view: None}
        self._updating = False
        for view in (self.schedules_view, self.singletons_view):
            view.selectionModel().selectionChanged.connect(lambda *_, v=view: self._selection_changed(v))
        self._update_actions()

    # -- building -------------------------------------------------------------

    def _lay_out(self) -> QSplitter:
        """The schedules; below them their last runs beside their next runs; then the singletons."""
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self._section("Recurring schedules", self.schedule_actions, self.schedules_view))
        runs = self._section("Last runs", [], self.runs_view)
        self.runs_title = runs.findChild(QLabel, "sectionTitle")
        beside = QSplitter(Qt.Orientation.Horizontal)
        beside.addWidget(runs)
        beside.addWidget(self._next_section())
        beside.setStretchFactor(0, 1)
        beside.setSizes([870, 150])
        split.addWidget(beside)
        split.addWidget(self._section("Singletons", [self.act_remove_singleton], self.singletons_view))
        split.setSizes([300, 210, 90])
        layout.addWidget(split)
        return split

    def _build_steering(self) -> None:
        """Run now and Edit, and the last runs of the selected schedule."""
        self.act_run_now = self._action(
            "enqueue",
            "Run now",
            "Run the selected schedule once now, beside its regular occurrences (which stay as they are)",
            self.run_now,
        )
        self.act_edit = self._action(
            "limit",
            "Edit…",
            "Change the selected schedule's recurrence, misfire policy, work or queue, with its next occurrences "
            "shown as you type",
            self.edit,
        )
        self.dialog: ScheduleDialog | PauseDialog | None = None
        self.runs_model = ScheduleRunsModel(self)
        self.runs_view = table(self.runs_model, (95, 72, 45, 58, 80, 95, 60, 95, 200))
        self.details: dict | None = None  # the selected schedule's row and last runs, once a snapshot has them
        self._requests: dict[str, str] = {}  # schedule -> the run-now request sent and not yet answered
        self._start = 0.0  # database time a period past the last snapshot's: where an edit's preview counts from
        self.run_answered.connect(self._run_answered)

    def _action(self, icon: str, label: str, tip: str, slot) -> QAction:
        action = QAction(theme.icon(icon), label, self)
        action.setData(icon)  # the window's restyle() redraws it in the new scheme's colours
        action.setToolTip(tip)
        action.setStatusTip(tip)
        action.triggered.connect(slot)
        return action

    def _next_section(self) -> QWidget:
        """The selected schedule's next runs with its jitter applied (the snapshot's schedule_next)."""
        section = QWidget()
        box = QVBoxLayout(section)
        box.setContentsMargins(0, 0, 0, 0)
        self.next_title = QLabel("Next runs", objectName="sectionTitle")
        self.next_title.setContentsMargins(4, 8, 4, 8)
        self.next_title.setToolTip(
            "When the selected schedule's next occurrences start, each with its jitter applied (every machine "
            "agrees on it): the times a target sees"
        )
        self.next_runs = QLabel("Select a schedule")
        self.next_runs.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.next_runs.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.next_runs.setContentsMargins(6, 4, 6, 4)
        box.addWidget(self.next_title)
        box.addWidget(self.next_runs, 1)
        return section

    def _section(self, title: str, actions: list[QAction], view: QTableView) -> QWidget:
        section = QWidget()
        box = QVBoxLayout(section)
        box.setContentsMargins(0, 0, 0, 0)
        bar = QToolBar(title)
        bar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        bar.addWidget(QLabel(title, objectName="sectionTitle"))
        spacer = QWidget()
        spacer.setMinimumWidth(12)
        bar.addWidget(spacer)
        for action in actions:
            bar.addAction(action)
        box.addWidget(bar)
        box.addWidget(view)
        return section

    # -- showing ----------------------------------------------------------------

    def show_snapshot(self, snapshot: Snapshot) -> None:
        context = {"db_now": snapshot.db_now, "names": snapshot.names}
        # A row keeps its selection through an update; one that left the list and came back is selected again.
        # When the selected row goes, Qt selects its neighbour: not a row the operator chose to act on.
        self._updating = True
        try:
            for view, rows in ((self.schedules_view, snapshot.schedules), (self.singletons_view, snapshot.singletons)):
                cast(SnapshotModel, view.model()).set_rows(rows, context)
                name, shown = self._selected[view], self.selected(view)
                if name is not None and (shown is None or shown["name"] != name):
                    view.clearSelection()
                    self.select(view, name)
        finally:
            self._updating = False
        self._show_details(snapshot)
        self._update_actions()

    def _show_details(self, snapshot: Snapshot) -> None:
        """The selected schedule's last runs, from a snapshot that read them for it (not one read before the
        selection moved)."""
        name = self._selected[self.schedules_view]
        shown = snapshot.schedule
        self.details = shown if shown is not None and shown["name"] == name else None
        self._start = snapshot.db_now + snapshot.period
        self.runs_model.set_rows(run_rows(self.details), {})
        skips = sum(skipped(run) for run in self.details["runs"]) if self.details else 0
        said = f" · {skips} skipped" if skips else ""
        self.runs_title.setText(f"Last runs of {name}{said}" if name else "Last runs (select a schedule)")
        if self.details is None:
            self.next_runs.setText("Select a schedule" if name is None else "Reading…")
        else:
            self.next_runs.setText(next_runs_text(self.details, snapshot.schedule_next, snapshot.db_now))

    def selected(self, view: QTableView) -> dict | None:
        rows = view.selectionModel().selectedRows()
        return rows[0].data(ROW_ROLE) if rows else None

    def select(self, view: QTableView, name: str) -> bool:
        """Select a row by name (False if it is not shown)."""
        row = cast(SnapshotModel, view.model()).row_of(name)
        if row is not None:
            view.selectRow(row)
        return row is not None

    def _selection_changed(self, view: QTableView) -> None:
        if not self._updating:
            row = self.selected(view)
            name = row["name"] if row else None
            if view is self.schedules_view and name != self._selected[view]:
                self.schedule_selected.emit(name)
            self._selected[view] = name
        self._update_actions()

    @property
    def writers(self) -> list[QAction]:
        """The actions that change the farm (the window disables them while it is read-only)."""
        return [
            self.act_pause,
            self.act_pause_until,
            self.act_resume,
            self.act_remove,
            self.act_run_now,
            self.act_edit,
            self.act_remove_singleton,
        ]

    def _update_actions(self) -> None:
        schedule = self.selected(self.schedules_view)
        singleton = self.selected(self.singletons_view)
        allowed = not self.watch_only
        self.act_pause.setEnabled(allowed and bool(schedule) and not schedule["paused"])
        self.act_pause_until.setEnabled(allowed and bool(schedule))
        self.act_resume.setEnabled(allowed and bool(schedule) and schedule["paused"])
        self.act_remove.setEnabled(allowed and bool(schedule))
        self.act_run_now.setEnabled(allowed and bool(schedule) and schedule["name"] not in self._requests)
        self.act_edit.setEnabled(allowed and self.details is not None)
        self.act_remove_singleton.setEnabled(
            allowed and bool(singleton) and singleton["state"] in (JobState.QUEUED, JobState.RUNNING)
        )

    def _menu(self, view: QTableView, actions: list[QAction], position: QPoint) -> None:
        index = view.indexAt(position)
        if not index.isValid():
            return
        view.selectRow(index.row())
        menu = QMenu(self)
        for action in actions:
            menu.addAction(action)
        menu.popup(view.viewport().mapToGlobal(position))
        self.menu = menu

    # -- acting -------------------------------------------------------------------

    def pause(self) -> None:
        if schedule := self.selected(self.schedules_view):
            self.commands.pause_schedule(schedule["name"])

    def pause_until(self) -> None:
        """Ask until when (without blocking), then pause the selected schedule until then."""
        if schedule := self.selected(self.schedules_view):
            name, dialog = schedule["name"], PauseDialog(schedule, self._start, self)
            dialog.accepted.connect(lambda: self.commands.pause_schedule(name, until=dialog.until))
            dialog.open()
            self.dialog = dialog

    def resume(self) -> None:
        if schedule := self.selected(self.schedules_view):
            self.commands.resume_schedule(schedule["name"])

    def run_now(self) -> None:
        """Run the selected schedule once now. Its request is kept until the worker answers: however often it is
        asked meanwhile, it is the same request, which the farm runs once (Farm.run_schedule)."""
        if schedule := self.selected(self.schedules_view):
            name = schedule["name"]
            request = self._requests.setdefault(name, uuid.uuid4().hex)
            self.commands.run_schedule(name, request, then=lambda: self.run_answered.emit(name))
            self._update_actions()

    def _run_answered(self, name: str) -> None:
        self._requests.pop(name, None)
        self._update_actions()

    def edit(self) -> None:
        """Open the selected schedule in the edit dialog (without blocking); Save sends what was changed."""
        if self.details is not None:
            name, dialog = self.details["name"], ScheduleDialog(self.details, self._start, self)
            dialog.accepted.connect(lambda: self._save(name, dialog.changes))
            dialog.open()
            self.dialog = dialog

    def _save(self, name: str, changes: dict) -> None:
        if changes:  # Save with nothing changed sends nothing
            self.commands.edit_schedule(name, changes)

    def remove(self) -> None:
        if schedule := self.selected(self.schedules_view):
            name = schedule["name"]
            self._confirm(
                f"Remove schedule {name}?",
                "It makes no more jobs, and its occurrences waiting in the "
                "queue are cancelled. Jobs that already ran keep their history.",
                lambda: self.commands.remove_schedule(name),
            )

    def remove_singleton(self) -> None:
        if singleton := self.selected(self.singletons_view):
            name = singleton["name"]
            self._confirm(
                f"Remove singleton {name}?",
                "It stops for good: at once if it waits, within a heartbeat if a machine runs it.",
                lambda: self.commands.remove_singleton(name),
            )

    def _confirm(self, question: str, detail: str, then) -> None:
        self.confirm = confirm(self, "confirmRemove", question, detail, "Remove", then)
