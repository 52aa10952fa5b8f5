"""The main window: the slots timeline on top; peers, job runs, the queue and schedules below; this node on the
left.

The window only ever draws snapshots. Reads and operators' actions go to the
Poller's thread; their results come back as signals. Closing the window stops
this machine's node on that thread and closes once it is done, so the window
never freezes, even with the database gone. A view that fails to draw a
snapshot is logged and reported; the other views still draw it.
"""

import logging
import time
from functools import partial

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import (QApplication, QDockWidget, QLabel, QMainWindow, QMenu, QSplitter, QTabWidget,
                               QVBoxLayout, QWidget)

from queueprocessor.database import mask

from . import text, theme
from .dialogs import DatabaseDialog, EnqueueDialog, about, confirm, needs_password, without_password
from .jobsview import JobsView, fit_columns, table
from .models import ROW_ROLE, PeersModel
from .nodepanel import NodePanel
from .poller import Poller
from .queuegraph import QueueGraph
from .schedulesview import SchedulesView
from .tablekeys import home_end_by_rows
from .timeline import SlotsTimeline

RECENT = 8
STALE = 3.0  # seconds without a snapshot before the connection shows as slow
CLOSE_GRACE = 15.0  # longest a close waits for the node to stop before leaving anyway

log = logging.getLogger("ui.mainwindow")


def remember(settings: QSettings, url: str) -> None:
    """Put a database first in the recent list (without its password)."""
    recent = [u for u in recent_databases(settings) if u != without_password(url)]
    settings.setValue("recent", [without_password(url), *recent][:RECENT])


def recent_databases(settings: QSettings) -> list[str]:
    value = settings.value("recent", [])
    return [value] if isinstance(value, str) else list(value or [])


