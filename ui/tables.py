"""How the app's tables look and behave: whole rows, read-only, sized to their titles, sortable and
right-clickable where asked; a right-click on the header shows or hides columns (Qt saves that with the header's
state, so the choice outlives the app)."""

from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject, QPoint, Qt
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QMenu, QTableView


def table(
    model,
    widths: tuple[int, ...],
    *,
    stretch: int | None = None,
    floor: int = 160,
    order: Qt.SortOrder | None = None,
    menu: Callable[[QPoint], None] | None = None,
    hidden: tuple[int, ...] = (),
) -> QTableView:
    """A read-only table of whole rows, its columns `widths` wide (at least their titles' width). `stretch`: the
    column that takes the width the others leave, but never less than `floor` pixels (then the columns after
    it scroll), else the last column stretches. `order`: sortable, first sorted on its first column so.
    `menu`: what a right-click at a (viewport) position opens. `hidden`: columns hidden until the operator shows
    them from the header's menu (the least needed, where all would not fit)."""
    view = QTableView()
    view.setModel(model)
    view.setAlternatingRowColors(True)
    view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    view.setShowGrid(False)
    view.setWordWrap(False)
    view.verticalHeader().hide()
    view.verticalHeader().setDefaultSectionSize(view.fontMetrics().height() + 10)
    header = view.horizontalHeader()
    header.setHighlightSections(False)
    header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)  # numbers say right
    header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
    header.setStretchLastSection(stretch is None)
    fit = _Stretch(view, stretch, floor).fit if stretch is not None else lambda: None
    _fit_columns(view, widths)
    for column in hidden:
        header.hideSection(column)
    header.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
    header.customContextMenuRequested.connect(
        lambda position: _columns_menu(view, fit).popup(header.mapToGlobal(position))
    )
    if order is not None:
        view.setSortingEnabled(True)
        view.sortByColumn(0, order)
    if menu is not None:
        view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        view.customContextMenuRequested.connect(menu)
    return view


class _Stretch(QObject):
    """Sizes a column to the room the other columns leave whenever the table is resized (Qt's own Stretch
    mode would squeeze it to nothing when the others fill the table)."""

    def __init__(self, view: QTableView, column: int, floor: int):
        super().__init__(view)
        self.view, self.column, self.floor = view, column, floor
        view.viewport().installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:
        if event.type() == QEvent.Type.Resize:
            self.fit()
        return False

    def fit(self) -> None:
        header = self.view.horizontalHeader()
        others = sum(
            header.sectionSize(c) for c in range(header.count()) if c != self.column and not header.isSectionHidden(c)
        )
        header.resizeSection(self.column, max(self.floor, self.view.viewport().width() - others))


def _columns_menu(view: QTableView, fit: Callable[[], None]) -> QMenu:
    """A check for each column, in the order shown, that shows or hides it (the first names the row: it stays);
    `fit` gives the stretching column the room that leaves."""
    header = view.horizontalHeader()
    menu = QMenu(view)
    menu.setObjectName("columnsMenu")
    menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)

    def show(column: int, shown: bool) -> None:
        header.setSectionHidden(column, not shown)
        fit()

    for logical in map(header.logicalIndex, range(header.count())):
        action = menu.addAction(view.model().headerData(logical, Qt.Orientation.Horizontal))
        action.setCheckable(True)
        action.setChecked(not header.isSectionHidden(logical))
        action.setEnabled(logical != 0)
        action.toggled.connect(lambda shown, column=logical: show(column, shown))
    return menu


def arrange(view: QTableView, order: tuple[int, ...]) -> None:
    """Show the model's columns in this order, left to right (the model keeps its own)."""
    header = view.horizontalHeader()
    for visual, logical in enumerate(order):
        header.moveSection(header.visualIndex(logical), visual)


def _fit_columns(view: QTableView, widths: tuple[int, ...]) -> None:
    """Give each column its width, but never less than its header needs (bold, plus the sort arrow)."""
    model, metrics = view.model(), view.horizontalHeader().fontMetrics()
    for column, width in enumerate(widths):
        title = model.headerData(column, Qt.Orientation.Horizontal) or ""
        view.setColumnWidth(column, max(width, int(metrics.horizontalAdvance(title) * 1.1) + 34))


def peers_table(model, menu: Callable[[QPoint], None]) -> QTableView:
    """The peers: Host and Round trip (Clock offset's ± comes from it) hidden at first, so the rest fits at 1440 px
    beside the dock; the queues a machine serves beside its state; `menu` on a right-click."""
    view = table(model, (120, 90, 80, 64, 160, 80, 84, 80, 56, 56, 60, 190), menu=menu, hidden=(1, 5))
    view.setToolTip(
        "Right-click a machine to pause, resume or drain it; right-click a column title "
        "to show or hide columns (Host, Round trip)"
    )
    arrange(view, (0, 1, 2, 11, *range(3, 11)))
    return view
