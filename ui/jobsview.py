"""The Job runs tab: the runs Gantt, the recent jobs table with its filters, and the selected job's details.

The filters (state, queue, text) are database queries the worker runs (the table holds only the
newest jobs that match), so a search finds old jobs too.
"""

import json

from PySide6.QtCore import QItemSelectionModel, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QGridLayout,
    QLabel,
    QLineEdit,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from queueprocessor.rules.kinds import work_said
from queueprocessor.rules.output import progress_text
from queueprocessor.rules.search import BadSearch, parse_search
from queueprocessor.rules.states import JobState

from . import text
from .gantt import RunsGantt
from .joblinks import JobLinks
from .models import ROW_ROLE, AttemptsModel, JobsModel
from .progressbar import ProgressDelegate
from .snapshot import Snapshot
from .tables import arrange, table


class JobDetails(QWidget):
    """One job: its fields, its payload and every attempt with machine, fence, times and error."""

    def __init__(self, parent=None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.title = QLabel("Select a job to see its attempts", objectName="sectionTitle")
        self.title.setWordWrap(True)
        layout.addWidget(self.title)
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(3)
        self.fields: dict[str, QLabel] = {}
        # Texts that can be long (a state with its attempts, a URL, a schedule's key) get the whole width; two
        # short ones share a line, so none wraps into a narrow column that the pane's height then cuts off.
        lines = (
            (("state", "State"),),
            (("progress", "Progress"),),
            (("target", "Target"),),
            (("created", "Created"), ("finished", "Finished")),
            (("priority", "Priority"), ("timeout", "Timeout")),
            (("queue", "Queue · order key"),),
            (("key", "Key"),),
            (("error", "Last error"),),
            (("payload", "Payload"),),
        )
        cells = [
            (row, pair * 2, 3 if len(line) == 1 else 1, key, label)
            for row, line in enumerate(lines)
            for pair, (key, label) in enumerate(line)
        ]
        for row, column, span, key, label in cells:
            value = QLabel("")
            value.setTextFormat(Qt.TextFormat.PlainText)  # payloads and errors are shown as they are
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            value.setWordWrap(True)  # the pane narrows with the window
            grid.addWidget(QLabel(label, objectName="muted"), row, column)
            grid.addWidget(value, row, column + 1, 1, span)
            self.fields[key] = value
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 1)
        layout.addLayout(grid)
        self.links = JobLinks()  # its parents, children and workflows, each a link
        layout.addWidget(self.links)
        self.attempts = AttemptsModel(self)
        # The pane is some 440 px wide at 1440: the fence and the times, the least read, are hidden (a right-click
        # on the header away) so the error has the room left, cut short with the whole of it in its tooltip.
        self.attempts_view = table(
            self.attempts, (40, 80, 40, 90, 90, 50, 80, 120, 110), stretch=7, floor=120, hidden=(2, 3, 4, 5, 8)
        )
        # What happened first (outcome, error), then when: times are the widest and least read.
        arrange(self.attempts_view, (0, 1, 2, 6, 7, 5, 3, 4))
        layout.addWidget(self.attempts_view, 1)

    def show_job(self, job: dict | None, names: dict[int, str]) -> None:
        if job is None:
            self.title.setText("Select a job to see its attempts")
            for field in self.fields.values():
                field.setText("")
            self.attempts.set_rows([], {"names": names})
            self.links.show_job(None)
            return
        self.title.setText(f"Job {job['id']} and its attempts")
        self.fields["state"].setText(
            f"{job['state']} · attempt {job['attempts']} of {job['max_attempts']}"
            + (f" · snoozed {job['snoozes']} times" if job.get("snoozes") else "")
            + (" · cancel requested" if job["cancel_requested"] else "")
        )
        self.fields["progress"].setText(_progress(job))
        self.fields["target"].setText(f"{job['executor']} {work_said(job)}")
        self.fields["created"].setText(text.stamp(job["created_at"]))
        self.fields["finished"].setText(text.stamp(job["finished_at"]))
        self.fields["priority"].setText(str(job["priority"]))
        self.fields["timeout"].setText(text.duration(job["timeout"]) if job["timeout"] else "none")
        self.fields["key"].setText(job["key"] or "–")
        self.fields["queue"].setText(f"{job['queue']} · {job['order_key']}" if job["order_key"] else job["queue"])
        self.fields["error"].setText(job["last_error"] or "–")
        self.fields["payload"].setText(_payload(job["payload"]))
        self.links.show_job(job)
        self.attempts.set_rows(sorted(job["runs"], key=lambda r: (r["attempt"], r["fence"])), {"names": names})


