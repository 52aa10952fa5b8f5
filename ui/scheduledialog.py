"""Edit a schedule: what `queueprocessor schedule set` takes (its recurrence, misfire and overlap policies, jitter,
pause on failure, work and queue), as a form, with the next five runs (jitter applied) shown as they are typed; and
the time a pause ends, as a small form of its own.

The preview and every check are the core's pure rules (rules.schedules.edited, upcoming_runs, check_policy,
check_overlap, work_spec), run as the operator types: nothing here touches the database. `changes` holds only the
fields the operator changed (Farm.edit_schedule's keywords), so what another operator changed meanwhile stays as
they set it.
"""

from PySide6.QtCore import QDateTime
from PySide6.QtWidgets import (
    QComboBox,
    QDateTimeEdit,
    QDialog,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
)

from queueprocessor import work_spec
from queueprocessor.rules.errors import QPError
from queueprocessor.rules.kinds import HTTP, KINDS, METHODS, TARGETS_SAID
from queueprocessor.rules.schedules import (
    MAX_JITTER,
    MAX_PAUSE_ON_FAILURE,
    MISFIRE,
    OVERLAP,
    PREVIEW,
    Recurrence,
    check_overlap,
    check_policy,
    edited,
    upcoming_runs,
)

from . import text, theme
from .dialogs import _finish_form, in_form_terms

CRON, EVERY = "cron", "every"
WORK = ("executor", "target", "method", "payload", "queue")


def occurrence_text(recurrence: Recurrence, t: float) -> str:
    """An occurrence as the preview shows it: your local time, and a cron's wall time in its own zone."""
    mine = text.clock(t, millis=False)
    return mine if recurrence.every is not None else f"{mine} · {recurrence.tz} {recurrence.label(t)[11:19]}"


