"""Dialogs: choose a database, enqueue a job, confirm, about. Each validates its input before it closes."""

from collections.abc import Iterable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from queueprocessor import __version__, work_spec
from queueprocessor.farm import needs_password, with_password
from queueprocessor.rules.errors import QPError
from queueprocessor.rules.fairness import ORDER_KEY, check_fair_from
from queueprocessor.rules.keys import check_enqueue
from queueprocessor.rules.kinds import HTTP
from queueprocessor.rules.queues import DEFAULT, OnFailure, QueueInfo, Rate, check_keep, check_limit, keep_text
from queueprocessor.rules.urls import default_url, mask

from . import theme
from .keyfields import KeyFields


class DatabaseDialog(QDialog):
    """Pick the farm's database: a recent one, the embedded SQLite default, or a new URL.

    `url` and `problem` ask again for one database: a recent one remembered without its password, or one
    whose server turned the login down."""

    def __init__(self, recent: list[str], parent=None, url: str | None = None, problem: str = ""):
        super().__init__(parent)
        self.setWindowTitle("Open a farm database")
        self.setWindowIcon(theme.icon("database"))
        self.url = ""
        layout = QVBoxLayout(self)
        intro = QLabel(
            "Every machine of a farm shares one database. Choose it, or start with the embedded "
            "SQLite file to try QueueProcessor on this machine."
        )
        intro.setWordWrap(True)
        layout.addWidget(intro)
        form = QFormLayout()
        row = QHBoxLayout()
        self.choice = QComboBox()
        self.choice.setEditable(True)
        self.choice.setMinimumWidth(440)
        self.choice.addItems(list(dict.fromkeys([*recent, default_url()])))
        self.choice.setToolTip("sqlite:///path/farm.db or postgresql://user@host/dbname")
        browse = QPushButton("SQLite file…")
        browse.setToolTip("Choose or create a SQLite database file")
        browse.clicked.connect(self._browse)
        row.addWidget(self.choice, 1)
        row.addWidget(browse)
        form.addRow("Database URL", row)
        self.password = QLineEdit()
        self.password.setEchoMode(QLineEdit.EchoMode.Password)
        self.password.setPlaceholderText("only if the URL has a user and no password")
        form.addRow("Password", self.password)
        layout.addLayout(form)
        note = QLabel("Recent databases are remembered without their passwords.", objectName="muted")
        layout.addWidget(note)
        self.error = QLabel("", objectName="error")
        self.error.setWordWrap(True)
        layout.addWidget(self.error)
        if url:
            self.choice.setCurrentText(url)
            self.error.setText(problem)
            if needs_password(url):
                self.password.setFocus()
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Open | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    def _browse(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self,
            "SQLite database file",
            "",
            "SQLite databases (*.db *.sqlite);;All files (*)",
            options=QFileDialog.Option.DontConfirmOverwrite,
        )
        if path:
            self.choice.setCurrentText(f"sqlite:///{path}")

    def accept(self) -> None:
        try:
            self.url = with_password(self.choice.currentText().strip(), self.password.text())
        except QPError as error:
            self.error.setText(str(error))
            return
        super().accept()


class EnqueueDialog(QDialog):
    """A new HTTP job: what `queueprocessor enqueue http` takes, as a form."""

    def __init__(self, parent=None, queues: Iterable[str] = ()):
        """`queues`: the farm's queue names, offered in the queue field (any other name may be typed)."""
        super().__init__(parent)
        self.setWindowTitle("Enqueue a job")
        self.setWindowIcon(theme.icon("enqueue"))
        self.options: dict = {}  # once accepted: Farm.submit's arguments (the job's spec, delay, count)
        layout = QVBoxLayout(self)
        form = QFormLayout()
        self.path = QLineEdit("/ok")
        self.path.setToolTip(
            "A path on each node's --http-base, e.g. /reports/daily, or an http(s) URL on a host the nodes allow"
        )
        form.addRow("Path or URL", self.path)
        self.method = QComboBox()
        self.method.addItems(["GET", "POST"])
        form.addRow("Method", self.method)
        self.queue = QComboBox()
        self.queue.setEditable(True)
        self.queue.addItems(sorted({DEFAULT, *queues}))
        self.queue.setCurrentText(DEFAULT)
        self.queue.setToolTip("Only machines serving this queue run the job; a new name makes a new queue")
        form.addRow("Queue", self.queue)
        self.payload = QPlainTextEdit()
        self.payload.setPlaceholderText('JSON body for POST, e.g. {"report": "daily"}')
        self.payload.setFixedHeight(80)
        form.addRow("Payload", self.payload)
        self.priority = QSpinBox(minimum=-1000, maximum=1000)
        self.priority.setToolTip("Higher runs first")
        form.addRow("Priority", self.priority)
        self.delay = QDoubleSpinBox(minimum=0, maximum=365 * 86400, decimals=1, suffix=" s")
        self.delay.setToolTip("Run this long from now, in database time")
        form.addRow("Delay", self.delay)
        self.attempts = QSpinBox(minimum=1, maximum=100, value=3)
        form.addRow("Max attempts", self.attempts)
        self.timeout = QDoubleSpinBox(minimum=0, maximum=86400, decimals=1, suffix=" s")
        self.timeout.setSpecialValueText("none")
        self.timeout.setToolTip("Stop a run after this long (none: no limit)")
        form.addRow("Timeout", self.timeout)
        self.count = QSpinBox(minimum=1, maximum=100_000, value=1)
        form.addRow("Copies", self.count)
        self.key = QLineEdit()
        self.key.setPlaceholderText("optional: a second job with the same key meets “On conflict” below")
        form.addRow("Unique key", self.key)
        self.key_fields = KeyFields(form, self.key)
        self.order_key = QLineEdit()
        self.order_key.setPlaceholderText("optional: jobs with the same order key run one at a time, in order")
        form.addRow("Order key", self.order_key)
        self.error = _finish_form(self, layout, form, "Enqueue")

    def accept(self) -> None:
        try:
            spec = work_spec(
                HTTP.name,
                self.path.text().strip(),
                method=self.method.currentText(),
                payload=self.payload.toPlainText().strip() or None,
                priority=self.priority.value(),
                max_attempts=self.attempts.value(),
                timeout=self.timeout.value() or None,
                key=self.key.text().strip() or None,
                queue=self.queue.currentText().strip(),
                order_key=self.order_key.text().strip() or None,
                **self.key_fields.options(),
            )
            check_enqueue(spec.terms, count=self.count.value(), delay=self.delay.value(), at=None)
        except QPError as error:
            self.error.setText(in_form_terms(error))
            return
        self.options = dict(spec=spec, delay=self.delay.value(), count=self.count.value())
        super().accept()


