"""The enqueue dialog's unique key with what `enqueue --key` takes beside it: how long the key is held (its scope,
until a time, for a period after success), what a second job of a held key does (on conflict), and a debounce
with its maximum delay. The fields only gather what the operator chose: the core's work_spec checks it whole (a
scope, a conflict policy or a debounce without a key is refused in its one line, as on the command line)."""

from PySide6.QtCore import QDateTime
from PySide6.QtWidgets import QCheckBox, QComboBox, QDateTimeEdit, QDoubleSpinBox, QFormLayout, QHBoxLayout, QLineEdit

SCOPES = (
    ("kept", "while its job is kept (the default)"),
    ("waiting", "while its job waits"),
    ("unfinished", "while its job is unfinished"),
)
CONFLICTS = (
    ("reject", "refuse the new job (the default)"),
    ("existing", "answer with the job holding the key"),
    ("replace", "replace the waiting job's payload and time"),
)
DAY = 86400.0


def _seconds(tip: str, maximum: float = 365 * DAY) -> QDoubleSpinBox:
    """A number of seconds where 0 means none."""
    box = QDoubleSpinBox(minimum=0, maximum=maximum, decimals=1, suffix=" s")
    box.setSpecialValueText("none")
    box.setToolTip(tip)
    return box


class KeyFields:
    """The rows under the dialog's "Unique key" field; `options()` gives them as JobOptions' keywords (None where
    the operator left the default, so a job without a key gets exactly what it got before)."""

    def __init__(self, form: QFormLayout, key: QLineEdit):
        self.key = key
        self.scope = QComboBox()
        for value, said in SCOPES:
            self.scope.addItem(said, value)
        self.scope.setToolTip(
            "How long the key is held against a second job with it: while its job's row is kept (until it is "
            "deleted), while it waits to start, or until it has ended"
        )
        form.addRow("Key held", self.scope)
        until = QHBoxLayout()
        self.until_on = QCheckBox("and until")
        self.until = QDateTimeEdit(QDateTime.currentDateTime().addSecs(3600))
        self.until.setCalendarPopup(True)
        self.until.setDisplayFormat("yyyy-MM-dd HH:mm:ss")
        self.until.setEnabled(False)
        self.until_on.toggled.connect(self.until.setEnabled)
        self.until_on.setToolTip("Held while its job is unfinished and until this time (your time zone)")
        until.addWidget(self.until_on)
        until.addWidget(self.until, 1)
        form.addRow("Held until", until)
        self.held_for = _seconds("Held this long after its job succeeds (none: not after it ends)")
        form.addRow("Held after success", self.held_for)
        self.on_conflict = QComboBox()
        for value, said in CONFLICTS:
            self.on_conflict.addItem(said, value)
        self.on_conflict.setToolTip("What a new job with a key already held does")
        form.addRow("On conflict", self.on_conflict)
        self.debounce = _seconds(
            "Each enqueue of the key moves its waiting job's time this far ahead of now (none: no debounce)"
        )
        form.addRow("Debounce", self.debounce)
        self.max_delay = _seconds("A debounced job's time never moves past its first enqueue plus this (none: no cap)")
        form.addRow("Max delay", self.max_delay)

    def options(self) -> dict:
        """The chosen values as enqueue keywords; a default is None (left out)."""
        scope, conflict = self.scope.currentData(), self.on_conflict.currentData()
        return {
            "key_scope": None if scope == SCOPES[0][0] else scope,
            "key_until": float(self.until.dateTime().toSecsSinceEpoch()) if self.until_on.isChecked() else None,
            "key_for": self.held_for.value() or None,
            "on_conflict": None if conflict == CONFLICTS[0][0] else conflict,
            "debounce": self.debounce.value() or None,
            "max_delay": self.max_delay.value() or None,
        }
