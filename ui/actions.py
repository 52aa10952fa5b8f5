"""The window's actions (menu items, toolbar buttons, shortcuts) and the menus and toolbar that show them.

Each action is made once here, with its words, icon, shortcut and tip; the
window connects what it does and when it is enabled. "This machine" is in the
node actions' labels because the Schedules tab has Pause and Resume buttons of
its own.
"""

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu

from queueprocessor.views import GONE_AFTER

from . import localkill, theme

SCHEMES = (("auto", "Follow the &System"), ("light", "&Light"), ("dark", "&Dark"))


def _action(
    window: QMainWindow, name: str, label: str, icon: str | None, shortcut, tip: str, checkable: bool = False
) -> QAction:
    action = QAction(label, window)
    action.setObjectName(name)
    if icon:
        action.setIcon(theme.icon(icon))
        action.setData(icon)  # the window's restyle() redraws the icon in the new scheme's colours
    if shortcut:
        action.setShortcut(QKeySequence(shortcut))
        tip = f"{tip} ({action.shortcut().toString(QKeySequence.SequenceFormat.NativeText)})"
    action.setToolTip(tip)
    action.setStatusTip(tip)
    action.setCheckable(checkable)
    window.addAction(action)
    return action


class Actions:
    def __init__(self, window: QMainWindow):
        def a(*args, **kwargs):
            return _action(window, *args, **kwargs)

        self.open = a(
            "open", "&Open Database…", "database", QKeySequence.StandardKey.Open, "Watch another farm database"
        )
        self.quit = a("quit", "&Quit", "quit", QKeySequence.StandardKey.Quit, "Stop this machine's node and quit")
        self.enqueue = a("enqueue", "&Enqueue Job…", "enqueue", "Ctrl+N", "Add an HTTP job to the queue")
        self.retry = a("retry", "&Retry Jobs", "retry", "Ctrl+R", "Queue the selected failed or cancelled jobs again")
        self.cancel = a(
            "cancel", "&Cancel Jobs", "cancel", "Ctrl+Del", "Cancel the selected queued jobs, and stop the running ones"
        )
        self.delete = a(
            "delete", "De&lete Jobs", "delete", "Shift+Del", "Delete the selected finished jobs with their runs"
        )
        self.pause = a(
            "pause",
            "&Pause This Machine",
            "pause",
            "Ctrl+Shift+P",
            "Pause this machine: take its node out of the turns; it keeps its running jobs",
        )
        self.resume = a(
            "resume",
            "Res&ume This Machine",
            "resume",
            "Ctrl+Shift+R",
            "Resume this machine: put its node back into the turns",
        )
        self.drain = a(
            "drain",
            "&Drain This Machine…",
            "drain",
            "Ctrl+Shift+D",
            "Drain this machine: its node finishes its running jobs, takes no new ones, then stops (asks first)",
        )
        self.start = a(
            "start",
            "&Start This Machine",
            "resume",
            None,
            "Start this machine's node again after it stopped: it rejoins the turns",
        )
        self.follow = a(
            "follow",
            "&Follow Now",
            "follow",
            "End",
            "Jump to database time and keep the plots scrolling with it; drag or zoom a plot to look back",
            checkable=True,
        )
        # End: only while a plot has the focus (the plots add the action), so End in a table still goes to its
        # last row.
        window.removeAction(self.follow)
        self.follow.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.follow.setChecked(True)
        self.refresh = a("refresh", "Re&fresh", "refresh", QKeySequence.StandardKey.Refresh, "Read the database now")
        self.gone = a(
            "gone",
            "Show &Long-Gone Machines",
            None,
            None,
            f"Also list machines that stopped or died more than {GONE_AFTER / 60:g} minutes ago",
            checkable=True,
        )
        # Node ▸ Kill a Machine on This Host: its items (this host's other nodes) are made as it is about to show.
        self.kill = QMenu("&Kill a Machine on This Host", window)
        self.kill.setObjectName("killMenu")
        self.kill.setToolTipsVisible(True)
        self.kill.menuAction().setToolTip(localkill.tip("another machine on this host"))
        if why := localkill.unsupported():
            self.kill.menuAction().setToolTip(f"Not here: {why}")
            self.kill.menuAction().setEnabled(False)
        self.tour = a("tour", "&Tour", None, None, "What the demo farm shows and what to try")
        self.about = a("about", "&About QueueProcessor", "about", None, "Version and licence")
        for action in (*self.node, self.retry, self.cancel, self.delete):
            action.setEnabled(False)

    @property
    def writers(self) -> list[QAction]:
        """Every action that changes the farm: disabled, saying why, while the farm is read-only (readonly.py)."""
        return [self.enqueue, self.retry, self.cancel, self.delete, *self.node, self.kill.menuAction()]

    @property
    def node(self) -> list[QAction]:
        """This machine's node: Pause, Resume, Drain, Start (the node panel's buttons too)."""
        return [self.pause, self.resume, self.drain, self.start]

    def show_in(self, window: QMainWindow, dock: QAction, scheme: str, choose_scheme) -> QMenu:
        """Put the actions in the window's menus and toolbar, with `dock` (show the node panel) and the colour
        schemes (`scheme` checked; `choose_scheme(choice)` on a pick). Returns the Open Recent menu, which the
        window fills when it opens."""
        bar = window.menuBar()
        file = bar.addMenu("&File")
        file.addAction(self.open)
        recent = file.addMenu("Open &Recent")
        file.addSeparator()
        file.addAction(self.quit)
        bar.addMenu("&Jobs").addActions([self.enqueue, self.retry, self.cancel, self.delete])
        node = bar.addMenu("&Node")
        node.setToolTipsVisible(True)  # the kill menu's, when it is disabled, says why
        node.addActions(self.node)
        node.addSeparator()
        node.addMenu(self.kill)
        view = bar.addMenu("&View")
        view.addActions([self.follow, self.refresh, self.gone, dock])
        schemes = view.addMenu("&Appearance")
        group = QActionGroup(window)
        for choice, label in SCHEMES:
            action = schemes.addAction(label)
            action.setCheckable(True)
            action.setChecked(choice == scheme)
            action.triggered.connect(lambda _=False, c=choice: choose_scheme(c))
            group.addAction(action)
        bar.addMenu("&Help").addActions([self.tour, self.about])

        tools = window.addToolBar("Main")
        tools.setObjectName("mainToolBar")
        tools.setMovable(False)
        tools.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        for action in (
            self.enqueue,
            self.retry,
            self.cancel,
            None,
            self.pause,
            self.resume,
            self.drain,
            None,
            self.follow,
            self.refresh,
        ):
            tools.addSeparator() if action is None else tools.addAction(action)
        return recent
