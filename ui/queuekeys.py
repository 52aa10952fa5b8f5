"""The busiest fairness keys of the queue selected in the Queues tab, for a queue with flow control per key (fair
share, a limit or a rate per key: docs/design.md §9, "Seeing the keys").

The panel only shows what `Farm.queue_keys` returned (read on the worker thread by the Queues tab, see
queuesview.py): each key's units running, out of the limit per key if there is one, its jobs waiting and, with a
rate per key, the tokens its bucket holds now.
"""

from dataclasses import asdict

from PySide6.QtWidgets import QHeaderView, QLabel, QVBoxLayout, QWidget

from queueprocessor.rules.fairness import KeyUse
from queueprocessor.rules.queues import QueueInfo, Rate

from .models import Column, SnapshotModel, full_text
from .tables import table

TOKENS = 3  # the column of the tokens, shown only for a queue with a rate per key
WIDTH = 340  # pixels of the panel, beside the charts


def keyed(info: QueueInfo) -> bool:
    """Has the queue any flow control per fairness key?"""
    return info.fair or info.key_limit is not None or info.key_rate is not None


def per_key(fair: bool, key_limit: int | None, key_rate: Rate | None) -> str:
    """A queue's flow control per key in a few words: "fair", "≤3 per key", "5/s per key", "fair · ≤3 · 5/s"; "-"
    for none."""
    said = ["fair"] if fair else []
    said += [f"≤{key_limit}"] if key_limit is not None else []
    said += [str(key_rate)] if key_rate is not None else []
    if len(said) == 1 and not fair:
        return f"{said[0]} per key"
    return " · ".join(said) or "-"


def source_text(fair_from: str) -> str:
    """Where a queue takes a keyless job's fairness key, in words."""
    field = fair_from.removeprefix("payload.")
    return "their order key" if field == fair_from else f"their payload's field “{field}”"


def _running(row: dict, context: dict) -> str:
    limit = context.get("limit")
    return f"{row['running']:,}/{limit:,}" if limit else f"{row['running']:,}"


class KeysModel(SnapshotModel):
    """A queue's busiest keys, in the farm's order (most units running, then most waiting); `context["limit"]`:
    its limit per key."""

    key = "key"
    columns = [
        Column(
            "Key",
            lambda r, c: r["key"],
            tip="A fairness key of the queue's jobs (a tenant, a customer)",
            cell_tip=full_text("key"),
        ),
        Column(
            "Running",
            _running,
            numeric=True,
            tip="Units its running jobs hold (each job's cost, 1 unless given), out of the limit per key",
        ),
        Column("Waiting", lambda r, c: f"{r['waiting']:,}", numeric=True, tip="Its jobs queued, due or not"),
        Column(
            "Tokens",
            lambda r, c: "–" if r["tokens"] is None else f"{r['tokens']:.1f}",
            numeric=True,
            tip="Units its bucket lets start now; it refills at the rate per key (below 0: a job that cost more "
            "than the bucket holds is being paid back)",
        ),
    ]


class KeysPanel(QWidget):
    """A heading and a small table of one queue's busiest keys; `queue` is the queue it shows (None: none)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.queue: str | None = None
        self.model = KeysModel(self)
        self.table = table(self.model, (0, 0, 0, 0))
        header = self.table.horizontalHeader()  # the numbers as wide as they read, the key the rest
        header.setStretchLastSection(False)
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.title = QLabel(objectName="sectionTitle")
        self.caption = QLabel(objectName="muted")
        self.caption.setWordWrap(True)
        self.hint = QLabel(objectName="muted")
        self.hint.setWordWrap(True)
        box = QVBoxLayout(self)
        box.setContentsMargins(8, 0, 0, 0)
        box.setSpacing(2)
        for widget, stretch in ((self.title, 0), (self.caption, 0), (self.table, 1), (self.hint, 0)):
            box.addWidget(widget, stretch)
        box.addStretch(0)  # the room of the table, while it is hidden
        self.hint.hide()
        self.setFixedWidth(WIDTH)

    def follow(self, info: QueueInfo) -> None:
        """Show queue `info` with its settings as they are now (a queue new to the panel starts empty)."""
        if info.name != self.queue:
            self.queue = info.name
            self.model.set_rows([])
            self.hint.hide()
            self.table.show()
        self.title.setText(f"Busiest keys of {info.name}")
        source = f"; keyless jobs take {source_text(info.fair_from)}" if info.fair_from else ""
        self.caption.setText(f"{per_key(info.fair, info.key_limit, info.key_rate)}{source}")
        self.table.setColumnHidden(TOKENS, info.key_rate is None)
        if self.model.context.get("limit") != info.key_limit:
            self.model.set_rows(self.model.rows, {"limit": info.key_limit})

    def show_keys(self, queue: str, keys: list[KeyUse]) -> None:
        """What a read of `queue`'s keys returned, unless the panel has moved to another queue since it was asked."""
        if queue != self.queue:
            return
        self.model.set_rows([asdict(use) for use in keys], self.model.context)
        self.hint.setText(f"No job of {queue} has a fairness key running or waiting")
        self.hint.setVisible(not keys)
        self.table.setVisible(bool(keys))