class MainWindow(QMainWindow):
    closed = Signal()

    def __init__(self, url: str, node_options: dict | None, *, interval: float = 0.4):
        super().__init__()
        self.settings = QSettings()
        self.node_options = node_options
        self.interval = interval
        self.snap: dict | None = None
        self.node_id: int | None = None
        self.health_state, self.health_text = "connecting", "connecting"
        self.connection = "connecting"  # what the status bar shows: connecting, ok, slow, lost or error
        self.last_result: tuple[str, bool, str] | None = None
        self.worker_stopped: str | None = None  # why the worker ended when nobody asked it to
        self.refusal: str | None = None  # the database turned the login down: ask for it again
        self.poll_failure: tuple[float, str] | None = None  # the last unexpected error reading the farm
        self.broken: set[str] = set()  # views whose last update raised (logged once, until they recover)
        self._closing = self._closed = False
        self._next_url: str | None = None
        self.setWindowIcon(theme.icon("app"))
        self.setObjectName("QueueProcessorMain")
        self.setDockOptions(QMainWindow.DockOption.AnimatedDocks)

        self._make_actions()
        self._make_views()
        self._make_menus()
        self._make_status_bar()
        self._restore()

        self.ticker = QTimer(self)
        self.ticker.setInterval(100)
        self.ticker.timeout.connect(self._tick)
        self.ticker.start()
        self.banner_timer = self._timer(8000)
        self.banner_timer.timeout.connect(lambda: self.health_state == "ok" and not self.worker_stopped
                                          and self.banner.hide())
        self.close_timer = self._timer(int(CLOSE_GRACE * 1000))
        self.close_timer.timeout.connect(self._give_up_waiting)
        self.poller: Poller | None = None
        self._open(url)
        QApplication.instance().findChild(theme.Theme).changed.connect(self.restyle)

    # -- building -----------------------------------------------------------

    def _timer(self, msec: int) -> QTimer:
        timer = QTimer(self)
        timer.setSingleShot(True)
        timer.setInterval(msec)
        return timer

    def _action(self, name, label, icon=None, shortcut=None, tip="", slot=None, checkable=False) -> QAction:
        action = QAction(label, self)
        action.setObjectName(name)
        if icon:
            action.setIcon(theme.icon(icon))
            action.setData(icon)  # restyle() redraws the icon in the new scheme's colours
        if shortcut:
            action.setShortcut(QKeySequence(shortcut))
            tip = f"{tip} ({action.shortcut().toString(QKeySequence.SequenceFormat.NativeText)})"
        action.setToolTip(tip)
        action.setStatusTip(tip)
        action.setCheckable(checkable)
        if slot:
            action.triggered.connect(slot)
        self.addAction(action)
        return action

    def _make_actions(self) -> None:
        a = self._action
        self.act_open = a("open", "&Open Database…", "database", QKeySequence.StandardKey.Open,
                          "Watch another farm database", lambda: self.choose_database())
        self.act_quit = a("quit", "&Quit", "quit", QKeySequence.StandardKey.Quit,
                          "Stop this machine's node and quit", self.close)
        self.act_enqueue = a("enqueue", "&Enqueue Job…", "enqueue", "Ctrl+N", "Add an HTTP job to the queue",
                             self.enqueue)
        self.act_retry = a("retry", "&Retry Job", "retry", "Ctrl+R", "Queue the selected failed or cancelled job "
                           "again", self.retry)
        self.act_cancel = a("cancel", "&Cancel Job", "cancel", "Ctrl+Del", "Cancel the selected queued job, or stop "
                            "it if it is running", self.cancel)
        # "this machine" in every label: the Schedules tab has Pause and Resume buttons of its own.
        self.act_pause = a("pause", "&Pause This Machine", "pause", "Ctrl+Shift+P", "Pause this machine: take "
                           "its node out of the turns; it keeps its running jobs",
                           lambda: self.steer(self.node_id, "pause"))
        self.act_resume = a("resume", "Res&ume This Machine", "resume", "Ctrl+Shift+R", "Resume this machine: put "
                            "its node back into the turns", lambda: self.steer(self.node_id, "resume"))
        self.act_drain = a("drain", "&Drain This Machine…", "drain", "Ctrl+Shift+D", "Drain this machine: its node "
                           "finishes its running jobs, takes no new ones, then stops (asks first)",
                           lambda: self.drain(self.node_id))
        self.act_start = a("start", "&Start This Machine", "resume", None, "Start this machine's node again after "
                           "it stopped: it rejoins the turns", self.start_node)
        # End: only while a plot has the focus, so End in a table still goes to its last row.
        self.act_follow = a("follow", "&Follow Now", "follow", "End", "Jump to database time and keep the plots "
                            "scrolling with it; drag or zoom a plot to look back", self.follow_now, checkable=True)
        self.removeAction(self.act_follow)
        self.act_follow.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.act_follow.setChecked(True)
        self.act_refresh = a("refresh", "Re&fresh", "refresh", QKeySequence.StandardKey.Refresh,
                             "Read the database now", lambda: self.poller and self.poller.refresh())
        self.act_gone = a("gone", "Show &Long-Gone Machines", None, None,
                          "Also list machines that stopped or died more than ten minutes ago",
                          self._gone_toggled, checkable=True)
        self.act_about = a("about", "&About QueueProcessor", "about", None, "Version and licence",
                           lambda: about(self, self.url))
        for action in (self.act_pause, self.act_resume, self.act_drain, self.act_start, self.act_retry,
                       self.act_cancel):
            action.setEnabled(False)
        self.act_enqueue.setEnabled(not self.watch_only)

    @property
    def watch_only(self) -> bool:
        """--observe: no node here, and nothing this app does may change the farm (its database connection
        refuses writes too)."""
        return self.node_options is None

    def _make_views(self) -> None:
        self.timeline = SlotsTimeline()
        self.timeline.follow_changed.connect(self.act_follow.setChecked)
        self.peers = PeersModel(self)
        self.peers_view = table(self.peers)
        self.peers_view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.peers_view.customContextMenuRequested.connect(self._peer_menu)
        self.peers_view.setToolTip("Right-click a machine to pause, resume or drain it")
        fit_columns(self.peers_view, (120, 90, 80, 64, 160, 80, 84, 60, 60, 56, 56, 60))
        self.jobs = JobsView()
        self.jobs.gantt.plot.setXLink(self.timeline.plot)
        self.jobs.gantt.manually_moved.connect(lambda: self.timeline.set_follow(False))
        for plot in (self.timeline, self.jobs.gantt):
            plot.addAction(self.act_follow)
        self.jobs.job_selected.connect(self._job_selected)
        self.jobs.state_filter_changed.connect(lambda state: self._query(jobs_state=state))
        self.jobs.text_filter_changed.connect(lambda text: self._query(jobs_text=text))
        self.jobs.table.doubleClicked.connect(lambda _: self.jobs.details.setFocus())
        self.queue = QueueGraph()
        self.timeline.follow_changed.connect(self.queue.set_follow)
        self.queue.manually_moved.connect(lambda: self.timeline.set_follow(False))
        self.schedules = SchedulesView(self.watch_only)
        self.schedules.act.connect(lambda label, action: self.poller and self.poller.act(label, action))

        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(False)
        self.tabs.addTab(self.peers_view, "Peers")
        self.tabs.addTab(self.jobs, "Job runs")
        self.tabs.addTab(self.queue, "Queue")
        self.tabs.addTab(self.schedules, "Schedules")
        self.tabs.currentChanged.connect(lambda _: self._update_actions())

        self.banner = QLabel("", objectName="banner")
        self.banner.setWordWrap(True)
        self.banner.hide()
        central = QWidget()
        box = QVBoxLayout(central)
        box.setContentsMargins(6, 6, 6, 0)
        box.addWidget(self.banner)
        self.split = QSplitter(Qt.Orientation.Vertical)
        self.split.addWidget(self.timeline)
        self.split.addWidget(self.tabs)
        self.split.setStretchFactor(0, 2)
        self.split.setStretchFactor(1, 3)
        box.addWidget(self.split)
        self.setCentralWidget(central)

        self.node_panel = NodePanel([self.act_pause, self.act_resume, self.act_drain, self.act_start])
        self.node_dock = QDockWidget("This machine", self)
        self.node_dock.setObjectName("nodeDock")
        self.node_dock.setWidget(self.node_panel)
        self.node_dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable
                                   | QDockWidget.DockWidgetFeature.DockWidgetClosable)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, self.node_dock)
        if self.node_options is None:
            self.node_panel.observe_only()
        for view in self._tables().values():
            home_end_by_rows(view)

    def _make_menus(self) -> None:
        bar = self.menuBar()
        file = bar.addMenu("&File")
        file.addAction(self.act_open)
        self.recent_menu = file.addMenu("Open &Recent")
        self.recent_menu.aboutToShow.connect(self._fill_recent)
        file.addSeparator()
        file.addAction(self.act_quit)
        jobs = bar.addMenu("&Jobs")
        for action in (self.act_enqueue, self.act_retry, self.act_cancel):
            jobs.addAction(action)
        node = bar.addMenu("&Node")
        for action in (self.act_pause, self.act_resume, self.act_drain, self.act_start):
            node.addAction(action)
        view = bar.addMenu("&View")
        view.addAction(self.act_follow)
        view.addAction(self.act_refresh)
        view.addAction(self.act_gone)
        view.addAction(self.node_dock.toggleViewAction())
        schemes = view.addMenu("&Appearance")
        group = QActionGroup(self)
        current = QApplication.instance().findChild(theme.Theme).choice
        for choice, label in (("auto", "Follow the &System"), ("light", "&Light"), ("dark", "&Dark")):
            action = schemes.addAction(label)
            action.setCheckable(True)
            action.setChecked(choice == current)
            action.triggered.connect(lambda _=False, c=choice: self.set_scheme(c))
            group.addAction(action)
        bar.addMenu("&Help").addAction(self.act_about)

        tools = self.addToolBar("Main")
        tools.setObjectName("mainToolBar")
        tools.setMovable(False)
        tools.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        for action in (self.act_enqueue, self.act_retry, self.act_cancel, None, self.act_pause, self.act_resume,
                       self.act_drain, None, self.act_follow, self.act_refresh):
            tools.addSeparator() if action is None else tools.addAction(action)
        self.toolbar = tools

    def _make_status_bar(self) -> None:
        bar = self.statusBar()
        self.db_label = QLabel()
        self.db_label.setToolTip("The farm database (password hidden)")
        self.health_label = QLabel()
        self.farm_label = QLabel()
        self.clock_label = QLabel()
        self.clock_label.setToolTip("The database's clock (its time zone shown as yours)")
        bar.addWidget(self.db_label)
        bar.addWidget(self.health_label)
        bar.addPermanentWidget(self.farm_label)
        bar.addPermanentWidget(self.clock_label)

    # -- settings -------------------------------------------------------------

    def _restore(self) -> None:
        geometry = self.settings.value("window/geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        else:
            self.resize(1360, 860)
        state = self.settings.value("window/state")
        if state is not None:
            self.restoreState(state)
        split = self.settings.value("window/split")
        if split is not None:
            self.split.restoreState(split)
        else:
            self.split.setSizes([290, 560])
        self.act_gone.setChecked(self.settings.value("view/gone", False, type=bool))
        self.tabs.setCurrentIndex(self.settings.value("view/tab", 0, type=int))
        for key, view in self._tables().items():
            header = self.settings.value(f"columns/{key}")
            if header is not None and view.horizontalHeader().restoreState(header) and view.isSortingEnabled():
                view.sortByColumn(view.horizontalHeader().sortIndicatorSection(),
                                  view.horizontalHeader().sortIndicatorOrder())

    def _tables(self) -> dict:
        """The tables whose column widths and sort order outlive the app."""
        return {"peers": self.peers_view, "jobs": self.jobs.table, "schedules": self.schedules.schedules_view,
                "singletons": self.schedules.singletons_view}

    def _save(self) -> None:
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.setValue("window/state", self.saveState())
        self.settings.setValue("window/split", self.split.saveState())
        self.settings.setValue("view/gone", self.act_gone.isChecked())
        self.settings.setValue("view/tab", self.tabs.currentIndex())
        for key, view in self._tables().items():
            self.settings.setValue(f"columns/{key}", view.horizontalHeader().saveState())
        self.settings.sync()

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        for url in recent_databases(self.settings):
            self.recent_menu.addAction(mask(url), lambda u=url: self.open_recent(u))
        if self.recent_menu.isEmpty():
            self.recent_menu.addAction("(none yet)").setEnabled(False)

    # -- the worker -------------------------------------------------------------

    def _open(self, url: str) -> None:
        self.url = url
        self.snap = None
        self.worker_stopped = self.refusal = self.poll_failure = None
        self.banner.hide()
        self.setWindowTitle(f"QueueProcessor — {mask(url)}")
        self.db_label.setText(mask(url))
        self.poller = Poller(url, self.node_options, self.interval)
        self.poller.set_query(keep_gone=1e12 if self.act_gone.isChecked() else 600.0)
        self.poller.opened.connect(self._opened)
        self.poller.snapshot.connect(self.show_snapshot)
        self.poller.health.connect(self._health)
        self.poller.refused.connect(lambda reason: setattr(self, "refusal", reason))
        self.poller.failed.connect(self._failed)
        self.poller.done.connect(self._action_done)
        self.poller.finished.connect(partial(self._worker_finished, self.poller))
        self._sync_window()
        self.poller.start()

    def _opened(self, info: dict) -> None:
        self.node_id = info["node_id"]
        remember(self.settings, self.url)
        self._update_actions()

    def _health(self, state: str, reason: str) -> None:
        self.health_state, self.health_text = state, reason
        if state in ("lost", "error") and self.snap is not None:
            as_of = text.clock(self.snap["db_now"], millis=False)
            self._show_banner(f"{reason}. Showing the farm as of {as_of}.")
        elif state == "error":
            self._show_banner(reason)
        elif state == "ok":
            self.banner.hide()
        self._show_health()

    def _show_banner(self, message: str) -> None:
        self.banner.setText(message)
        self.banner.setStyleSheet(f"background: {theme.current().dead_bg}; padding: 6px 10px; border-radius: 6px;")
        self.banner.show()

    def _failed(self, what: str, reason: str) -> None:
        """A bug, not the database: tell the user what failed; the worker goes on."""
        self.poll_failure = (time.monotonic(), f"{what} failed: {reason}")
        self._show_banner(f"{what} failed: {reason} (details in the log); still trying.")
        self.banner_timer.start()

    def _show_health(self) -> None:
        state, reason = self.health_state, self.health_text
        if self.worker_stopped:
            state, reason = "error", "background worker stopped"
        colour = {"ok": theme.MACHINE_STATE["active"], "lost": theme.MACHINE_STATE["dead"],
                  "error": theme.MACHINE_STATE["dead"]}.get(state, theme.MACHINE_STATE["stopped"])
        if state == "ok" and self.snap is not None:
            age = time.monotonic() - self.snap["mono"]
            failure = self.poll_failure
            if age > STALE and failure and failure[0] > self.snap["mono"]:
                state, colour, reason = "error", theme.MACHINE_STATE["dead"], failure[1]
            elif age > STALE:
                state, colour = "slow", theme.MACHINE_STATE["paused"]
                reason = f"slow: no answer for {age:.0f} s"
            else:
                reason = f"connected · read {self.snap['read_ms']:.0f} ms"
        self.health_label.setText(f"<span style='color:{colour}'>●</span> {reason}")
        self.health_label.setToolTip({"ok": "The database answers", "slow": "The database is slow to answer",
                                      "lost": "The database does not answer; retrying"}.get(state, reason))
        self.connection = state

    def _action_done(self, label: str, ok: bool, message: str) -> None:
        self.last_result = (label, ok, message)
        self.statusBar().showMessage(f"{label}: {message}" if ok else f"{label} failed: {message}", 8000)
        if not ok:
            self._show_banner(f"{label} failed: {message}")
            self.banner_timer.start()

    def _query(self, **changes) -> None:
        if self.poller:
            self.poller.set_query(**changes)
            self.poller.refresh()

    def _sync_window(self) -> None:
        """Tell the worker which stretch of database time the plots show."""
        window = self.timeline.window()
        if window is None:
            wanted = dict(since=None, until=None, span=self.timeline.span + 2, ahead=self.timeline.ahead)
        else:
            left, right = window
            now = self._now()
            wanted = dict(since=left, until=min(right, now) if now else right, span=right - left)
        query = self.poller.query
        if any(getattr(query, key) != value for key, value in wanted.items()):
            self.poller.set_query(**wanted)

    # -- drawing ----------------------------------------------------------------

    def show_snapshot(self, snap: dict) -> None:
        self.snap = snap
        history = self.poller.query.history if self.poller else 600.0
        active = sum(1 for m in snap["machines"] if m["status"] == "active")
        node = snap["node"]
        row = next((m for m in snap["machines"] if node and m["id"] == node["id"]), None)
        context = {"db_now": snap["db_now"], "throughput": snap["machine_throughput"], "history": history}
        self._each_view(snap, (
            ("slots timeline", lambda: self.timeline.show_snapshot(snap)),
            ("peers table", lambda: self.peers.set_rows(snap["machines"], context)),
            ("job runs", lambda: self.jobs.show_snapshot(snap)),
            ("queue graph", lambda: self.queue.show_snapshot(snap)),
            ("schedules", lambda: self.schedules.show_snapshot(snap)),
            ("node panel", lambda: self.node_panel.show_node(node, max(1, active) * snap["period"], row)),
            ("farm summary", lambda: self._summarise(snap)),
            ("actions", self._update_actions),
        ))

    def _each_view(self, snap: dict, updates) -> None:
        """Update every view; one that raises is logged (once, until it recovers) and named in the banner,
        and the others still show the snapshot."""
        for name, update in updates:
            try:
                update()
            except Exception as error:
                if name not in self.broken:
                    self.broken.add(name)
                    log.exception("the %s could not show the snapshot of %s", name, text.clock(snap["db_now"]))
                self._show_banner(f"The {name} could not show the latest data ({type(error).__name__}: "
                                  f"{mask(str(error).splitlines()[0] if str(error) else '')}); the other views "
                                  "are up to date. Details are in the log.")
                self.banner_timer.start()
            else:
                self.broken.discard(name)

    def _summarise(self, snap: dict) -> None:
        counts: dict[str, int] = {}
        for machine in snap["machines"]:
            counts[machine["status"]] = counts.get(machine["status"], 0) + 1
        parts = [f"{n} {state}" for state, n in counts.items() if state != "stopped"]
        leader = snap["names"].get(snap["leader"]) if snap["leader"] else None
        dead = counts.get("dead", 0)
        summary = " · ".join(parts) or "no machines"
        if leader:
            summary += f" · leader {leader}"
        colour = theme.readable(theme.MACHINE_STATE["dead"], theme.current().window) if dead else theme.current().text
        self.farm_label.setText(f"<span style='color:{colour}'>{summary}</span>")

    def _now(self) -> float | None:
        """The database's time now, extrapolated from the last snapshot on our monotonic clock."""
        if self.snap is None:
            return None
        return self.snap["db_now"] + (time.monotonic() - self.snap["mono"])

    def _tick(self) -> None:
        now = self._now()
        if now is not None:
            self.timeline.tick(now)
            self.clock_label.setText(f"db time {text.clock(now, millis=False)}")
            node = self.snap["node"]
            self.node_panel.tick(time.monotonic() - self.snap["mono"] if node else 0.0)
        if self.poller and self.poller.running:
            self._sync_window()
        self._show_health()

    def _update_actions(self) -> None:
        node = self.snap["node"] if self.snap else None
        state = node["state"] if node else None
        self.act_pause.setEnabled(state == "active")
        self.act_resume.setEnabled(state == "paused")
        self.act_drain.setEnabled(state in ("active", "paused"))
        self.act_start.setEnabled(state == "stopped" and bool(self.poller and self.poller.running))
        job = self.jobs.selected_job() if self.tabs.currentWidget() is self.jobs else None
        self.act_retry.setEnabled(bool(job) and job["state"] in ("failed", "cancelled") and not self.watch_only)
        self.act_cancel.setEnabled(bool(job) and job["state"] in ("queued", "running") and not self.watch_only)

    def restyle(self) -> None:
        for action in self.findChildren(QAction):
            if action.data():
                action.setIcon(theme.icon(action.data()))
        self.setWindowIcon(theme.icon("app"))
        self.timeline.restyle()
        self.jobs.gantt.restyle()
        self.queue.restyle()
        if self.snap:
            self.show_snapshot(self.snap)

    def set_scheme(self, choice: str) -> None:
        found = QApplication.instance().findChild(theme.Theme)
        found.choice = choice
        self.settings.setValue("view/scheme", choice)
        found.apply()

    # -- operator actions -------------------------------------------------------

    def steer(self, machine_id: int | None, wish: str) -> None:
        if machine_id is None or self.poller is None:
            return
        name = self.snap["names"].get(machine_id, f"#{machine_id}") if self.snap else f"#{machine_id}"

        def act(farm):
            farm.steer(str(machine_id), wish)
            return f"asked {name} to {wish}; it applies this within one heartbeat"

        self.poller.act(f"{wish.capitalize()} {name}", act)

    def drain(self, machine_id: int | None) -> None:
        """Ask first: a drained node stops, and only its own machine can start it again."""
        if machine_id is None or self.poller is None:
            return
        name = self.snap["names"].get(machine_id, f"#{machine_id}") if self.snap else f"#{machine_id}"
        mine = machine_id == self.node_id
        again = ("Start This Machine (Node menu) brings it back." if mine
                 else "It rejoins only when its node is started again on that machine.")
        self.drain_confirm = confirm(self, "confirmDrain", f"Drain {'this machine' if mine else name}?",
                                     f"{name} finishes its running jobs, takes no new ones, then stops. {again}",
                                     "Drain", lambda: self.steer(machine_id, "drain"))

    def start_node(self) -> None:
        if self.poller is not None:
            self.poller.start_node()

    def _peer_menu(self, position) -> None:
        index = self.peers_view.indexAt(position)
        if not index.isValid():
            return
        machine = index.data(ROW_ROLE)
        menu = QMenu(self)
        menu.setObjectName("peerMenu")
        status = machine["status"]
        for wish, icon, allowed in (("pause", "pause", status == "active"), ("resume", "resume", status == "paused"),
                                    ("drain", "drain", status in ("active", "paused"))):
            action = menu.addAction(theme.icon(icon), f"{wish.capitalize()} {machine['name']}")
            action.setEnabled(allowed and not self.watch_only)
            steer = self.drain if wish == "drain" else lambda i, w=wish: self.steer(i, w)
            action.triggered.connect(lambda _=False, s=steer: s(machine["id"]))
        menu.popup(self.peers_view.viewport().mapToGlobal(position))
        self.peer_menu = menu

    def enqueue(self) -> None:
        dialog = EnqueueDialog(self)
        dialog.setObjectName("enqueueDialog")
        dialog.accepted.connect(lambda: self._enqueue(dialog.options))
        dialog.open()

    def _enqueue(self, options: dict) -> None:
        def act(farm):
            ids = farm.enqueue_http(**options)
            return f"enqueued job {ids[0]}" if len(ids) == 1 else f"enqueued {len(ids)} jobs ({ids[0]}..{ids[-1]})"

        self.poller.act("Enqueue", act)

    def retry(self) -> None:
        job = self.jobs.selected_job()
        if job:
            self.poller.act(f"Retry job {job['id']}", lambda farm: (farm.retry(job["id"]), "queued again")[1])

    def cancel(self) -> None:
        job = self.jobs.selected_job()
        if job:
            self.poller.act(f"Cancel job {job['id']}", lambda farm: farm.cancel(job["id"]))

    def _job_selected(self, job_id) -> None:
        self._query(job_id=job_id)
        self._update_actions()

    def follow_now(self) -> None:
        """Jump to now and follow; pressed while following, it keeps following (it is not a toggle)."""
        self.act_follow.setChecked(True)
        self.timeline.set_follow(True)

    def _gone_toggled(self, on: bool) -> None:
        self._query(keep_gone=1e12 if on else 600.0)

    def choose_database(self, url: str | None = None, problem: str = "") -> None:
        dialog = DatabaseDialog(recent_databases(self.settings), self, url, problem)
        dialog.setObjectName("databaseDialog")
        dialog.accepted.connect(lambda: self.switch_database(dialog.url))
        dialog.open()

    def open_recent(self, url: str) -> None:
        """Recent databases are remembered without their passwords: ask for one where the URL has a user."""
        if needs_password(url):
            self.choose_database(url, f"Enter the password for {mask(url)}.")
        else:
            self.switch_database(url)

    def switch_database(self, url: str) -> None:
        """Leave this farm (stopping our node there) and open another one once the worker has finished."""
        if self.poller is None:
            return
        if not self.poller.running:  # it ended (a refused login, a stopped worker): nothing to leave
            self._open(url)
            return
        if url == self.url:
            return
        self._next_url = url
        self.statusBar().showMessage(f"Leaving {mask(self.url)}…")
        self.poller.stop()

    # -- closing ----------------------------------------------------------------

    def closeEvent(self, event) -> None:
        if self._closed or self.poller is None or not self.poller.running:
            self._finish_close()
            event.accept()
            return
        event.ignore()
        if self._closing:
            return
        self._closing = True
        self.setEnabled(False)
        self.statusBar().showMessage("Stopping this machine's node…" if self.node_options is not None else "Closing…")
        self.poller.stop()
        self.close_timer.start()

    def _worker_finished(self, poller: Poller) -> None:
        """The worker stopped (we are closing, switching databases, the login was refused, or it ended when
        nobody asked it to): runs on the GUI thread."""
        if poller is not self.poller:  # an earlier worker, already replaced: its end says nothing of this one
            return
        if poller.running:  # its last word is sent; its thread ends a moment later
            QTimer.singleShot(5, partial(self._worker_finished, poller))
            return
        if self._closing:
            self._closed = True
            self.close()
        elif self._next_url is not None:
            url, self._next_url = self._next_url, None
            self._open(url)
        elif self.refusal is not None:  # final: ask for the login again rather than retry it forever
            self._show_banner(f"The database refused the login: {self.refusal}")
            self.choose_database(without_password(self.url), f"The database refused the login: {self.refusal}. "
                                 "Check the user name and enter the password.")
        else:
            self.worker_stopped = self.health_text if self.health_state == "error" else "it ended unexpectedly"
            node = " and this machine's node is stopped" if self.node_options is not None else ""
            self._show_banner(f"The background worker stopped ({self.worker_stopped}): this window no longer reads "
                              f"the farm{node}. Open a database (File ▸ Open Database…) to start again.")
            self._update_actions()

    def _give_up_waiting(self) -> None:
        if not self._closed:
            self._closed = True
            self.close()

    def _finish_close(self) -> None:
        if self.ticker.isActive():
            for timer in (self.ticker, self.banner_timer, self.close_timer, self.jobs.search_timer):
                timer.stop()
            self._save()
            self.closed.emit()
