"""What the operator's actions do: steer a machine (asking before a drain), kill one on this host (asking first),
enqueue, retry, cancel or delete jobs, open another database (and the recent ones, remembered without their
passwords).

The actions themselves (words, icons, shortcuts) are made in actions.py; here each is wired to what it does. A
change to the farm is a Farm call the window's Commands run on its worker, so no action waits on the database; a
kill needs none (localkill.py: the snapshot has the machine's row, /proc the rest).
"""

import functools
import socket
from typing import Any, Protocol

from PySide6.QtCore import QPoint, QSettings
from PySide6.QtWidgets import QMenu, QMessageBox, QStatusBar, QTableView, QWidget

from queueprocessor.farm import needs_password, without_password
from queueprocessor.rules.search import BulkAction
from queueprocessor.rules.states import CHECKING_IN, MachineState, Wish
from queueprocessor.rules.urls import mask

from . import localkill, theme
from .actions import Actions
from .commands import Commands
from .connection import Connection
from .dialogs import DatabaseDialog, EnqueueDialog, about, confirm
from .jobsview import JobsView
from .models import ROW_ROLE
from .readonly import refuse
from .snapshot import Snapshot
from .tour import TourDialog

RECENT = 8


def remember(settings: QSettings, url: str) -> None:
    """Put a database first in the recent list (without its password)."""
    recent = [u for u in recent_databases(settings) if u != without_password(url)]
    settings.setValue("recent", [without_password(url), *recent][:RECENT])


def recent_databases(settings: QSettings) -> list[str]:
    value = settings.value("recent", [])
    return [value] if isinstance(value, str) else list(value or [])


class OperatorHost(Protocol):
    """What the operator's actions use of the window they act for (the main window is one), so that this module
    need not import the window that imports it."""

    act: Actions
    connection: Connection
    commands: Commands
    snap: Snapshot | None
    settings: QSettings
    peers_view: QTableView
    jobs: JobsView

    @property
    def watch_only(self) -> bool: ...

    @property
    def refusal(self) -> str | None: ...

    def follow_now(self) -> None: ...

    def show_gone(self, on: bool) -> None: ...

    def window(self) -> QWidget: ...

    def statusBar(self) -> QStatusBar: ...

    def close(self) -> bool: ...