class QueueDialog(QDialog):
    """A queue's farm-wide limit, rate, failure policy and retention, and its flow control per fairness key (fair
    share, a limit and a rate per key, where keyless jobs take their key). The core's own parsing checks each field
    before the dialog closes; `changes` holds only what the operator changed (Farm.set_queue's keywords), so a
    setting another operator changed meanwhile is left as they set it."""

    def __init__(self, info: QueueInfo, parent=None):
        super().__init__(parent)
        self.info = info
        self.changes: dict = {}
        self.setWindowTitle(f"Queue {info.name}")
        self.setWindowIcon(theme.icon("limit"))
        self.setMinimumWidth(440)  # a refusal fits on two lines under the fields, not squeezing them
        layout = QVBoxLayout(self)
        form = QFormLayout()
        self.limit = QLineEdit("" if info.limit is None else str(info.limit))
        self.limit.setPlaceholderText("none: no farm-wide limit")
        self.limit.setToolTip("Most jobs of this queue running at once across the whole farm")
        form.addRow("Limit", self.limit)
        self.rate = QLineEdit("" if info.rate is None else str(info.rate))
        self.rate.setPlaceholderText("none, or e.g. 10/s, 120/min")
        self.rate.setToolTip(
            "Most starts of this queue's jobs per second or per minute, farm-wide; the surplus "
            "waits, nothing is dropped"
        )
        form.addRow("Rate", self.rate)
        self.on_failure = QComboBox()
        for policy in OnFailure:
            self.on_failure.addItem(policy.value, policy)
        self.on_failure.setCurrentIndex(self.on_failure.findData(info.on_failure))
        self.on_failure.setToolTip(
            "block: a failing job holds its order key until it succeeds or runs out of "
            "attempts; skip: the next job of its key runs at once"
        )
        form.addRow("On failure", self.on_failure)
        self.keep = QLineEdit("" if info.keep is None else keep_text(info.keep))
        self.keep.setPlaceholderText("the farm's default, or e.g. 3d, 12h")
        self.keep.setToolTip("How long this queue's finished jobs and their runs are kept before they are deleted")
        form.addRow("Keep", self.keep)
        self._per_key(info, form)
        self.error = _finish_form(self, layout, form, "Set")

    def _per_key(self, info: QueueInfo, form: QFormLayout) -> None:
        """Fair share, the limit and rate per fairness key, and where keyless jobs take their key, under a title."""
        title = QLabel("Per fairness key (a tenant, a customer)", objectName="sectionTitle")
        title.setContentsMargins(0, 6, 0, 0)
        form.addRow(title)
        self.fair = QCheckBox("take the keys in turn, by weight")
        self.fair.setChecked(info.fair)
        self.fair.setToolTip(
            "Its claims share the farm across its jobs' fairness keys by weight, so a flood of one key waits "
            "behind a few jobs of another; off: by priority, then age"
        )
        form.addRow("Fair share", self.fair)
        self.key_limit = QLineEdit("" if info.key_limit is None else str(info.key_limit))
        self.key_limit.setPlaceholderText("none, or e.g. 3")
        self.key_limit.setToolTip("Most units (the jobs' costs, 1 each unless given) of one key running at once")
        form.addRow("Limit per key", self.key_limit)
        self.key_rate = QLineEdit("" if info.key_rate is None else str(info.key_rate))
        self.key_rate.setPlaceholderText("none, or e.g. 5/s, 100/min")
        self.key_rate.setToolTip("Most units of one key started per second, minute or hour, each key its own bucket")
        form.addRow("Rate per key", self.key_rate)
        self.fair_from = QComboBox()
        self.fair_from.setEditable(True)
        self.fair_from.addItems(list(dict.fromkeys(["", ORDER_KEY, info.fair_from or ""])))
        self.fair_from.setCurrentText(info.fair_from or "")
        self.fair_from.lineEdit().setPlaceholderText("none, order_key or payload.FIELD")
        self.fair_from.setToolTip(
            "Where a job enqueued without a fairness key takes one: its order key, or a top-level field of its "
            "JSON payload (payload.FIELD); none: it has none"
        )
        form.addRow("Keys from", self.fair_from)

    def accept(self) -> None:
        try:
            limit, rate, keep = self.limit.text().strip(), self.rate.text().strip(), self.keep.text().strip()
            key_limit, key_rate = self.key_limit.text().strip(), self.key_rate.text().strip()
            source = self.fair_from.currentText().strip()
            wanted = {
                "limit": check_limit(_whole(limit)) if limit else None,
                "rate": Rate.parse(rate) if rate else None,
                "on_failure": self.on_failure.currentData(),
                "keep": check_keep(keep) if keep else None,
                "fair": self.fair.isChecked(),
                "key_limit": check_limit(_whole(key_limit), "key_limit") if key_limit else None,
                "key_rate": Rate.parse(key_rate, "key_rate") if key_rate else None,
                "fair_from": check_fair_from(source or None),
            }
        except QPError as error:
            self.error.setText(in_form_terms(error))
            return
        self.changes = {key: value for key, value in wanted.items() if value != getattr(self.info, key)}
        super().accept()


