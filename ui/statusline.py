"""What the window says about itself outside the views: the status bar's database, link, farm and clock, and the
banner above the plots that says what failed and what the window still shows."""

import time

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QStatusBar

from queueprocessor.rules.states import MachineState
from queueprocessor.rules.urls import mask

from . import text, theme
from .connection import State
from .snapshot import Snapshot

# The link's states in the machines' colours: answering green, slow amber, in trouble red, otherwise grey.
COLOUR = {
    State.CONNECTED: MachineState.ACTIVE,
    State.SLOW: MachineState.PAUSED,
    State.FAILED: MachineState.DEAD,
    State.LOST: MachineState.DEAD,
    State.BROKEN: MachineState.DEAD,
    State.ENDED: MachineState.DEAD,
    State.REFUSED: MachineState.DEAD,
}
TIP = {
    State.CONNECTED: "The database answers",
    State.SLOW: "The database is slow to answer",
    State.FAILED: "The database does not answer; retrying",
    State.LOST: "The database does not answer; retrying",
}
PASSING = 8000  # ms a passing banner stays up


class StatusLine:
    """The status bar's permanent labels."""

    def __init__(self, bar: QStatusBar):
        self.database = QLabel()
        self.database.setToolTip("The farm database (password hidden)")
        self.link = QLabel()
        self._link: tuple[str, str] | None = None  # the link's text and tooltip as shown
        self.farm = QLabel()
        self.clock = QLabel()
        self.clock.setToolTip("The database's clock (its time zone shown as yours)")
        bar.addWidget(self.database)
        bar.addWidget(self.link)
        bar.addPermanentWidget(self.farm)
        bar.addPermanentWidget(self.clock)

    def show_database(self, url: str) -> None:
        self.database.setText(mask(url))

    def show_link(self, state: State, reason: str, snap: Snapshot | None) -> None:
        """Say the link's state; the label is set again only when what it says changed."""
        if state is State.CONNECTED and snap is not None:
            reason = f"connected · read {snap.read_ms:.0f} ms"
        elif state is State.SLOW and snap is not None:
            reason = f"slow: no answer for {time.monotonic() - snap.mono:.0f} s"
        elif state is State.ENDED:
            reason = "background worker stopped"
        colour = theme.MACHINE_STATE[COLOUR.get(state, MachineState.STOPPED)]
        shown = (f"<span style='color:{colour}'>●</span> {reason}", TIP.get(state, reason))
        if shown != self._link:
            self._link = shown
            self.link.setText(shown[0])
            self.link.setToolTip(shown[1])

    def show_farm(self, snap: Snapshot) -> None:
        """How many machines are in each state, and whose slot it is."""
        counts: dict[str, int] = {}
        for machine in snap.machines:
            counts[machine["status"]] = counts.get(machine["status"], 0) + 1
        parts = [f"{n} {state}" for state, n in counts.items() if state != MachineState.STOPPED]
        summary = " · ".join(parts) or "no machines"
        if snap.leader:
            summary += f" · leader {snap.name_of(snap.leader)}"
        scheme = theme.current()
        dead = counts.get(MachineState.DEAD, 0)
        colour = theme.readable(theme.MACHINE_STATE[MachineState.DEAD], scheme.window) if dead else scheme.text
        self.farm.setText(f"<span style='color:{colour}'>{summary}</span>")

    def show_clock(self, now: float) -> None:
        self.clock.setText(f"db time {text.clock(now, millis=False)}")


class Banner(QLabel):
    """A message above the plots. A passing one hides itself after a while, once `settled()` says the trouble is
    over; a lasting one stays until the next says otherwise."""

    def __init__(self, settled, parent=None):
        super().__init__("", parent, objectName="banner")
        self.setWordWrap(True)
        self.hide()
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setInterval(PASSING)
        self.timer.timeout.connect(self._pass)
        self._settled = settled

    def _pass(self) -> None:
        if self._settled():
            self.hide()

    def say(self, message: str, passing: bool = False) -> None:
        self.setText(message)
        self.setStyleSheet(f"background: {theme.current().dead_bg}; padding: 6px 10px; border-radius: 6px;")
        self.show()
        if passing:
            self.timer.start()
        else:
            self.timer.stop()
