"""The main window: the slots timeline on top; peers, job runs, the queue and schedules below; this node on the
left.

The window composes four parts and keeps none of their state: the
`Connection` (the worker thread, and the one state of the link to the
database), the `Commands` (every operator's action, a Farm call run on that
worker), the `Operator` (what each menu item, button and context menu does),
and the views, which only ever draw a `Snapshot`. Closing the window
stops this machine's node on the worker and closes once it is done, so the
window never freezes, even with the database gone. A view that fails to draw a
snapshot is logged and reported; the other views still draw it.
"""

import logging
import time

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QApplication, QDockWidget, QMainWindow, QSplitter, QTabWidget, QVBoxLayout, QWidget

from queueprocessor import JobFilter
from queueprocessor.farm import without_password
from queueprocessor.nodeoptions import NodeConfig
from queueprocessor.rules.states import FINISHED, JobState, MachineState
from queueprocessor.rules.urls import mask
from queueprocessor.views import GONE_AFTER

from . import localkill, text, theme
from .actions import Actions
from .bulkbar import BulkBar
from .commands import Commands
from .connection import Connection, State
from .eventsview import EventsView
from .jobsview import JobsView
from .models import PeersModel
from .nodepanel import NodePanel, node_dock
from .operator import Operator, remember
from .queuegraph import QueueGraph
from .queuesview import QueuesView
from .readonly import WATCHING, refuse
from .schedulesview import SchedulesView
from .snapshot import Snapshot
from .statusline import Banner, StatusLine
from .tablekeys import home_end_by_rows
from .tables import peers_table
from .timeline import SlotsTimeline
from .workflowview import FlowWindow

CLOSE_GRACE = 15.0  # longest a close waits for the node to stop before leaving anyway


def keep_gone(shown: bool) -> float:
    """How long the peers list and the lanes keep gone machines (views.GONE_AFTER): for ever when the operator
    asks to see them."""
    return 1e12 if shown else GONE_AFTER


log = logging.getLogger("ui.mainwindow")


def _titles(view) -> list[str]:
    """A table's column titles, saved with its layout."""
    return [view.model().headerData(column, Qt.Orientation.Horizontal) for column in range(view.model().columnCount())]