def _finish_form(dialog: QDialog, layout: QVBoxLayout, form: QFormLayout, verb: str) -> QLabel:
    """Put the form, the line its refusals show in (returned) and the `verb`/Cancel buttons into the dialog."""
    layout.addLayout(form)
    error = QLabel("", objectName="error")
    error.setWordWrap(True)
    layout.addWidget(error)
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
    buttons.button(QDialogButtonBox.StandardButton.Ok).setText(verb)
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    layout.addWidget(buttons)
    return error


def _whole(text: str) -> int | str:
    """Typed digits as the number they spell; anything else as it is, for the core's check to refuse by name."""
    try:
        return int(text)
    except ValueError:
        return text


# The forms' name for each Farm keyword an error may be about (errors.InputError.inputs).
FIELDS = {
    "priority": "Priority",
    "delay": "Delay",
    "max_attempts": "Max attempts",
    "timeout": "Timeout",
    "count": "Copies",
    "payload": "Payload",
    "queue": "Queue",
    "order_key": "Order key",
    "key": "Unique key",
    "key_scope": "Key held",
    "key_until": "Held until",
    "key_for": "Held after success",
    "on_conflict": "On conflict",
    "debounce": "Debounce",
    "max_delay": "Max delay",
    "limit": "Limit",
    "rate": "Rate",
    "keep": "Keep",
    "key_limit": "Limit per key",
    "key_rate": "Rate per key",
    "fair_from": "Keys from",
}


def in_form_terms(error: QPError) -> str:
    """The core's one-line refusal, naming each field as the form labels it."""
    return error.say(lambda keyword: f"“{FIELDS.get(keyword, keyword)}”")


def confirm(parent: QWidget, name: str, question: str, detail: str, verb: str, then) -> QMessageBox:
    """Ask before an action that is hard to undo, without blocking (the window keeps drawing): `then()` runs
    only if the operator picks `verb`; Cancel is the default."""
    box = QMessageBox(
        QMessageBox.Icon.Question,
        "QueueProcessor",
        question,
        QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
        parent,
    )
    box.setObjectName(name)
    box.setInformativeText(detail)
    box.setStyleSheet("QLabel#qt_msgbox_informativelabel { min-width: 24em; }")  # else a short question wraps it
    box.setDefaultButton(QMessageBox.StandardButton.Cancel)
    box.button(QMessageBox.StandardButton.Yes).setText(verb)
    box.buttonClicked.connect(lambda button: box.standardButton(button) == QMessageBox.StandardButton.Yes and then())
    box.open()
    return box


def about(parent: QWidget, database: str) -> None:
    box = QMessageBox(parent)
    box.setWindowTitle("About QueueProcessor")
    box.setIconPixmap(theme.icon("app").pixmap(64, 64))
    box.setTextFormat(Qt.TextFormat.RichText)
    box.setText(
        f"<h3>QueueProcessor {__version__}</h3>"
        "<p>A farm of servers sharing one SQL database drains a job queue together: "
        "they take turns polling it in time slots of database time, claim jobs under leases "
        "with fencing tokens, and recover the work of machines that die.</p>"
        f"<p>Database: <code>{mask(database)}</code></p>"
        "<p>MIT licence.</p>"
    )
    box.exec()
