"""Thin Qt table models over the plain rows of a dashboard snapshot.

A model keeps the snapshot's rows as they are and only says how each column
reads, sorts and is coloured: a `Column` carries its own cell styles (an icon,
a text colour, a tooltip), and the model's `row_styles` say how a whole row
stands out (a cell style, where it has something to say, wins), so no style
picks its column by number. Every table marks its rows with the same `Mark`s
(alarm, warning, paused, gone), so a state looks the same wherever it shows.
`set_rows` updates the table in place: rows that left are removed, new ones
inserted, reordered ones moved in one layout change, and only rows whose
values changed are repainted, so selections and the scroll position survive a
refresh. Models sort their rows in Python with each column's key (one call per
row). `data()` is called for every role of every painted cell (seven calls a
cell), so it answers from plain ints and returns at once for the roles a model
does not style.
"""

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from operator import itemgetter, ne
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt

from queueprocessor.rules.kinds import work_said
from queueprocessor.rules.output import progress_text
from queueprocessor.rules.states import JobState, MachineState, Outcome

from . import text, theme
from .joblinks import waits_text

DISPLAY = int(Qt.ItemDataRole.DisplayRole)
DECORATION = int(Qt.ItemDataRole.DecorationRole)
TOOLTIP = int(Qt.ItemDataRole.ToolTipRole)
ALIGNMENT = int(Qt.ItemDataRole.TextAlignmentRole)
BACKGROUND = int(Qt.ItemDataRole.BackgroundRole)
FOREGROUND = int(Qt.ItemDataRole.ForegroundRole)
ROW_ROLE = int(Qt.ItemDataRole.UserRole)
RIGHT = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter


Style = Callable[[dict, dict], object]  # (row, context) -> the role's value, or None for nothing to say


@dataclass(frozen=True)
class Column:
    title: str
    show: Callable[[dict, dict], str]
    sort: Callable[[dict, dict], Any] | str | None = None  # a function of (row, context), or a row field
    numeric: bool = False
    tip: str = ""  # the header's tooltip
    icon: Style | None = None  # the cell's decoration, e.g. its state's dot
    colour: Style | None = None  # the cell's text colour (QColor)
    cell_tip: Style | None = None  # the cell's tooltip

    def style(self, role: int) -> Style | None:
        return {DECORATION: self.icon, FOREGROUND: self.colour, TOOLTIP: self.cell_tip}.get(role)


def dot(colours: dict[str, str], field: str) -> Style:
    """A cell icon: the dot of the row's `field` (a state) in its colour; grey for a state it does not know,
    none while the field is empty."""

    def icon(row: dict, _context):
        state = row[field]
        return None if state is None else theme.dot(colours.get(state, theme.OUTCOME[Outcome.CANCELLED]))

    return icon


def full_text(field: str) -> Style:
    """A cell tooltip: the whole of a text the cell shows cut to its first line."""
    return lambda row, _context: row[field] or None


class Mark(Enum):
    """How a whole row stands out, the same in every table: each table only says which of its rows get which."""

    ALARM = ("dead_bg", False)  # a dead machine, a queue no live machine serves
    WARNING = ("unsynced_bg", False)  # a machine whose clock estimate is too loose
    PAUSED = ("unsynced_bg", True)  # held by an operator: shaded, its text greyed
    GONE = (None, True)  # a stopped machine: greyed

    def __init__(self, background: str | None, muted: bool):
        self.background = background  # the Scheme colour behind the row
        self.muted = muted  # whether its text is greyed


def marked(mark: Callable[[dict], Mark | None], tip: Style) -> dict[int, Style]:
    """A model's row_styles: each row's background and text colour from its `mark` (None: as any row), and
    its tooltip."""

    def background(row: dict, _context):
        found = mark(row)
        return theme.colour(getattr(theme.current(), found.background)) if found and found.background else None

    def foreground(row: dict, _context):
        found = mark(row)
        if not (found and found.muted):
            return None
        scheme = theme.current()  # grey, but still readable on the row's shading (WCAG AA)
        return theme.colour(theme.readable(scheme.muted, getattr(scheme, found.background or "base")))

    return {BACKGROUND: background, FOREGROUND: foreground, TOOLTIP: tip}


def _blocks(rows: Iterable[int]) -> Iterator[tuple[int, int]]:
    """Ascending row numbers as (first, last) runs of consecutive rows."""
    run: list[int] = []  # the first and last row of the run being gathered
    for row in rows:
        if run and row == run[1] + 1:
            run[1] = row
            continue
        if run:
            yield run[0], run[1]
        run = [row, row]
    if run:
        yield run[0], run[1]