def _progress(job: dict) -> str:
    """How far the job is while it runs; after, what its last run said, marked as such (the runs keep it)."""
    if job["progress"] is None:
        return "–"
    said = progress_text(job["progress"], job["progress_message"])
    return said if job["state"] == JobState.RUNNING else f"{said} (its last run's)"


def _payload(payload: str | None) -> str:
    """Pretty JSON, or the text as it is: a plain SQL insert can store anything."""
    if not payload:
        return "none"
    try:
        shown = json.dumps(json.loads(payload), indent=1)
    except ValueError:
        shown = payload
    return shown[:2000]


STATE_COLUMN = 1  # JobsModel's "State": a running job's progress is drawn there as a bar
SEARCH_PAUSE = 300  # ms of no typing before the text filter goes to the database
SEARCH_READS = "Filter by text: id, target"  # what the text box must have room to show beside the lists


class FilterRow(QWidget):
    """The state and queue lists with the text box beside them, or on a line of its own under them when the pane
    is too narrow for the box to show the start of its hint (squeezed beside them, it read "Fi…")."""

    def __init__(self, lists: tuple[QComboBox, ...], search: QLineEdit):
        super().__init__()
        self.lists, self.search = lists, search
        self.grid = QGridLayout(self)
        self.grid.setContentsMargins(0, 0, 0, 0)
        for column, widget in enumerate(lists):
            self.grid.addWidget(widget, 0, column)
        self.beside: bool | None = None

    def arrange(self) -> None:
        """Put the text box beside the lists if it has the room there, else under them."""
        spacing = self.grid.horizontalSpacing()
        lists = sum(widget.sizeHint().width() + spacing for widget in self.lists)
        wanted = self.search.fontMetrics().horizontalAdvance(SEARCH_READS) + 40  # its margins and clear button
        beside = self.width() - lists >= wanted
        if beside == self.beside:
            return
        self.beside = beside
        self.grid.removeWidget(self.search)
        if beside:
            self.grid.addWidget(self.search, 0, len(self.lists))
        else:
            self.grid.addWidget(self.search, 1, 0, 1, len(self.lists))
        # The text box takes the room the lists leave, beside them or under them.
        for column in range(len(self.lists) + 1):
            self.grid.setColumnStretch(column, 1 if (column == len(self.lists)) == beside else 0)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.arrange()


