"""The Queues tab: every named queue with its counts, limits and serving machines, and its jobs over time.

A table on top (waiting, running, limit, rate and the rate its claims allow now, its breaker's state, its flow
control per fairness key, order keys, failure policy, the live machines serving it) and below it a small chart per
queue, with, beside the charts, the busiest keys of the selected queue when it has flow control per key. A queue
no live machine serves is flagged: its jobs are accepted but wait until a
machine that serves it joins. Right-click a queue (in the table or on its
chart) to pause, resume or edit its limit and rate. Like the Schedules tab,
it never touches the database: an action is a call of the window's `Commands`
(run on the worker thread), and the next snapshot shows its effect. The charts' stored history (docs/app.md) is
read the same way: when the window opens, when the operator picks another span, and once a minute; the busiest
keys when a queue is selected, and again every KEYS_EVERY seconds of snapshots while it stays selected on screen.
"""

import math
from dataclasses import fields

from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QMenu, QSplitter, QVBoxLayout, QWidget

from queueprocessor.rules.breaker import SHUT, rate_text
from queueprocessor.rules.queues import QueueInfo
from queueprocessor.rules.states import SERVING

from . import text, theme
from .commands import Commands
from .dialogs import QueueDialog
from .models import ROW_ROLE, Column, Mark, SnapshotModel, capped, dot, marked
from .onscreen import OnScreen
from .queuecharts import DEFAULT_SPAN, SPANS, QueueCharts
from .queuekeys import KeysPanel, keyed, per_key, source_text
from .queuestate import QueueState
from .readonly import refuse
from .snapshot import Snapshot
from .tables import table

SHOWN_NAMES = 3  # serving machines named in the table; the rest are counted (all are in the tooltip)
HISTORY_EVERY = 60.0  # seconds of database time between reads of the stored history (a new row a minute)
KEYS_EVERY = 2.0  # seconds of database time between reads of the selected queue's busiest keys


def row_of(info: QueueInfo, caps: dict[str, dict[str, int]]) -> dict:
    """The table's row for a queue: its fields, its state and the serving machines' own limits for it (`caps`:
    each live machine's by its name), as a plain dict (the model compares rows to repaint only those that
    changed)."""
    return {f.name: getattr(info, f.name) for f in fields(info)} | {
        "state": QueueState.of(info),
        "caps": {name: caps[name][info.name] for name in info.serving if info.name in caps.get(name, {})},
    }


def _machines(row: dict, shown: int | None = None) -> str:
    """The serving machines, each with its own limit for the queue, the first `shown` of them (the rest
    counted)."""
    serving = row["serving"][:shown]
    more = len(row["serving"]) - len(serving)
    return ", ".join(capped(name, row["caps"].get(name)) for name in serving) + (f" +{more}" if more else "")


def _optional(value) -> str:
    return "none" if value is None else str(value)


def _breaker(row: dict) -> str:
    """A breaker's cell: its state and the failures counted toward its setting ("open", "closed · 2/5 in 60s")."""
    if row["breaker"] is None:
        return "none"
    if row["breaker_state"] != "closed":
        return row["breaker_state"]
    failures, window = row["breaker"].split("/")
    return f"closed · {row['failures']}/{failures} in {window}"


def _rate_now(row: dict) -> str:
    """The rate its claims allow now, marked when an adaptive rate or a breaker's ramp lowered it."""
    if row["current_rate"] is None:
        return "none"
    lowered = row["rate"] is not None and row["current_rate"] < row["rate"].per_second * (1 - 1e-9)
    return rate_text(row["current_rate"]) + (" ↓" if lowered else "")


def _per_key_tip(row: dict, _context) -> str | None:
    """The queue's flow control per key in full, and where its keyless jobs take their key."""
    said = ["fair share: its claims take the keys in turn, by weight"] if row["fair"] else []
    if row["key_limit"] is not None:
        said.append(f"at most {row['key_limit']} units of one key running at once")
    if row["key_rate"] is not None:
        said.append(f"one key starts at most {row['key_rate']} units")
    if row["fair_from"] is not None:
        said.append(f"jobs enqueued without a fairness key take {source_text(row['fair_from'])}")
    text = "; ".join(said)
    return text[:1].upper() + text[1:] or None


