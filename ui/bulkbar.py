"""The jobs filter bar's "All matching" button: retry, cancel or delete every job the filter picks, however many.

The count is asked of the worker first and confirmed by the operator (a QMessageBox that does not block); the
action then runs on the worker in batches (Farm.act_on_jobs), its progress shown here with a Stop button that ends
it between two batches. Signals carry the worker's news to this widget, queued to the GUI thread.
"""

import threading
from collections.abc import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QMenu, QMessageBox, QProgressBar, QPushButton, QToolButton, QWidget

from queueprocessor.rules.search import BulkAction, JobFilter

from .commands import Commands
from .dialogs import confirm

# What each action says: its menu entry, the question's verb, and what the jobs it changed are.
WORDS = {
    BulkAction.RETRY: ("Retry all matching…", "Retry", "queued again"),
    BulkAction.CANCEL: ("Cancel all matching…", "Cancel", "cancelled or asked to stop"),
    BulkAction.DELETE: ("Delete all matching (finished)…", "Delete", "deleted"),
}
WHICH = {
    BulkAction.RETRY: "failed or cancelled",
    BulkAction.CANCEL: "queued or running (running ones are stopped by their machine within a heartbeat)",
    BulkAction.DELETE: "finished, with their runs; this cannot be undone",
}


TIP = "Retry, cancel or delete every job the filters pick, not only those listed"


class BulkBar(QWidget):
    counted = Signal(object, object, int)  # action, filter, how many jobs it would change (from the worker)
    moved = Signal(int)  # jobs changed so far (from the worker)
    ended = Signal()  # the action ended: done, stopped or failed (from the worker)

    def __init__(self, commands: Commands, current: Callable[[], JobFilter], writable: bool, parent=None):
        """`current()`: the filter the jobs table shows now."""
        super().__init__(parent)
        self.commands, self.current = commands, current
        self.stopping = threading.Event()
        self.question: QMessageBox | None = None  # the last confirmation asked (the tests answer it)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.button = QToolButton(text="All matching", objectName="allMatching")
        self.button.setToolTip(TIP)
        self.button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.menu = QMenu(self.button)
        for action, (label, _, _) in WORDS.items():
            self.menu.addAction(label).triggered.connect(lambda _=False, a=action: self.ask(a))
        self.button.setMenu(self.menu)
        self.button.setEnabled(writable)
        self.progress = QProgressBar(objectName="bulkProgress")
        self.stop = QPushButton("Stop", objectName="bulkStop")
        self.stop.setToolTip("Stop after the batch under way: every job is changed whole or not at all")
        self.stop.clicked.connect(self.stopping.set)
        for widget in (self.button, self.progress, self.stop):
            layout.addWidget(widget)
        self._show_running(False)
        self.counted.connect(self._confirm)
        self.moved.connect(self.progress.setValue)
        self.ended.connect(lambda: self._show_running(False))

    def _show_running(self, running: bool) -> None:
        self.progress.setVisible(running)
        self.stop.setVisible(running)
        self.button.setVisible(not running)

    def refuse(self, why: str | None) -> None:
        """Disabled, saying `why`, while the farm is read-only (readonly.py); else offered."""
        self.button.setEnabled(not why)
        self.button.setToolTip(f"Read-only: {why}" if why else TIP)

    def ask(self, action: BulkAction) -> None:
        """Count on the worker what `action` would change; the answer comes back as `counted`."""
        where = self.current()

        def count(farm) -> str:
            found = farm.count_jobs(action, where)
            self.counted.emit(action, where, found)
            return f"{found:,} matching jobs can be changed"

        self.commands.run(f"Count jobs to {action}", count)

    def _confirm(self, action: BulkAction, where: JobFilter, found: int) -> None:
        _, verb, _ = WORDS[action]
        if not found:
            self.commands.run(f"{verb} all matching", lambda _farm: f"no matching job to {action}")
            return
        self.question = confirm(
            self.window(),
            "confirmBulk",
            f"{verb} {found:,} job{'' if found == 1 else 's'}?",
            f"Every job that matches {where.describe()} and is {WHICH[action]}.",
            verb,
            lambda: self._start(action, where, found),
        )

    def _start(self, action: BulkAction, where: JobFilter, found: int) -> None:
        self.stopping.clear()
        self.progress.setRange(0, found)
        self.progress.setValue(0)
        self._show_running(True)
        _, verb, done = WORDS[action]

        def act(farm) -> str:
            try:
                changed = farm.act_on_jobs(
                    action, where, everything=True, stop=self.stopping.is_set, progress=self.moved.emit
                )
            finally:
                self.ended.emit()
            return f"{changed:,} jobs {done}" + (" before Stop" if self.stopping.is_set() else "")

        self.commands.run(f"{verb} all matching", act)