class SnapshotModel(QAbstractTableModel):
    columns: list[Column] = []
    key = "id"
    row_styles: dict[int, Style] = {}  # role: how a whole row stands out, where its cell has nothing to say
    _cells: dict[int, list[Style | None]]  # role: each column's style (see __init_subclass__)

    def __init_subclass__(cls, **kwargs):
        """Gather each styled role's cell styles, column by column, so data() looks a style up in one step."""
        super().__init_subclass__(**kwargs)
        roles = {role for column in cls.columns for role in (DECORATION, FOREGROUND, TOOLTIP) if column.style(role)}
        cls._cells = {role: [column.style(role) for column in cls.columns] for role in roles | set(cls.row_styles)}

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[dict] = []
        self.context: dict = {}
        self._keys: list = []
        self.sort_column: int | None = None
        self.descending = False

    def sort(self, column: int, order=Qt.SortOrder.AscendingOrder) -> None:
        self.sort_column, self.descending = column, order == Qt.SortOrder.DescendingOrder
        rows = self._sorted(self.rows)
        self._restructure(rows, [row[self.key] for row in rows])
        self.rows = rows

    def _sorted(self, rows: list[dict]) -> list[dict]:
        """A new list (the model edits its own in place), in the chosen column's order."""
        if self.sort_column is None:
            return list(rows)
        column = self.columns[self.sort_column]
        key = column.sort or column.show
        if isinstance(key, str):
            return sorted(rows, key=itemgetter(key), reverse=self.descending)
        return sorted(rows, key=lambda row: key(row, self.context), reverse=self.descending)

    def set_rows(self, rows: list[dict], context: dict | None = None) -> None:
        """Show `rows`; `context` is what cells may need beyond their row (db time, machine names)."""
        context = context or {}
        stale = context != self.context  # every cell may read differently
        self.context = context
        rows = self._sorted(rows)
        keys = [row[self.key] for row in rows]
        if keys != self._keys:
            self._restructure(rows, keys)
        shown, self.rows = self.rows, rows  # shown: what the table showed, row for row (new rows as they are)
        changed = range(len(rows)) if stale else [n for n, differs in enumerate(map(ne, shown, rows)) if differs]
        last_column = len(self.columns) - 1
        for first, last in _blocks(changed):
            self.dataChanged.emit(self.index(first, 0), self.index(last, last_column))

    def _restructure(self, rows: list[dict], keys: list) -> None:
        """Put the shown rows in the order of `keys`, taking new rows from `rows`, through row signals (not a
        reset). Rows already shown keep their old values, for set_rows to compare."""
        root = QModelIndex()
        wanted = set(keys)
        for first, last in reversed(list(_blocks(n for n, key in enumerate(self._keys) if key not in wanted))):
            self.beginRemoveRows(root, first, last)
            del self.rows[first : last + 1], self._keys[first : last + 1]
            self.endRemoveRows()
        kept = set(self._keys)
        new = [n for n, key in enumerate(keys) if key not in kept]
        if [key for key in keys if key in kept] == self._keys:
            # What stayed is in order (newest jobs on top, say): insert the newcomers in their places.
            for first, last in _blocks(new):
                self.beginInsertRows(root, first, last)
                self.rows[first:first] = rows[first : last + 1]
                self._keys[first:first] = keys[first : last + 1]
                self.endInsertRows()
            return
        # Reordered (sorted on a column whose values moved): newcomers at the end, then one layout change
        # that carries selections and the current row along with their rows.
        if new:
            end = len(self._keys)
            self.beginInsertRows(root, end, end + len(new) - 1)
            self.rows += [rows[n] for n in new]
            self._keys += [keys[n] for n in new]
            self.endInsertRows()
        self.layoutAboutToBeChanged.emit()
        position = {key: n for n, key in enumerate(keys)}
        old = self.persistentIndexList()
        self.changePersistentIndexList(old, [self.index(position[self._keys[i.row()]], i.column()) for i in old])
        shown = dict(zip(self._keys, self.rows))
        self.rows, self._keys = [shown[key] for key in keys], list(keys)
        self.layoutChanged.emit()

    def row_of(self, key) -> int | None:
        """The row showing `key`, or None."""
        try:
            return self._keys.index(key)
        except ValueError:
            return None

    def rowCount(self, parent=QModelIndex()):
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=QModelIndex()):
        return 0 if parent.isValid() else len(self.columns)

    def headerData(self, section, orientation, role=DISPLAY):
        if orientation != Qt.Orientation.Horizontal:
            return None
        column = self.columns[section]
        if role == DISPLAY:
            return column.title
        if role == TOOLTIP and column.tip:
            return column.tip
        if role == ALIGNMENT and column.numeric:
            return RIGHT
        return None

    def data(self, index, role=DISPLAY):
        if role == DISPLAY:
            return self.columns[index.column()].show(self.rows[index.row()], self.context)
        if role == ALIGNMENT:
            return RIGHT if self.columns[index.column()].numeric else None
        if role == ROW_ROLE:
            return self.rows[index.row()]
        cells = self._cells.get(role)
        if cells is None:
            return None
        row, cell = self.rows[index.row()], cells[index.column()]
        value = cell(row, self.context) if cell else None
        if value is None and role in self.row_styles:
            return self.row_styles[role](row, self.context)
        return value


