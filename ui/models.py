"""Thin Qt table models over the plain rows of a dashboard snapshot.

A model keeps the snapshot's rows as they are and only says how each column
reads, sorts and is coloured. `set_rows` keeps selections alive: when the keys
are unchanged only the cells are refreshed; otherwise the model resets. Models
sort their rows in Python with each column's key (one call per row), rather
than letting a proxy compare cells through data() (two calls per comparison).
"""

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtGui import QColor

from . import text, theme

ROW_ROLE = Qt.ItemDataRole.UserRole
RIGHT = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter


@dataclass(frozen=True)
class Column:
    title: str
    show: Callable[[dict, dict], str]
    sort: Callable[[dict, dict], object] | None = None
    numeric: bool = False
    tip: str = ""


class SnapshotModel(QAbstractTableModel):
    columns: list[Column] = []
    key = "id"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[dict] = []
        self.context: dict = {}
        self._keys: list = []
        self.sort_column: int | None = None
        self.descending = False

    def sort(self, column: int, order=Qt.SortOrder.AscendingOrder) -> None:
        self.sort_column, self.descending = column, order == Qt.SortOrder.DescendingOrder
        self.beginResetModel()
        self.rows = self._sorted(self.rows)
        self._keys = [row[self.key] for row in self.rows]
        self.endResetModel()

    def _sorted(self, rows: list[dict]) -> list[dict]:
        if self.sort_column is None:
            return rows
        column = self.columns[self.sort_column]
        key = column.sort or column.show
        return sorted(rows, key=lambda row: key(row, self.context), reverse=self.descending)

    def set_rows(self, rows: list[dict], context: dict | None = None) -> None:
        """Show `rows`; `context` is what cells may need beyond their row (db time, machine names)."""
        self.context = context or {}
        rows = self._sorted(rows)
        keys = [row[self.key] for row in rows]
        if keys == self._keys:
            self.rows = rows
            if rows:
                self.dataChanged.emit(self.index(0, 0), self.index(len(rows) - 1, len(self.columns) - 1))
            return
        self.beginResetModel()
        self.rows, self._keys = rows, keys
        self.endResetModel()

    def rowCount(self, parent=QModelIndex()):
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=QModelIndex()):
        return 0 if parent.isValid() else len(self.columns)

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation != Qt.Orientation.Horizontal:
            return None
        column = self.columns[section]
        if role == Qt.ItemDataRole.DisplayRole:
            return column.title
        if role == Qt.ItemDataRole.ToolTipRole and column.tip:
            return column.tip
        if role == Qt.ItemDataRole.TextAlignmentRole and column.numeric:
            return RIGHT
        return None

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row, column = self.rows[index.row()], self.columns[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            return column.show(row, self.context)
        if role == ROW_ROLE:
            return row
        if role == Qt.ItemDataRole.TextAlignmentRole and column.numeric:
            return RIGHT
        return self.style(row, index.column(), role)

    def style(self, row: dict, column: int, role):
        """Colours, icons and tooltips; subclasses say which rows stand out."""
        return None


def _offset(row: dict, _context) -> str:
    if row["clock_offset"] is None:
        return "not measured"
    return f"{text.ms(row['clock_offset'], signed=True)} ± {text.ms(row['error_bound'])}"


def _rate(row: dict, context: dict) -> str:
    counts = context.get("throughput", {}).get(row["id"], {})
    minutes = context.get("history", 600.0) / 60
    return f"{sum(counts.values()) / minutes:.1f}"


class PeersModel(SnapshotModel):
    """Every machine of the farm, as judged from the database's point of view."""

    columns = [
        Column("Machine", lambda r, c: r["name"], tip="Machine name (the node's --name)"),
        Column("Host", lambda r, c: r["host"]),
        Column("State", lambda r, c: r["status"],
               tip="active, paused, draining, stopped, or dead (stopped checking in)"),
        Column("Leader", lambda r, c: "★ now" if r["leader"] else "", lambda r, c: not r["leader"],
               tip="The machine whose turn slot it is now"),
        Column("Clock offset", _offset, lambda r, c: abs(r["clock_offset"] or 0),
               tip="Database time minus the machine's wall clock, ± the estimate's error bound"),
        Column("Round trip", lambda r, c: text.ms(r["rtt"]), lambda r, c: r["rtt"] or 0, True,
               "Round trip of the machine's best clock sample"),
        Column("Last seen", lambda r, c: text.ago(c["db_now"] - r["last_seen"]),
               lambda r, c: c["db_now"] - r["last_seen"], True, "Time since the machine's last check-in"),
        Column("Capacity", lambda r, c: str(r["capacity"]), lambda r, c: r["capacity"], True),
        Column("Running", lambda r, c: str(r["running"]), lambda r, c: r["running"], True),
        Column("Done", lambda r, c: str(r["done_count"]), lambda r, c: r["done_count"], True,
               "Runs this machine finished successfully since it started"),
        Column("Failed", lambda r, c: str(r["failed_count"]), lambda r, c: r["failed_count"], True,
               "Runs that failed or timed out on this machine since it started"),
        Column("Runs/min", _rate, lambda r, c: float(_rate(r, c)), True,
               "Finished runs per minute over the last ten minutes (database's run log)"),
    ]

    def style(self, row: dict, column: int, role):
        scheme = theme.current()
        dead = row["status"] == "dead"
        unsynced = not row["synced"] and row["status"] not in ("stopped", "dead")
        if role == Qt.ItemDataRole.BackgroundRole:
            if dead:
                return QColor(scheme.dead_bg)
            if unsynced:
                return QColor(scheme.unsynced_bg)
        if role == Qt.ItemDataRole.DecorationRole and column == 0:
            return theme.dot(theme.MACHINE_STATE[row["status"]])
        if role == Qt.ItemDataRole.ForegroundRole:
            if dead and column == 2:
                return QColor(theme.MACHINE_STATE["dead"])
            if row["status"] == "stopped":
                return QColor(scheme.muted)
        if role == Qt.ItemDataRole.ToolTipRole:
            if dead:
                silent = self.context["db_now"] - row["last_seen"]
                return f"{row['name']} has not checked in for {text.duration(silent)}"
            if unsynced:
                return (f"{row['name']}'s clock estimate is too loose ({_offset(row, None)}): "
                        "it may miss its turns")
            return f"machine {row['id']} · pid {row['pid']} · version {row['version']}"
        return None


class JobsModel(SnapshotModel):
    """Recent jobs, newest first."""

    columns = [
        Column("Job", lambda r, c: str(r["id"]), lambda r, c: r["id"], True),
        Column("State", lambda r, c: r["state"]),
        Column("Target", lambda r, c: f"{r['method']} {r['target']}"),
        Column("Attempts", lambda r, c: f"{r['attempts']}/{r['max_attempts']}", lambda r, c: r["attempts"], True),
        Column("Machine", lambda r, c: c["names"].get(r["owner"], "") if r["owner"] else "",
               tip="The machine that owns (or last owned) the job"),
        Column("Created", lambda r, c: text.clock(r["created_at"]), lambda r, c: r["created_at"]),
        Column("Finished", lambda r, c: text.clock(r["finished_at"]), lambda r, c: r["finished_at"] or 0),
        Column("Error", lambda r, c: (r["last_error"] or "").splitlines()[0][:120] if r["last_error"] else ""),
    ]

    def style(self, row: dict, column: int, role):
        if role == Qt.ItemDataRole.DecorationRole and column == 1:
            return theme.dot(theme.JOB_STATE.get(row["state"], theme.OUTCOME["cancelled"]))
        if role == Qt.ItemDataRole.ToolTipRole and column == 7 and row["last_error"]:
            return row["last_error"]
        return None


class AttemptsModel(SnapshotModel):
    """Every attempt (run) of one job, first attempt first."""

    columns = [
        Column("Attempt", lambda r, c: str(r["attempt"]), lambda r, c: r["attempt"], True),
        Column("Machine", lambda r, c: c["names"].get(r["machine_id"], f"#{r['machine_id']}")),
        Column("Fence", lambda r, c: str(r["fence"]), lambda r, c: r["fence"], True,
               "The fence token of this claim: every write by this attempt had to quote it"),
        Column("Started", lambda r, c: text.clock(r["started_at"])),
        Column("Finished", lambda r, c: text.clock(r["finished_at"])),
        Column("Took", lambda r, c: text.duration(r["finished_at"] - r["started_at"]) if r["finished_at"] else "",
               numeric=True),
        Column("Outcome", lambda r, c: r["outcome"]),
        Column("Error", lambda r, c: r["error"] or ""),
    ]

    def style(self, row: dict, column: int, role):
        if role == Qt.ItemDataRole.DecorationRole and column == 6:
            return theme.dot(theme.OUTCOME.get(row["outcome"], theme.OUTCOME["cancelled"]))
        if role == Qt.ItemDataRole.ToolTipRole and column == 7 and row["error"]:
            return row["error"]
        return None


class FilterProxy(QSortFilterProxyModel):
    """Filters rows on text in any column, case-insensitively; sorting is left to the source model."""

    def __init__(self, source: SnapshotModel, parent=None):
        super().__init__(parent)
        self.setSourceModel(source)
        self.setFilterKeyColumn(-1)
        self.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)

    def sort(self, column: int, order=Qt.SortOrder.AscendingOrder) -> None:
        self.sourceModel().sort(column, order)
