"""Home and End in the app's tables go to the first and last row, as in a list.

The tables select whole rows, so QTableView's own Home and End (to the first and last column) only scroll
sideways; an operator pressing End in the jobs table wants the oldest job.
"""

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QTableView


class _RowKeys(QObject):
    def eventFilter(self, view, event) -> bool:
        if (
            event.type() != QEvent.Type.KeyPress
            or event.key() not in (Qt.Key.Key_Home, Qt.Key.Key_End)
            or event.modifiers() != Qt.KeyboardModifier.NoModifier
        ):
            return False
        rows = view.model().rowCount()
        if rows:
            index = view.model().index(
                0 if event.key() == Qt.Key.Key_Home else rows - 1, max(0, view.currentIndex().column())
            )
            view.setCurrentIndex(index)
            view.scrollTo(index)
        return True


def home_end_by_rows(view: QTableView) -> None:
    view.installEventFilter(_RowKeys(view))