class MainWindow(QMainWindow):
    closed = Signal()

    def __init__(self, url: str, node_options: NodeConfig | None, *, interval: float = 0.4):
        super().__init__()
        self.settings = QSettings()
        self.node_options = node_options
        self.connection = Connection(node_options, interval, self)
        self.commands = Commands(self.connection.act, self.connection.fetch)
        self.snap: Snapshot | None = None  # the snapshot the views show
        self.last_result: tuple[str, bool, str] | None = None
        self.broken: set[str] = set()  # views whose last update raised (logged once, until they recover)
        self._closing = self._gave_up = False
        self.setWindowIcon(theme.icon("app"))
        self.setObjectName("QueueProcessorMain")
        self.setDockOptions(QMainWindow.DockOption.AnimatedDocks)

        self.act = Actions(self)
        self.operator = Operator(self)  # what each action does
        self.operator.wire()
        self._make_views()
        scheme = QApplication.instance().findChild(theme.Theme).choice
        self.recent_menu = self.act.show_in(self, self.node_dock.toggleViewAction(), scheme, self.set_scheme)
        self.recent_menu.aboutToShow.connect(lambda: self.operator.fill_recent(self.recent_menu))
        self.status = StatusLine(self.statusBar())
        self._restore()

        self.ticker = QTimer(self)
        self.ticker.setInterval(100)
        self.ticker.timeout.connect(self._tick)
        self.ticker.start()
        self.close_timer = QTimer(self)
        self.close_timer.setSingleShot(True)
        self.close_timer.setInterval(int(CLOSE_GRACE * 1000))
        self.close_timer.timeout.connect(self._give_up_waiting)
        self.connection.changed.connect(self._link_changed)
        self.connection.opened.connect(self._opened)
        self.connection.snapshot.connect(self.show_snapshot)
        self.connection.done.connect(self._action_done)
        self.connection.set_query(keep_gone=keep_gone(self.act.gone.isChecked()))
        self._sync_window()
        self.connection.open(url)
        QApplication.instance().findChild(theme.Theme).changed.connect(self.restyle)

    # -- building -----------------------------------------------------------

    @property
    def watch_only(self) -> bool:
        """Nothing this app does may change the farm: --observe (no node here, and its database connection refuses
        writes too), or a database user that may only read (no node either)."""
        return self.refusal is not None

    @property
    def refusal(self) -> str | None:
        """Why the farm may not be changed from here, in one line; None when it may."""
        return WATCHING if self.node_options is None else self.connection.read_only

    def _make_views(self) -> None:
        self.timeline = SlotsTimeline()
        self.timeline.follow_changed.connect(self.act.follow.setChecked)
        self.peers = PeersModel(self)
        self.peers_view = peers_table(self.peers, self.operator.show_peer_menu)
        self.jobs = JobsView()
        self.jobs.gantt.plot.setXLink(self.timeline.plot)
        self.jobs.gantt.manually_moved.connect(lambda: self.timeline.set_follow(False))
        for plot in (self.timeline, self.jobs.gantt):
            plot.addAction(self.act.follow)
        self.jobs.job_selected.connect(self._job_selected)
        self.jobs.selection_changed.connect(self._update_actions)
        self.bulk = BulkBar(self.commands, self._jobs_filter, not self.watch_only)
        self.jobs.offer(self.bulk)
        self.jobs.state_filter_changed.connect(lambda state: self._query(jobs_state=state))
        self.jobs.text_filter_changed.connect(lambda text: self._query(jobs_text=text))
        self.jobs.queue_filter_changed.connect(lambda queue: self._query(jobs_queue=queue))
        self.jobs.table.doubleClicked.connect(lambda _: self.jobs.details.setFocus())
        self.jobs.details.links.job_clicked.connect(self.show_job)
        self.jobs.details.links.flow_clicked.connect(self.show_flow)
        self.flow_window = FlowWindow(self)  # a workflow's or group's graph, opened from a job's details
        self.flow_window.job_clicked.connect(self.show_job)
        self.flow_window.closed.connect(lambda: self._query(flow_id=None))
        self.queue = QueueGraph()
        self.timeline.follow_changed.connect(self.queue.set_follow)
        self.queue.manually_moved.connect(lambda: self.timeline.set_follow(False))
        self.schedules = SchedulesView(self.commands, self.watch_only)
        self.schedules.schedule_selected.connect(lambda name: self._query(schedule=name))
        self.queues = QueuesView(self.commands, self.watch_only)
        self.event_log = EventsView(self.commands)
        self.event_log.events_read.connect(self.timeline.show_events)

        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(False)
        self.tabs.addTab(self.peers_view, "Peers")
        self.tabs.addTab(self.jobs, "Job runs")
        self.tabs.addTab(self.queue, "All jobs")  # every queue together; the Queues tab shows each
        self.tabs.addTab(self.schedules, "Schedules")
        self.tabs.addTab(self.queues, "Queues")
        self.tabs.addTab(self.event_log, "Events")
        self.tabs.currentChanged.connect(lambda _: self._update_actions())

        self.banner = Banner(lambda: self.connection.state is State.CONNECTED)
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

        self.node_panel = NodePanel(self.act.node)
        self.node_dock: QDockWidget = node_dock(self.node_panel, self)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, self.node_dock)
        if self.node_options is None:
            self.node_panel.observe_only()
        for view in self._tables().values():
            home_end_by_rows(view)

    def _views(self, snap: Snapshot) -> tuple:
        """(name, update) for every view a snapshot updates; the name is what a failure report calls it."""
        context = {"db_now": snap.db_now, "throughput": snap.machine_throughput, "history": snap.history}
        active = sum(1 for m in snap.machines if m["status"] == MachineState.ACTIVE)
        return (
            ("slots timeline", lambda: self.timeline.show_snapshot(snap)),
            ("peers table", lambda: self.peers.set_rows(snap.machines, context)),
            ("job runs", lambda: self.jobs.show_snapshot(snap)),
            ("workflow graph", lambda: self.flow_window.show_flow(snap.flow)),
            ("queue graph", lambda: self.queue.show_snapshot(snap)),
            ("schedules", lambda: self.schedules.show_snapshot(snap)),
            ("queues", lambda: self.queues.show_snapshot(snap)),
            ("events", lambda: self.event_log.show_snapshot(snap)),
            ("node panel", lambda: self.node_panel.show_node(snap.node, max(1, active) * snap.period, snap.own_row)),
            ("farm summary", lambda: self.status.show_farm(snap)),
            ("status link", self._show_link),  # the read's time
            ("actions", self._update_actions),
        )

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
        self.act.gone.setChecked(self.settings.value("view/gone", False, type=bool))
        self.tabs.setCurrentIndex(int(self.settings.value("view/tab", 0, type=int)))
        for key, view in self._tables().items():
            header = self.settings.value(f"columns/{key}")
            if self.settings.value(f"titles/{key}") != _titles(view):
                continue  # a layout saved for other columns (an older app's) would be laid over these: dropped
            if header is not None and view.horizontalHeader().restoreState(header) and view.isSortingEnabled():
                view.sortByColumn(
                    view.horizontalHeader().sortIndicatorSection(), view.horizontalHeader().sortIndicatorOrder()
                )

    def _tables(self) -> dict:
        """The tables whose column widths and sort order outlive the app."""
        return {
            "peers": self.peers_view,
            "jobs": self.jobs.table,
            "schedules": self.schedules.schedules_view,
            "singletons": self.schedules.singletons_view,
            "queues": self.queues.table,
            "attempts": self.jobs.details.attempts_view,
        }

    def _save(self) -> None:
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.setValue("window/state", self.saveState())
        self.settings.setValue("window/split", self.split.saveState())
        self.settings.setValue("view/gone", self.act.gone.isChecked())
        self.settings.setValue("view/tab", self.tabs.currentIndex())
        for key, view in self._tables().items():
            self.settings.setValue(f"columns/{key}", view.horizontalHeader().saveState())
            self.settings.setValue(f"titles/{key}", _titles(view))
        self.settings.sync()

    # -- the link to the database ---------------------------------------------------

    def _link_changed(self, state: State) -> None:
        """Say what the link's new state means for what the window shows."""
        reason = self.connection.reason
        if self._closing and not self.connection.live:
            self.close()
            return
        if state is State.CONNECTING:
            self.snap = None
            self.banner.hide()
            self.setWindowTitle(f"QueueProcessor — {mask(self.connection.url)}")
            self.status.show_database(self.connection.url)
        elif state is State.CONNECTED:
            self.banner.hide()
        elif state is State.BROKEN:
            self.banner.say(f"{reason} (details in the log); still trying.", passing=True)
        elif state in (State.FAILED, State.LOST) and self.snap is not None:
            self.banner.say(f"{reason}. Showing the farm as of {text.clock(self.snap.db_now, millis=False)}.")
        elif state is State.REFUSED:  # final: ask for the login again rather than retry it forever
            self.banner.say(f"The database refused the login: {reason}")
            self.operator.choose_database(
                without_password(self.connection.url),
                f"The database refused the login: {reason}. Check the user name and enter the password.",
            )
        elif state is State.ENDED:
            node = " and this machine's node is stopped" if self.node_options is not None else ""
            self.banner.say(
                f"The background worker stopped ({reason}): this window no longer reads the farm{node}. "
                "Open a database (File ▸ Open Database…) to start again."
            )
        self._show_link()
        self._update_actions()

    def _opened(self, _node_id: int | None) -> None:
        self.queues.read_history()
        remember(self.settings, self.connection.url)
        if self.connection.read_only and self.node_options is not None:
            self.node_panel.observe_only(self.connection.read_only)
        self._update_actions()

    def _show_link(self) -> None:
        self.status.show_link(self.connection.state, self.connection.reason, self.snap)

    def _action_done(self, label: str, ok: bool, message: str) -> None:
        self.last_result = (label, ok, message)
        self.statusBar().showMessage(f"{label}: {message}" if ok else f"{label} failed: {message}", 8000)
        if not ok:
            self.banner.say(f"{label} failed: {message}", passing=True)

    def _query(self, **changes) -> None:
        self.connection.set_query(**changes)
        self.connection.refresh()

    def _sync_window(self) -> None:
        """Tell the worker which stretch of database time the plots show."""
        window = self.timeline.time_window()
        if window is None:
            wanted = dict(since=None, until=None, span=self.timeline.span + 2, ahead=self.timeline.ahead)
        else:
            left, right = window
            now = self._now()
            wanted = dict(since=left, until=min(right, now) if now else right, span=right - left)
        query = self.connection.query
        if any(getattr(query, key) != value for key, value in wanted.items()):
            self.connection.set_query(**wanted)

    # -- drawing ----------------------------------------------------------------

    def show_snapshot(self, snap: Snapshot) -> None:
        self.snap = snap
        for name, update in self._views(snap):
            self._update_view(name, update, snap)

    def _update_view(self, name: str, update, snap: Snapshot) -> None:
        """A view that raises is logged (once, until it recovers) and named in the banner; the others still
        show the snapshot."""
        try:
            update()
        except Exception as error:
            if name not in self.broken:
                self.broken.add(name)
                log.exception("the %s could not show the snapshot of %s", name, text.clock(snap.db_now))
            self.banner.say(
                f"The {name} could not show the latest data ({type(error).__name__}: "
                f"{mask(str(error).splitlines()[0] if str(error) else '')}); the other views "
                "are up to date. Details are in the log.",
                passing=True,
            )
        else:
            self.broken.discard(name)

    def _now(self) -> float | None:
        """The database's time now, extrapolated from the last snapshot on our monotonic clock."""
        if self.snap is None:
            return None
        return self.snap.db_now + (time.monotonic() - self.snap.mono)

    def _tick(self) -> None:
        now = self._now()
        if now is not None:
            self.timeline.tick(now)
            self.status.show_clock(now)
            self.node_panel.tick(time.monotonic() - self.snap.mono if self.snap.node else 0.0)
        if self.connection.live:
            self._sync_window()
        if self.connection.state is State.SLOW:  # it counts the seconds without an answer
            self._show_link()

    def _update_actions(self) -> None:
        node = self.snap.node if self.snap else None
        state = node["state"] if node else None
        self.act.pause.setEnabled(state == MachineState.ACTIVE)
        self.act.resume.setEnabled(state == MachineState.PAUSED)
        self.act.drain.setEnabled(state in (MachineState.ACTIVE, MachineState.PAUSED))
        self.act.start.setEnabled(state == MachineState.STOPPED and self.connection.live)
        chosen = self.jobs.selected_jobs() if self.tabs.currentWidget() is self.jobs and not self.watch_only else []
        states = {job["state"] for job in chosen}
        self.act.retry.setEnabled(bool(states & {JobState.FAILED, JobState.CANCELLED}))
        self.act.cancel.setEnabled(bool(states & {JobState.WAITING, JobState.QUEUED, JobState.RUNNING}))
        self.act.delete.setEnabled(bool(states & set(FINISHED)))
        self.act.enqueue.setEnabled(not self.watch_only)
        self.act.kill.menuAction().setEnabled(localkill.unsupported() is None)
        self.schedules.watch_only = self.queues.watch_only = self.watch_only
        self.queues.refusal = self.refusal
        refuse([*self.act.writers, *self.schedules.writers], self.refusal)
        self.bulk.refuse(self.refusal)

    def _jobs_filter(self) -> JobFilter:
        """What the jobs table's filters pick now (the bulk bar acts on all of it)."""
        query = self.connection.query
        return JobFilter(state=query.jobs_state, queue=query.jobs_queue, search=query.jobs_text)

    def restyle(self) -> None:
        for action in self.findChildren(QAction):
            if action.data():
                action.setIcon(theme.icon(action.data()))
        self.setWindowIcon(theme.icon("app"))
        self.timeline.restyle()
        self.jobs.gantt.restyle()
        self.queue.restyle()
        self.queues.restyle()
        self.flow_window.graph.restyle()
        if self.snap:
            self.show_snapshot(self.snap)

    def set_scheme(self, choice: str) -> None:
        found = QApplication.instance().findChild(theme.Theme)
        found.choice = choice
        self.settings.setValue("view/scheme", choice)
        found.apply()

    # -- what the operator looks at -----------------------------------------------------

    def _job_selected(self, job_id) -> None:
        self._query(job_id=job_id)
        self._update_actions()

    def show_job(self, job_id: int) -> None:
        """Go to a job (a parent, a child or a step clicked): the Job runs tab, with its details."""
        self.tabs.setCurrentWidget(self.jobs)
        self.jobs.go_to(job_id)

    def show_flow(self, flow_id: int) -> None:
        """Open a workflow's or group's graph; the worker reads it with every poll while it is open."""
        self.flow_window.open_flow(flow_id)
        self._query(flow_id=flow_id)
        self.flow_window.show()
        self.flow_window.raise_()

    def follow_now(self) -> None:
        """Jump to now and follow; pressed while following, it keeps following (it is not a toggle)."""
        self.act.follow.setChecked(True)
        self.timeline.set_follow(True)

    def show_gone(self, on: bool) -> None:
        """List long-gone machines too (or not)."""
        self._query(keep_gone=keep_gone(on))

    # -- closing ----------------------------------------------------------------

    def closeEvent(self, event) -> None:
        if self._gave_up or not self.connection.live:
            self._finish_close()
            event.accept()
            return
        event.ignore()
        if self._closing:
            return
        self._closing = True
        self.setEnabled(False)
        self.statusBar().showMessage("Stopping this machine's node…" if self.node_options is not None else "Closing…")
        self.connection.stop()
        self.close_timer.start()

    def _give_up_waiting(self) -> None:
        self._gave_up = True
        self.close()

    def _finish_close(self) -> None:
        if self.ticker.isActive():
            for timer in (
                self.ticker,
                self.close_timer,
                self.banner.timer,
                self.connection.stale,
                self.jobs.search_timer,
            ):
                timer.stop()
            self._save()
            self.closed.emit()
