"""Draw only while on screen: most plots sit behind a tab at any moment, and drawing them costs far more than a
poll, so a hidden view keeps only the latest data and draws that once, when it is shown."""

from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QWidget

from .snapshot import Snapshot


class OnScreen(QObject):
    """Hands `draw` the latest data while `widget` is visible; while it is hidden, when it is next shown."""

    def __init__(self, widget: QWidget, draw: Callable[[Snapshot], None]):
        super().__init__(widget)
        self.widget = widget
        self.draw = draw
        self.latest: Snapshot | None = None
        self.stale = False  # the latest data is not drawn yet
        widget.installEventFilter(self)

    def show(self, data: Snapshot) -> None:
        """New data: drawn now if the widget is on screen, else when it is shown (older data is never drawn)."""
        self.latest, self.stale = data, True
        if self.widget.isVisible():
            self.flush()

    def redraw(self) -> None:
        """Draw the latest data again (after a change of style or range), now or when shown."""
        if self.latest is not None:
            self.show(self.latest)

    def flush(self) -> None:
        """Draw the latest data if it is not drawn yet: on showing, or before telling what is plotted."""
        if self.stale:
            self.stale = False
            self.draw(self.latest)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Show:
            self.flush()
        return False
