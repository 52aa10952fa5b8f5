"""The Events tab: the farm's log of what happened and who did it (docs/app.md), newest first.

Machines joining, leaving, judged dead, fencing themselves and steered; queues and schedules changed; bulk
actions; outages a node noticed. The log is read on the worker thread (Commands.read_events) when the tab
opens, every few seconds of database time after, and whenever the operator picks another kind or span; what it
read also marks the turn-slot timeline (SlotsTimeline.show_events). It never touches the database itself.
"""

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from queueprocessor.rules.events import FAMILIES
from queueprocessor.rules.output import format_time

from . import text
from .commands import Commands
from .models import Column, SnapshotModel, full_text
from .snapshot import Snapshot
from .tables import table

SPANS = ((3600, "last hour"), (86400, "last day"), (7 * 86400, "last week"), (30 * 86400, "last 30 days"))
DEFAULT_SPAN = 86400
EVERY = 5.0  # seconds of database time between reads while the window is open


class EventsModel(SnapshotModel):
    """Every event read, by id."""

    key = "id"
    columns = [
        Column(
            "When",
            lambda r, c: text.stamp(r["at"]),
            "at",
            tip="In your time zone, from the database's clock",
            cell_tip=lambda r, c: f"{format_time(r['at'])} UTC",
        ),
        Column("Kind", lambda r, c: r["kind"], tip="What happened (events --kind takes a kind or its first part)"),
        Column("Subject", lambda r, c: r["subject"], tip="What it happened to: a machine (name #id), queue, schedule"),
        Column("Detail", lambda r, c: r["detail"] or "", cell_tip=full_text("detail")),
        Column("By", lambda r, c: r["actor"] or "", tip="Who did it: a machine, or a program on a host (its pid)"),
    ]


class EventsView(QWidget):
    events_read = Signal(object)  # the events just read (list of dicts), for the timeline's marks

    def __init__(self, commands: Commands, parent=None):
        super().__init__(parent)
        self.commands = commands
        self.model = EventsModel(self)
        self.table = table(self.model, (170, 130, 160, 360, 220), stretch=3, order=Qt.SortOrder.DescendingOrder)
        self.kind = QComboBox(objectName="eventKind")
        self.kind.addItem("every kind", None)
        for family in FAMILIES:
            self.kind.addItem(family, family)
        self.span = QComboBox(objectName="eventSpan")
        for seconds, label in SPANS:
            self.span.addItem(label, seconds)
        self.span.setCurrentIndex(self.span.findData(DEFAULT_SPAN))
        for box in (self.kind, self.span):
            box.currentIndexChanged.connect(lambda _: self.read())
        self.caption = QLabel(objectName="muted")
        bar = QHBoxLayout()
        bar.addWidget(QLabel("Show"))
        bar.addWidget(self.kind)
        bar.addWidget(self.span)
        bar.addWidget(self.caption, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addLayout(bar)
        layout.addWidget(self.table, 1)
        self._asked: float | None = None  # database time of the last read (None: none yet)

    def show_snapshot(self, snapshot: Snapshot) -> None:
        """Read the log again once EVERY seconds of database time have passed since the last read."""
        if self._asked is None or snapshot.db_now - self._asked >= EVERY:
            self._asked = snapshot.db_now
            self.read()

    def read(self) -> None:
        self.commands.read_events(self.span.currentData(), self.kind.currentData(), self.show_events)

    def show_events(self, rows: list[dict]) -> None:
        self.model.set_rows(rows)
        self.caption.setText(f"{len(rows):,} event{'' if len(rows) == 1 else 's'}")
        self.events_read.emit(rows)