def _offset(row: dict, _context) -> str:
    if row["clock_offset"] is None:
        return "not measured"
    return f"{text.ms(row['clock_offset'], signed=True)} ± {text.ms(row['error_bound'])}"


def _rate(row: dict, context: dict) -> str:
    counts = context.get("throughput", {}).get(row["id"], {})
    minutes = context.get("history", 600.0) / 60
    return f"{sum(counts.values()) / minutes:.1f}"


def capped(name: str, cap: int | None) -> str:
    """A queue or machine name with the machine's own limit for the queue (its --queues NAME:N), if it has one."""
    return name if cap is None else f"{name} ≤{cap}"


def served(row: dict) -> str:
    """The queues a machine serves (its --queues) with its own limits, as the peers table and the node panel say
    them."""
    return ", ".join(capped(queue, row["caps"].get(queue)) for queue in row["queues"]) or "every queue"


def _unsynced(row: dict) -> bool:
    """A live machine whose clock estimate is too loose to place itself in its slots."""
    return not row["synced"] and row["status"] not in (MachineState.STOPPED, MachineState.DEAD)


def _peer_mark(row: dict) -> Mark | None:
    if row["status"] == MachineState.DEAD:
        return Mark.ALARM
    if row["status"] == MachineState.STOPPED:
        return Mark.GONE
    return Mark.WARNING if _unsynced(row) else None


def _dead_in_red(row: dict, _context):
    """Red that reads on the dead row's shading."""
    if row["status"] != MachineState.DEAD:
        return None
    return theme.colour(theme.readable(theme.MACHINE_STATE[MachineState.DEAD], theme.current().dead_bg))


def _peer_tip(row: dict, context: dict) -> str:
    if row["status"] == MachineState.DEAD:
        return f"{row['name']} has not checked in for {text.duration(context['db_now'] - row['last_seen'])}"
    if _unsynced(row):
        return f"{row['name']}'s clock estimate is too loose ({_offset(row, None)}): it may miss its turns"
    return f"machine {row['id']} · pid {row['pid']} · version {row['version']}"


class PeersModel(SnapshotModel):
    """Every machine of the farm, as judged from the database's point of view."""

    columns = [
        Column(
            "Machine",
            lambda r, c: r["name"],
            tip="Machine name (the node's --name)",
            icon=dot(theme.MACHINE_STATE, "status"),
        ),
        Column("Host", lambda r, c: r["host"]),
        Column(
            "State",
            lambda r, c: r["status"],
            colour=_dead_in_red,
            tip="active, paused, draining, stopped, or dead (stopped checking in)",
        ),
        Column(
            "Leader",
            lambda r, c: "★ now" if r["leader"] else "",
            lambda r, c: not r["leader"],
            tip="The machine whose turn slot it is now",
        ),
        Column(
            "Clock offset",
            _offset,
            lambda r, c: abs(r["clock_offset"] or 0),
            tip="Database time minus the machine's wall clock, ± the estimate's error bound",
        ),
        Column(
            "Round trip",
            lambda r, c: text.ms(r["rtt"]),
            lambda r, c: r["rtt"] or 0,
            True,
            "Round trip of the machine's best clock sample",
        ),
        Column(
            "Last seen",
            lambda r, c: text.ago(c["db_now"] - r["last_seen"]),
            lambda r, c: c["db_now"] - r["last_seen"],
            True,
            "Time since the machine's last check-in",
        ),
        Column(
            "Running",
            lambda r, c: f"{r['running']} / {r['capacity']}",
            "running",
            True,
            "Jobs running / the machine's capacity (its --capacity), as of its last check-in",
        ),
        Column(
            "Done",
            lambda r, c: str(r["done_count"]),
            "done_count",
            True,
            "Runs this machine finished successfully since it started",
        ),
        Column(
            "Failed",
            lambda r, c: str(r["failed_count"]),
            "failed_count",
            True,
            "Runs that failed or timed out on this machine since it started",
        ),
        Column(
            "Runs/min",
            _rate,
            lambda r, c: float(_rate(r, c)),
            True,
            "Finished runs per minute over the last ten minutes (database's run log)",
        ),
        Column(
            "Queues",
            lambda r, c: served(r),
            cell_tip=lambda r, c: served(r),
            tip="The queues the machine takes jobs of (its --queues); every queue when it names none; "
            "≤N: its own limit of that queue's jobs at once",
        ),
    ]
    row_styles = marked(_peer_mark, _peer_tip)