class JobsView(QWidget):
    job_selected = Signal(object)  # a job id, or None (none selected, or many)
    selection_changed = Signal()  # the rows selected changed
    state_filter_changed = Signal(object)  # a job state, or None for all
    text_filter_changed = Signal(object)  # text to look for, or None for all
    queue_filter_changed = Signal(object)  # a queue name, or None for all

    def __init__(self, parent=None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        split = QSplitter(Qt.Orientation.Vertical)
        self.gantt = RunsGantt()
        split.addWidget(self.gantt)

        lower = QSplitter(Qt.Orientation.Horizontal)
        left = QWidget()
        box = QVBoxLayout(left)
        box.setContentsMargins(0, 0, 0, 0)
        self.state = QComboBox()
        self.state.addItem("All states", None)
        for state in JobState:
            self.state.addItem(state.capitalize(), state.value)
        self.state.setToolTip("Show only jobs in this state (asks the database)")
        self.state.currentIndexChanged.connect(lambda _: self.state_filter_changed.emit(self.state.currentData()))
        self.queue = QComboBox()
        self.queue.addItem("All queues", None)
        self.queue.setToolTip("Show only jobs of this queue (asks the database)")
        self.queue.currentIndexChanged.connect(lambda _: self.queue_filter_changed.emit(self.queue.currentData()))
        self.search = QLineEdit()
        self.search.setPlaceholderText("Filter by text: id, target, machine, error, field=value, queue:name…")
        self.search.setToolTip(
            "Show only jobs that match every word: field=value or field.sub=value in the JSON payload, "
            "queue:NAME, key:KEY (order or unique key), or text the id, target, machine or error contains, "
            "ignoring case (asks the database; a slow search is repeated less often)"
        )
        self.search.setClearButtonEnabled(True)
        self.search_timer = QTimer(self)
        self.search_timer.setSingleShot(True)
        self.search_timer.setInterval(SEARCH_PAUSE)
        self.search_timer.timeout.connect(self._search_changed)
        self.search.textChanged.connect(lambda _: self.search_timer.start())
        self.filters = FilterRow((self.state, self.queue), self.search)
        box.addWidget(self.filters)
        self.search_error = QLabel("", objectName="searchError")  # a search that cannot be read, in one line
        self.search_error.setWordWrap(True)
        self.search_error.hide()
        box.addWidget(self.search_error)
        self.model = JobsModel(self)
        # At 1440 wide the pane has room for six columns: the attempts, times and progress (a bar in the state cell),
        # which the selected job's details show, are hidden (a right-click on the header away), the target is cut
        # short, the error takes the rest.
        self.table = table(
            self.model,
            (56, 100, 130, 70, 90, 100, 100, 120, 80, 110),
            stretch=7,
            floor=120,
            order=Qt.SortOrder.DescendingOrder,
            hidden=(3, 5, 6, 9),
        )
        self.table.setItemDelegateForColumn(STATE_COLUMN, ProgressDelegate(self.table))  # a running job's bar
        arrange(self.table, (0, 1, 8, 2, 7, 4, 3, 5, 6, 9))  # the queue and error beside the job; times last
        # Many rows at once, with shift and ctrl, for the actions on the selection.
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.table.selectionModel().selectionChanged.connect(self._selection_changed)
        box.addWidget(self.table)
        self.box = box
        lower.addWidget(left)
        self.details = JobDetails()
        lower.addWidget(self.details)
        lower.setSizes([640, 460])
        split.addWidget(lower)
        split.setSizes([200, 340])
        self.split = split
        layout.addWidget(split)
        self._selected: int | None = None
        self._updating = False

    def _search_changed(self) -> None:
        """Send the search to the database, or say in one line why it cannot be read (the last good one stays)."""
        text = self.search.text().strip() or None
        try:
            parse_search(text or "")
        except BadSearch as error:
            self.search_error.setText(str(error))
            self.search_error.show()
            return
        self.search_error.hide()
        self.text_filter_changed.emit(text)

    def offer(self, bar: QWidget) -> None:
        """Put `bar` (what acts on every job the filters pick) under the filters."""
        self.box.insertWidget(1, bar)

    def selected_jobs(self) -> list[dict]:
        return [index.data(ROW_ROLE) for index in self.table.selectionModel().selectedRows()]

    def selected_job(self) -> dict | None:
        """The job selected, if exactly one is (its details are shown)."""
        rows = self.selected_jobs()
        return rows[0] if len(rows) == 1 else None

    def _selection_changed(self, *_):
        if self._updating:
            return
        self.selection_changed.emit()
        job = self.selected_job()
        job_id = job["id"] if job else None
        if job_id != self._selected:
            self._selected = job_id
            self.job_selected.emit(job_id)

    def show_snapshot(self, snapshot: Snapshot) -> None:
        self.gantt.show_snapshot(snapshot)
        self._offer_queues([info.name for info in snapshot.queues])
        # The selection follows its row through the update; if the job left the list and comes back, select it again.
        self._updating = True
        try:
            self.model.set_rows(snapshot.jobs, {"names": snapshot.names})
            if len(self.selected_jobs()) > 1:  # many rows: each follows its own, and no details are shown
                self._selected = None
            elif self._selected is not None and self.selected_job() is None:
                self.select(self._selected)
            shown = self.selected_job()
            if shown is not None and shown["id"] != self._selected:
                # Qt moved the selection to a neighbour when the selected job's row left: it is not the job
                # the details show, so nothing is selected until the user picks (or the job comes back).
                self.table.clearSelection()
        finally:
            self._updating = False
        job = snapshot.job
        self.details.show_job(job if job and job["id"] == self._selected else None, snapshot.names)

    def _offer_queues(self, names: list[str]) -> None:
        """Offer these queues in the filter; the one chosen stays chosen (and listed) even once it is empty."""
        chosen = self.queue.currentData()
        wanted = sorted({*names, *([chosen] if chosen else [])})
        if wanted == [self.queue.itemData(n) for n in range(1, self.queue.count())]:
            return
        self.queue.blockSignals(True)  # the filter itself does not change
        try:
            while self.queue.count() > 1:
                self.queue.removeItem(1)
            for name in wanted:
                self.queue.addItem(name, name)
            self.queue.setCurrentIndex(self.queue.findData(chosen) if chosen else 0)
        finally:
            self.queue.blockSignals(False)
        self.filters.arrange()  # a longer queue name widens the list

    def go_to(self, job_id: int) -> None:
        """Show this job's details, selected in the table if it is listed (a parent or child clicked)."""
        if not self.select(job_id):
            self.table.clearSelection()
            self._selected = job_id
            self.job_selected.emit(job_id)

    def select(self, job_id: int) -> bool:
        """Select a job by id in the table (False if it is not shown)."""
        row = self.model.row_of(job_id)
        if row is not None:  # this job alone, whatever was selected before (the table selects many)
            rows = QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows
            self.table.selectionModel().setCurrentIndex(self.model.index(row, 0), rows)
        return row is not None