class ScheduleDialog(QDialog):
    """Schedule `row` (a stored row, as Farm.get_schedule gives it) as a form. `start`: database time from which
    the preview counts, a period past now, where a new recurrence starts (rules.schedules.first_occurrence)."""

    def __init__(self, row: dict, start: float, parent=None):
        super().__init__(parent)
        self.row, self.start = row, start
        self.changes: dict = {}
        self.setWindowTitle(f"Schedule {row['name']}")
        self.setWindowIcon(theme.icon("limit"))
        self.setMinimumWidth(480)
        layout = QVBoxLayout(self)
        form = QFormLayout()
        self.kind = QComboBox()
        self.kind.addItem("Cron expression in a time zone", CRON)
        self.kind.addItem("Fixed interval", EVERY)
        self.kind.setCurrentIndex(self.kind.findData(EVERY if row["every"] is not None else CRON))
        form.addRow("Recurs by", self.kind)
        self.cron = QLineEdit(row["cron"] or "")
        self.cron.setPlaceholderText("e.g. 30 2 * * * (minute hour day month weekday), or @daily")
        form.addRow("Cron", self.cron)
        self.tz = QLineEdit(row["tz"] or "UTC")
        self.tz.setToolTip("An IANA time zone, e.g. Europe/Berlin: the cron's times are its wall-clock times")
        form.addRow("Time zone", self.tz)
        self.every = QDoubleSpinBox(minimum=0, maximum=10 * 365 * 86400, decimals=1, suffix=" s")
        self.every.setValue(row["every"] or 60.0)
        self.every.setToolTip("Occurrences at whole multiples of this since the epoch, so every machine agrees")
        form.addRow("Every", self.every)
        self.preview = QLabel("", objectName="muted")
        self.preview.setWordWrap(True)
        self.preview.setToolTip("When the next occurrences start, each with its jitter applied")
        form.addRow(f"Next {PREVIEW}", self.preview)
        self.misfire = QComboBox()
        self.misfire.addItems(list(MISFIRE))
        self.misfire.setCurrentText(row["misfire"])
        self.misfire.setToolTip("Occurrences the farm noticed late: skip them, run the newest once, or run all")
        form.addRow("Misfire", self.misfire)
        self.grace = QDoubleSpinBox(minimum=0, maximum=10 * 365 * 86400, decimals=1, suffix=" s")
        self.grace.setValue(row["grace"])
        self.grace.setToolTip("A missed occurrence older than this is dropped whatever the misfire policy says")
        form.addRow("Grace", self.grace)
        self._policy(row, form)
        self.executor = QComboBox()
        self.executor.addItems(list(KINDS))
        self.executor.setCurrentText(row["executor"])
        form.addRow("Executor", self.executor)
        self.target = QLineEdit(row["target"])
        self.target.setToolTip(TARGETS_SAID[0].upper() + TARGETS_SAID[1:])
        form.addRow("Target", self.target)
        self.method = QComboBox()
        self.method.addItems(list(METHODS))
        self.method.setCurrentText(row["method"])
        self.method.setToolTip("HTTP work only")
        self.executor.currentTextChanged.connect(lambda kind: self.method.setEnabled(kind == HTTP.name))
        self.method.setEnabled(row["executor"] == HTTP.name)
        form.addRow("Method", self.method)
        self.payload = QPlainTextEdit(row["payload"] or "")
        self.payload.setPlaceholderText('JSON given to the work, e.g. {"report": "daily"}; empty for none')
        self.payload.setFixedHeight(70)
        form.addRow("Payload", self.payload)
        self.queue = QLineEdit(row["queue"])
        self.queue.setToolTip("The queue its occurrences wait in; only machines serving it run them")
        form.addRow("Queue", self.queue)
        self.error = _finish_form(self, layout, form, "Save")
        for signal in (
            self.cron.textChanged,
            self.tz.textChanged,
            self.every.valueChanged,
            self.kind.currentIndexChanged,
            self.jitter.valueChanged,
        ):
            signal.connect(self.show_preview)
        self.show_preview()

    def _policy(self, row: dict, form: QFormLayout) -> None:
        """Overlap, jitter and pause on failure."""
        self.overlap = QComboBox()
        self.overlap.addItems(list(OVERLAP))
        self.overlap.setCurrentText(row["overlap"])
        self.overlap.setToolTip(
            "An occurrence due while the last one's run is still going: allow runs it beside it; skip cancels it "
            "(saying why); buffer-one keeps one waiting for the run to end; cancel-previous stops the run"
        )
        form.addRow("Overlap", self.overlap)
        self.jitter = QDoubleSpinBox(minimum=0, maximum=MAX_JITTER, decimals=1, suffix=" s")
        self.jitter.setSpecialValueText("none")
        self.jitter.setValue(row["jitter"] or 0.0)
        self.jitter.setToolTip(
            "Each occurrence starts up to this late, by a delay fixed per occurrence (every machine agrees on "
            "it): schedules due at the same time spread out"
        )
        form.addRow("Jitter", self.jitter)
        self.pause_on_failure = QSpinBox(minimum=0, maximum=MAX_PAUSE_ON_FAILURE)
        self.pause_on_failure.setSpecialValueText("never")
        self.pause_on_failure.setSuffix(" failed runs in a row")
        self.pause_on_failure.setValue(row["pause_on_failure"] or 0)
        self.pause_on_failure.setToolTip("It pauses itself, with an event, after this many failed runs in a row")
        form.addRow("Pause after", self.pause_on_failure)

    def recurrence_given(self) -> dict:
        """The recurrence the form says, as Farm.edit_schedule's keywords."""
        if self.kind.currentData() == EVERY:
            return dict(cron=None, tz=None, every=self.every.value())
        return dict(cron=self.cron.text().strip(), tz=self.tz.text().strip(), every=None)

    def show_preview(self) -> None:
        """The next runs of the recurrence typed so far with the jitter given (rules.schedules.upcoming_runs), or why
        it has none."""
        cron = self.kind.currentData() == CRON
        self.cron.setEnabled(cron)
        self.tz.setEnabled(cron)
        self.every.setEnabled(not cron)
        try:
            recurrence = edited(self.row, **self.recurrence_given())
            plan = dict(cron=recurrence.cron, tz=recurrence.tz, every=recurrence.every, jitter=self.jitter.value())
            times = upcoming_runs(self.row | plan | dict(paused=False), self.start)
        except QPError as error:
            self.preview.setText(in_form_terms(error))
            return
        self.preview.setText("\n".join(occurrence_text(recurrence, t) for t in times))

    def accept(self) -> None:
        given = self.recurrence_given()
        try:
            recurrence = edited(self.row, **given)
            check_policy(self.misfire.currentText(), self.grace.value())
            overlap, jitter = self.overlap.currentText(), self.jitter.value()
            pause_on_failure = self.pause_on_failure.value() or None
            check_overlap(overlap, jitter, pause_on_failure)
            spec = work_spec(
                self.executor.currentText(),
                self.target.text().strip(),
                method=self.method.currentText() if self.method.isEnabled() else None,
                payload=self.payload.toPlainText().strip() or None,
                queue=self.queue.text().strip(),
            )
        except QPError as error:
            self.error.setText(in_form_terms(error))
            return
        wanted = dict(cron=recurrence.cron, tz=recurrence.tz, every=recurrence.every)
        wanted |= dict(misfire=self.misfire.currentText(), grace=self.grace.value())
        wanted |= dict(overlap=overlap, jitter=jitter, pause_on_failure=pause_on_failure)
        wanted |= {key: getattr(spec, key) for key in WORK}
        self.changes = {key: value for key, value in wanted.items() if value != self.row[key]}
        if not {"cron", "tz", "every"}.isdisjoint(self.changes):  # a recurrence is given whole, or not at all
            self.changes |= given
        if "executor" in self.changes:  # a target means what its executor makes of it
            self.changes["target"] = spec.target
        super().accept()


class PauseDialog(QDialog):
    """Until when to pause schedule `row`: a time in your time zone, from `start` (database time, a period past the
    last snapshot) on; `until` holds it as epoch seconds once accepted."""

    def __init__(self, row: dict, start: float, parent=None):
        super().__init__(parent)
        self.start = start
        self.until: float | None = None
        self.setWindowTitle(f"Pause {row['name']} until")
        self.setWindowIcon(theme.icon("pause"))
        layout = QVBoxLayout(self)
        form = QFormLayout()
        self.when = QDateTimeEdit(QDateTime.fromSecsSinceEpoch(int(start) + 3600))
        self.when.setCalendarPopup(True)
        self.when.setDisplayFormat("yyyy-MM-dd HH:mm:ss")
        self.when.setToolTip("The farm resumes it at this time (your time zone), from its next occurrence")
        form.addRow("Until", self.when)
        self.error = _finish_form(self, layout, form, "Pause")

    def accept(self) -> None:
        until = float(self.when.dateTime().toSecsSinceEpoch())
        if until <= self.start:
            self.error.setText("“Until” must be later than now")
            return
        self.until = until
        super().accept()