def _shut_or_lowered(info: QueueInfo) -> bool:
    """Is there something for a reset to undo: its breaker not closed, or its rate below the configured one?"""
    lowered = info.rate is not None and (info.current_rate or 0.0) < info.rate.per_second * (1 - 1e-9)
    return info.breaker_state not in (None, "closed") or lowered


def _queue_tip(row: dict, _context) -> str | None:
    if row["breaker_state"] in SHUT:
        return (
            f"{row['name']}'s breaker is {row['breaker_state']}: its claims stop but for one canary job each "
            f"{row['cool_down']:g} s; a canary that passes ramps its rate back up (queue reset-breaker closes it)"
        )
    if row["state"] is QueueState.UNSERVED:
        return (
            f"No live machine serves {row['name']}: its {row['waiting']:,} waiting jobs start when a node "
            f"serving it joins (--queues {row['name']}, or no --queues for every queue)"
        )
    if row["state"] is QueueState.PAUSED:
        return f"{row['name']} is paused: its running jobs finish and nothing new starts until it is resumed"
    return None


# Unserved queues stand out as dead machines do; paused ones as paused schedules do.
MARKS = {QueueState.UNSERVED: Mark.ALARM, QueueState.PAUSED: Mark.PAUSED}


def _mark(row: dict) -> Mark | None:
    """An open or half-open breaker stands out as a queue nobody serves does: its jobs wait."""
    return Mark.ALARM if row["breaker_state"] in SHUT else MARKS.get(row["state"])


class QueuesModel(SnapshotModel):
    """Every queue, by name."""

    key = "name"
    columns = [
        Column("Queue", lambda r, c: r["name"]),
        Column(
            "State",
            lambda r, c: r["state"],
            icon=dot(theme.QUEUE_STATE, "state"),
            tip="active; paused (running jobs finish, nothing new starts); unserved (no live machine serves it: "
            "its jobs wait)",
        ),
        Column("Waiting", lambda r, c: f"{r['waiting']:,}", "waiting", True, "Jobs queued, due or not"),
        Column("Running", lambda r, c: f"{r['running']:,}", "running", True),
        Column(
            "Limit",
            lambda r, c: _optional(r["limit"]),
            lambda r, c: r["limit"] or 0,
            True,
            "Most jobs of this queue running at once across the whole farm",
        ),
        Column(
            "Rate",
            lambda r, c: _optional(r["rate"]),
            lambda r, c: r["rate"].per_second if r["rate"] else 0.0,
            True,
            "Most starts of this queue's jobs per second, minute or hour, farm-wide",
        ),
        Column(
            "Rate now",
            lambda r, c: _rate_now(r),
            lambda r, c: r["current_rate"] or 0.0,
            True,
            "What its claims allow now, per second: its rate, or lower (↓) while throttled endings keep it down "
            "(adaptive) or its breaker ramps it back up",
        ),
        Column(
            "Breaker",
            lambda r, c: _breaker(r),
            icon=dot(theme.BREAKER_STATE, "breaker_state"),
            tip="closed (failures counted within its window); open (its claims stop); half-open (one canary job "
            "per cool-down); ramp (a canary passed: its rate comes back by steps)",
        ),
        Column(
            "Per key",
            lambda r, c: per_key(r["fair"], r["key_limit"], r["key_rate"]),
            tip="Flow control per fairness key (a tenant, a customer): fair (its claims take the keys in turn, by "
            "weight); ≤N (at most N units of one key running at once); N/s (at most N units of one key started per "
            "second, minute or hour); -: none. Select the queue to see its busiest keys",
            cell_tip=_per_key_tip,
        ),
        Column(
            "Order keys",
            lambda r, c: f"{r['order_keys_waiting']:,}",
            "order_keys_waiting",
            True,
            "Order keys with jobs waiting: each key's jobs run one at a time, in enqueue order",
        ),
        Column(
            "On failure",
            lambda r, c: r["on_failure"],
            tip="block: a job that failed for good holds its order key; skip: the next job of its key runs",
        ),
        Column(
            "Serving",
            lambda r, c: _machines(r, SHOWN_NAMES) or "none",
            lambda r, c: len(r["serving"]),
            tip="Live machines that take this queue's jobs; ≤N: that machine's own limit of them at once "
            "(its --queues NAME:N)",
            cell_tip=lambda r, c: _machines(r) or None,
        ),
    ]
    row_styles = marked(_mark, _queue_tip)