class Operator:
    """The window's actions at work. `drain_confirm`, `kill_confirm` and `peer_menu` are the last drain and kill
    questions and peer menu shown (kept so they stay open, and so the tests find them)."""

    def __init__(self, window: OperatorHost):
        self.window = window
        self.drain_confirm: QMessageBox | None = None
        self.kill_confirm: QMessageBox | None = None
        self.peer_menu: QMenu | None = None
        self.tour: TourDialog | None = None

    def wire(self) -> None:
        """What each of the window's actions does."""
        window, act, connection = self.window, self.window.act, self.window.connection
        act.open.triggered.connect(lambda: self.choose_database())
        act.quit.triggered.connect(window.close)
        act.enqueue.triggered.connect(self.enqueue)
        act.retry.triggered.connect(self.retry)
        act.cancel.triggered.connect(self.cancel)
        act.delete.triggered.connect(lambda: self._on_selection(BulkAction.DELETE))
        act.pause.triggered.connect(lambda: self.steer(connection.node_id, Wish.PAUSE))
        act.resume.triggered.connect(lambda: self.steer(connection.node_id, Wish.RESUME))
        act.drain.triggered.connect(lambda: self.drain(connection.node_id))
        act.start.triggered.connect(connection.start_node)
        act.follow.triggered.connect(window.follow_now)
        act.refresh.triggered.connect(connection.refresh)
        act.gone.triggered.connect(window.show_gone)
        act.about.triggered.connect(lambda: about(window.window(), connection.url))
        act.tour.triggered.connect(self.show_tour)
        act.kill.aboutToShow.connect(self.fill_kill_menu)

    def show_tour(self) -> None:
        """Help ▸ Tour, beside the window; one dialog however often it is asked for."""
        if self.tour is None:
            self.tour = TourDialog(self.window.window())
            self.tour.adjustSize()
            frame = self.window.window().frameGeometry()  # its bottom right: the turn strip's names stay in sight
            self.tour.move(frame.right() - self.tour.width() - 24, frame.bottom() - self.tour.height() - 48)
        self.tour.show()
        self.tour.raise_()

    # -- machines ---------------------------------------------------------------

    def _name(self, machine_id: int) -> str:
        snap = self.window.snap
        return snap.name_of(machine_id) if snap else f"#{machine_id}"

    def steer(self, machine_id: int | None, wish: Wish) -> None:
        if machine_id is not None:
            self.window.commands.steer(machine_id, self._name(machine_id), wish)

    def drain(self, machine_id: int | None) -> None:
        """Ask first: a drained node stops, and only its own machine can start it again."""
        if machine_id is None:
            return
        name = self._name(machine_id)
        mine = machine_id == self.window.connection.node_id
        again = (
            "Start This Machine (Node menu) brings it back."
            if mine
            else "It rejoins only when its node is started again on that machine."
        )
        self.drain_confirm = confirm(
            self.window.window(),
            "confirmDrain",
            f"Drain {'this machine' if mine else name}?",
            f"{name} finishes its running jobs, takes no new ones, then stops. {again}",
            "Drain",
            lambda: self.steer(machine_id, Wish.DRAIN),
        )

    def show_peer_menu(self, position: QPoint) -> None:
        """The peers table's context menu: pause, resume or drain the machine under the pointer."""
        view = self.window.peers_view
        index = view.indexAt(position)
        if not index.isValid():
            return
        machine = index.data(ROW_ROLE)
        menu = QMenu(self.window.window())
        menu.setObjectName("peerMenu")
        status = machine["status"]
        for wish, allowed in (
            (Wish.PAUSE, status == MachineState.ACTIVE),
            (Wish.RESUME, status == MachineState.PAUSED),
            (Wish.DRAIN, status in (MachineState.ACTIVE, MachineState.PAUSED)),
        ):
            action = menu.addAction(theme.icon(wish), f"{wish.capitalize()} {machine['name']}")
            action.setEnabled(allowed and not self.window.watch_only)
            steer = self.drain if wish is Wish.DRAIN else lambda i, w=wish: self.steer(i, w)
            action.triggered.connect(lambda _=False, s=steer: s(machine["id"]))
        menu.addSeparator()
        kill = menu.addAction(f"Kill {machine['name']} (pid {machine['pid']})…")
        why = self._kill_refusal(machine)
        kill.setEnabled(why is None and not self.window.watch_only)
        kill.setToolTip(f"Not here: {why}" if why else localkill.tip(machine["name"]))
        kill.triggered.connect(lambda: self.kill(machine["id"]))
        menu.setToolTipsVisible(True)
        if self.window.refusal:
            menu.setToolTipsVisible(True)
            refuse(menu.actions(), self.window.refusal)
        menu.popup(view.viewport().mapToGlobal(position))
        self.peer_menu = menu

    def fill_kill_menu(self) -> None:
        """Node ▸ Kill a Machine on This Host, as it is about to show: the other machines of this host that check
        in, by name, as the latest snapshot has them, each disabled with why when it may not be killed
        (localkill.py)."""
        menu, snap = self.window.act.kill, self.window.snap
        menu.clear()
        host, own = socket.gethostname(), self.window.connection.node_id
        for machine in sorted(snap.machines, key=lambda m: (m["name"], m["id"])) if snap else []:
            if machine["host"] != host or machine["id"] == own or machine["status"] not in CHECKING_IN:
                continue
            action = menu.addAction(f"{machine['name']} (pid {machine['pid']})…")
            action.setObjectName(f"kill-{machine['id']}")
            why = self._kill_refusal(machine)
            action.setEnabled(why is None)
            action.setToolTip(f"Not here: {why}" if why else localkill.tip(machine["name"]))
            action.triggered.connect(lambda _=False, i=machine["id"]: self.kill(i))
        if menu.isEmpty():
            menu.addAction("(no other machine on this host)").setEnabled(False)
        refuse(menu.actions(), self.window.refusal)  # a read-only window's menu is disabled: this only if it opens

    def _kill_refusal(self, machine: dict[str, Any]) -> str | None:
        """Why `machine` may not be killed from here now, or None (localkill.refusal, /proc read now)."""
        snap = self.window.snap
        if snap is None:
            return "the farm has not been read yet"
        here = localkill.Here.of(snap, self.window.connection.node_id)
        return localkill.refusal(machine, here, localkill.look(machine["pid"]) if here.procfs else None)

    def _row(self, machine_id: int | None = None, instance: str | None = None) -> dict[str, Any] | None:
        """A machine's row in the latest snapshot, by id or by instance (unique across farms and restarts)."""
        snap = self.window.snap
        rows = snap.machines if snap else []
        return next((m for m in rows if m["id"] == machine_id or m["instance"] == instance), None)

    def kill(self, machine_id: int) -> None:
        """Ask first, then SIGKILL another machine's node on this host (localkill.py): a crash, not a drain."""
        machine = self._row(machine_id)
        if machine is None:
            return
        name, instance = machine["name"], machine["instance"]
        self.kill_confirm = confirm(
            self.window.window(),
            "confirmKill",
            f"Kill {name} (pid {machine['pid']})?",
            f"{name}'s node is killed at once (SIGKILL), as a crash ends it: this is not a drain. Its running jobs "
            "stop where they are, and the other machines take them over once its lease ends. It rejoins only when "
            "its node is started again.",
            "Kill",
            lambda: self._kill(instance),
        )

    def _kill(self, instance: str) -> None:
        """The kill, as the operator answered: checked again against the latest snapshot and /proc (the machine may
        have stopped while the question was open, or the window moved to another farm)."""
        machine, snap, bar = self._row(instance=instance), self.window.snap, self.window.statusBar()
        if self.window.refusal or machine is None or snap is None:
            why = self.window.refusal or "the machine is no longer in this farm's list"
            bar.showMessage(f"Not killed: {why}", 8000)
            return
        _killed, message = localkill.kill(machine, localkill.Here.of(snap, self.window.connection.node_id))
        bar.showMessage(message, 8000)

    # -- jobs -------------------------------------------------------------------

    def enqueue(self) -> None:
        snap = self.window.snap
        dialog = EnqueueDialog(self.window.window(), [info.name for info in snap.queues] if snap else [])
        dialog.setObjectName("enqueueDialog")
        dialog.accepted.connect(lambda: self.window.commands.enqueue(**dialog.options))
        dialog.open()

    def retry(self) -> None:
        self._on_selection(BulkAction.RETRY)

    def cancel(self) -> None:
        self._on_selection(BulkAction.CANCEL)

    def _on_selection(self, action: BulkAction) -> None:
        """Retry, cancel or delete the selected jobs: one as its single command does, many in one bulk action."""
        ids = [job["id"] for job in self.window.jobs.selected_jobs()]
        single = {BulkAction.RETRY: self.window.commands.retry, BulkAction.CANCEL: self.window.commands.cancel}
        if len(ids) == 1 and action in single:
            single[action](ids[0])
        elif ids:
            self.window.commands.act_on_jobs(action, ids)

    # -- databases --------------------------------------------------------------

    def choose_database(self, url: str | None = None, problem: str = "") -> None:
        dialog = DatabaseDialog(recent_databases(self.window.settings), self.window.window(), url, problem)
        dialog.setObjectName("databaseDialog")
        dialog.accepted.connect(lambda: self.switch_database(dialog.url))
        dialog.open()

    def fill_recent(self, menu: QMenu) -> None:
        """The Open Recent menu, as it is about to show."""
        menu.clear()
        for url in recent_databases(self.window.settings):
            menu.addAction(mask(url), functools.partial(self.open_recent, url))
        if menu.isEmpty():
            menu.addAction("(none yet)").setEnabled(False)

    def open_recent(self, url: str) -> None:
        """Recent databases are remembered without their passwords: ask for one where the URL has a user."""
        if needs_password(url):
            self.choose_database(url, f"Enter the password for {mask(url)}.")
        else:
            self.switch_database(url)

    def switch_database(self, url: str) -> None:
        """Leave this farm (stopping our node there) and open another one once the worker has finished."""
        connection = self.window.connection
        if connection.live:
            if url == connection.url:
                return
            self.window.statusBar().showMessage(f"Leaving {mask(connection.url)}…")
        connection.open(url)