class JobsModel(SnapshotModel):
    """Recent jobs, newest first."""

    columns = [
        Column("Job", lambda r, c: str(r["id"]), "id", True),
        Column(
            "State",
            lambda r, c: r["state"],
            icon=dot(theme.JOB_STATE, "state"),
            cell_tip=lambda r, c: (
                waits_text(r["waits_for"])
                if "waits_for" in r
                else (f"running · {said}" if (said := _running_progress(r)) else None)
            ),
        ),
        Column("Target", lambda r, c: work_said(r)),
        Column("Attempts", lambda r, c: f"{r['attempts']}/{r['max_attempts']}", "attempts", True),
        Column(
            "Machine",
            lambda r, c: c["names"].get(r["owner"], "") if r["owner"] else "",
            tip="The machine that owns (or last owned) the job",
        ),
        Column("Created", lambda r, c: text.clock(r["created_at"]), "created_at"),
        Column("Finished", lambda r, c: text.clock(r["finished_at"]), lambda r, c: r["finished_at"] or 0),
        Column(
            "Error",
            lambda r, c: (r["last_error"] or "").splitlines()[0][:120] if r["last_error"] else "",
            cell_tip=full_text("last_error"),
        ),
        Column(
            "Queue",
            lambda r, c: r["queue"],
            "queue",
            cell_tip=lambda r, c: f"order key {r['order_key']}" if r["order_key"] else None,
        ),
        Column(
            "Progress",
            lambda r, c: _running_progress(r),
            lambda r, c: -1.0 if (f := running_fraction(r)) is None else f,
            tip="How far a running job says it is (also drawn as a bar in its state cell)",
        ),
    ]


def running_fraction(row: dict) -> float | None:
    """How far a job is, while it runs and has said so (a finished job's last word is its run's, in the history)."""
    return row["progress"] if row["state"] == JobState.RUNNING else None


def _running_progress(row: dict) -> str:
    """What a running job last said of its progress, as text; nothing for a job not running or silent."""
    fraction = running_fraction(row)
    return "" if fraction is None else progress_text(fraction, row["progress_message"])


class AttemptsModel(SnapshotModel):
    """Every attempt (run) of one job, first attempt first."""

    columns = [
        Column("Attempt", lambda r, c: str(r["attempt"]), "attempt", True),
        Column("Machine", lambda r, c: c["names"].get(r["machine_id"], f"#{r['machine_id']}")),
        Column(
            "Fence",
            lambda r, c: str(r["fence"]),
            "fence",
            True,
            "The fence token of this claim: every write by this attempt had to quote it",
        ),
        Column("Started", lambda r, c: text.clock(r["started_at"])),
        Column("Finished", lambda r, c: text.clock(r["finished_at"])),
        Column(
            "Took",
            lambda r, c: text.duration(r["finished_at"] - r["started_at"]) if r["finished_at"] else "",
            numeric=True,
        ),
        Column("Outcome", lambda r, c: r["outcome"], icon=dot(theme.OUTCOME, "outcome")),
        Column("Error", lambda r, c: r["error"] or "", cell_tip=full_text("error")),
        Column(
            "Progress",
            lambda r, c: progress_text(r["progress"], r["progress_message"]) if r["progress"] is not None else "",
            tip="The last progress the attempt's job reported that its machine wrote",
        ),
    ]