class QueuesView(QWidget):
    def __init__(self, commands: Commands, watch_only: bool = False, parent=None):
        super().__init__(parent)
        self.commands = commands
        self.watch_only = watch_only
        self.refusal: str | None = None  # why the farm may not be changed from here (the window's, readonly.py)
        self.queues: dict[str, QueueInfo] = {}
        self.menu: QMenu | None = None
        self.dialog: QueueDialog | None = None
        self.model = QueuesModel(self)
        # Order keys and On failure hidden at first, so that the rest fits the app's default window.
        self.table = table(
            self.model,
            (120, 96, 70, 70, 56, 70, 80, 110, 130, 80, 76, 110),
            order=Qt.SortOrder.AscendingOrder,
            menu=self._table_menu,
            hidden=(9, 10),
        )
        self.table.setToolTip(
            "Right-click a queue to pause, resume or change its limit and rate; right-click a column title to show "
            "or hide columns (Order keys, On failure)"
        )
        self.charts = QueueCharts()
        self.charts.menu_requested.connect(self.show_menu)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.table)
        lower = QWidget()
        box = QVBoxLayout(lower)
        box.setContentsMargins(0, 4, 0, 0)
        self.caption = QLabel(objectName="muted")
        self.span = QComboBox(objectName="chartSpan")
        for seconds, label, _step in SPANS:
            self.span.addItem(label, seconds)
        self.span.setCurrentIndex(self.span.findData(DEFAULT_SPAN))
        self.span.setToolTip("How far back the charts reach: the farm keeps each queue's history (stats)")
        self.span.currentIndexChanged.connect(lambda _: self.read_history())
        # Database time the last read was asked at (None: at the next snapshot's; inf: none asked yet).
        self._history_asked: float | None = math.inf
        heading = QHBoxLayout()
        heading.addWidget(self.caption, 1)
        heading.addWidget(self.span)
        box.addLayout(heading)
        # The selected queue's busiest keys stand beside the charts (hidden for a queue without flow per key).
        self.keys = KeysPanel()
        self.keys.hide()
        beside = QHBoxLayout()
        beside.addWidget(self.charts, 1)
        beside.addWidget(self.keys)
        box.addLayout(beside, 1)
        split.addWidget(lower)
        split.setSizes([200, 320])
        layout.addWidget(split)
        self.split = split
        self._keys_asked: tuple[str, float] | None = None  # the queue whose keys were last asked for, and when
        self.drawing = OnScreen(self, self._draw)
        self.table.selectionModel().selectionChanged.connect(self._selection_changed)

    # -- showing ----------------------------------------------------------------

    def show_snapshot(self, snapshot: Snapshot) -> None:
        """Keep a sample of every queue, hidden or not; draw the charts while on screen."""
        self.queues = {info.name: info for info in snapshot.queues}
        caps = {m["name"]: m["caps"] for m in snapshot.machines if m["status"] in SERVING}
        self.model.set_rows([row_of(info, caps) for info in snapshot.queues])
        self.charts.add(snapshot.db_now, snapshot.queues)
        if self._history_asked is None:
            self._history_asked = snapshot.db_now
        elif snapshot.db_now - self._history_asked >= HISTORY_EVERY:
            self.read_history(snapshot.db_now)
        self.drawing.show(snapshot)

    def read_history(self, now: float | None = None) -> None:
        """Ask the worker for the stored history of the span picked; the charts draw it from the next snapshot."""
        span = self.span.currentData()
        step = next(step for seconds, _label, step in SPANS if seconds == span)
        self._history_asked = now
        self.commands.read_history(span, step, lambda rows: self.charts.load(span, rows))

    def _draw(self, snapshot: Snapshot) -> None:
        since = self.charts.draw(snapshot.db_now, snapshot.queues)
        self.caption.setText(
            f"Jobs waiting and running per queue since {text.clock(since, millis=False)} "
            f"({text.duration(self.charts.reach)} at most) · dashed line: the farm-wide limit"
        )
        self._follow_keys(snapshot.db_now)

    # -- the busiest keys ---------------------------------------------------------

    def selected(self) -> str | None:
        """The name of the queue selected in the table, if any."""
        rows = self.table.selectionModel().selectedRows()
        return rows[0].data(ROW_ROLE)["name"] if rows else None

    def _selection_changed(self, *_) -> None:
        if self.drawing.latest is not None and self.isVisible():
            self._follow_keys(self.drawing.latest.db_now)

    def _follow_keys(self, now: float) -> None:
        """Show the busiest keys of the selected queue if it has flow control per key (else hide them), read at
        once for a queue newly selected, then again once `now` (database time) is KEYS_EVERY past the last read."""
        name = self.selected()
        info = self.queues.get(name) if name is not None else None
        if info is None or not keyed(info):
            self.keys.hide()
            self._keys_asked = None
            return
        self.keys.follow(info)
        self.keys.show()
        asked = self._keys_asked
        if asked is None or asked[0] != info.name or now - asked[1] >= KEYS_EVERY:
            self._keys_asked = (info.name, now)
            self.commands.read_queue_keys(info.name, lambda keys: self.keys.show_keys(info.name, keys))

    def restyle(self) -> None:
        self.charts.restyle()
        self.drawing.redraw()

    # -- the context menu -------------------------------------------------------

    def _table_menu(self, position: QPoint) -> None:
        index = self.table.indexAt(position)
        if index.isValid():
            self.table.selectRow(index.row())
            self.show_menu(index.data(ROW_ROLE)["name"], self.table.viewport().mapToGlobal(position))

    def show_menu(self, name: str, where: QPoint) -> None:
        """Pause, Resume, Limit and rate, and Reset the breaker for one queue, at a global position."""
        info = self.queues.get(name)
        if info is None:
            return
        menu = QMenu(self)
        menu.setObjectName("queueMenu")
        for icon, label, enabled, slot in (
            ("pause", f"Pause queue {name}", not info.paused, lambda: self.commands.pause_queue(name)),
            ("resume", f"Resume queue {name}", info.paused, lambda: self.commands.resume_queue(name)),
            ("limit", f"Limit and rate of {name}…", True, lambda: self.edit(info)),
            (
                "resume",
                f"Reset the breaker of {name}",
                _shut_or_lowered(info),
                lambda: self.commands.reset_breaker(name),
            ),
        ):
            action = menu.addAction(theme.icon(icon), label)
            action.setEnabled(enabled and not self.watch_only)
            action.triggered.connect(slot)
        if self.refusal:
            menu.setToolTipsVisible(True)
            refuse(menu.actions(), self.refusal)
        menu.popup(where)
        self.menu = menu

    def edit(self, info: QueueInfo) -> None:
        """Ask for the queue's limit, rate and failure policy, starting from `info` (what the operator saw when
        asking); set what they changed."""
        dialog = QueueDialog(info, self)
        dialog.setObjectName("queueDialog")
        dialog.accepted.connect(lambda: self._set(info.name, dialog.changes))
        dialog.open()
        self.dialog = dialog

    def _set(self, name: str, changes: dict) -> None:
        if changes:
            self.commands.set_queue(name, changes)
