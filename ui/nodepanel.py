"""This machine's node: its state, clock, the countdown to its next turn, and its Pause/Resume/Drain/Start
buttons."""

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDockWidget,
    QFormLayout,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from queueprocessor.rules.states import MachineState

from . import text, theme
from .models import served

# What a state means for this machine, under the buttons.
NOTES = {
    MachineState.PAUSED: "Paused: out of the turns, still renewing its running jobs. Resume to rejoin.",
    MachineState.DRAINING: "Draining: finishing its running jobs, then the node stops.",
    MachineState.STOPPED: "Stopped: this machine takes no turns and runs no jobs. Start This Machine brings it back.",
}


class NodePanel(QWidget):
    def __init__(self, actions, parent=None):
        """`actions`: the Pause, Resume, Drain and Start QActions (with their shortcuts) the buttons trigger."""
        super().__init__(parent)
        self.snapshot: dict | None = None
        self.cycle = 1.0
        self.observing = False
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 10, 10, 10)
        layout.setSpacing(10)

        header = QHBoxLayout()
        self.badge = QLabel("starting", objectName="stateBadge")
        self.name = QLabel("", objectName="sectionTitle")
        self.name.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        header.addWidget(self.badge)
        header.addWidget(self.name, 1)
        layout.addLayout(header)

        card = QFrame(objectName="card")
        box = QVBoxLayout(card)
        box.addWidget(QLabel("Next turn in", objectName="cardTitle"))
        self.countdown = QLabel("–", objectName="bigValue")
        self.countdown.setToolTip("Time until this machine's next slot, in database time")
        box.addWidget(self.countdown)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress.setMaximumHeight(8)
        box.addWidget(self.progress)
        layout.addWidget(card)

        form = QFormLayout()
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft)
        form.setHorizontalSpacing(14)
        self.fields = {}
        for key, label, tip in (
            ("offset", "Clock offset", "Database time minus this machine's wall clock, ± the error bound"),
            ("rtt", "Round trip", "Round trip of the best clock sample"),
            ("turns", "Turns taken", "Slots this node polled the queue in since it started"),
            ("running", "Running", "Jobs running here / capacity, as of its last check-in (as the peers table)"),
            ("done", "Done · failed", "Runs finished here since the node started, as of its last check-in"),
            ("database", "Database", "Whether this node's last check-in reached the database"),
            (
                "queues",
                "Queues",
                "The queues this node takes jobs of (its --queues), as its machine row says; "
                "≤N: at most N of that queue's jobs at once here",
            ),
        ):
            value = QLabel("–")
            value.setToolTip(tip)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            name = QLabel(label, objectName="muted")
            name.setToolTip(tip)
            form.addRow(name, value)
            self.fields[key] = value
        layout.addLayout(form)

        buttons = QGridLayout()  # two by two: the labels say "this machine", too long for one row in the dock
        for n, action in enumerate(actions):
            button = QToolButton()
            button.setDefaultAction(action)
            button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
            button.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
            buttons.addWidget(button, n // 2, n % 2)
        layout.addLayout(buttons)
        self.note = QLabel("", objectName="muted")
        self.note.setWordWrap(True)
        layout.addWidget(self.note)
        layout.addStretch(1)
        self._badge("starting", "#8b919b")

    def _badge(self, label: str, colour: str) -> None:
        self.badge.setText(label)
        _restyle(self.badge, f"background: {colour}; color: {theme.ink(colour)};")

    def observe_only(self, why: str | None = None) -> None:
        """No node here: the app was started with --observe, or (`why`) the database may only be read."""
        self.observing = True
        self._badge("observing", theme.current().accent)
        self.name.setText("no node on this machine")
        self.note.setText(
            f"This app only watches the farm: {why}."
            if why
            else "This app only watches the farm. Start it without --observe to run this machine's node."
        )

    def show_node(self, node: dict | None, cycle: float, row: dict | None = None) -> None:
        """`cycle`: seconds between two turns of the same machine (roster size × period). `row`: the node's
        machine row from the same snapshot; its counts are shown, so they agree with the peers table."""
        self.snapshot = node
        self.cycle = cycle
        if node is None:
            return
        self._badge(node["state"], theme.MACHINE_STATE.get(node["state"], "#8b919b"))
        self.name.setText(f"{node['name']}  ·  machine {node['id']}")
        self.fields["offset"].setText(
            f"{text.ms(node['offset'], signed=True)} ± {text.ms(node['error_bound'])}"
            if node["offset"] is not None
            else "not measured"
        )
        self.fields["rtt"].setText(text.ms(node["rtt"]))
        self.fields["turns"].setText(f"{node['turns']:,}")
        running, done, failed = (
            (row["running"], row["done_count"], row["failed_count"])
            if row
            else (node["running"], node["done"], node["failed"])
        )
        self.fields["running"].setText(f"{running} / {node['capacity']}")
        self.fields["done"].setText(f"{done:,} · {failed:,}")
        healthy = node["db_healthy"]
        self.fields["database"].setText("reachable" if healthy else f"unreachable: {node['last_error'] or ''}")
        _restyle(self.fields["database"], "" if healthy else f"color: {theme.MACHINE_STATE[MachineState.DEAD]}")
        self.fields["queues"].setText(served(row) if row else "–")
        self.note.setText(NOTES.get(node["state"], ""))

    def tick(self, elapsed: float) -> None:
        """Count down: `elapsed` seconds since the node snapshot was taken."""
        node = self.snapshot
        if self.observing or node is None:
            return
        if node["next_turn_in"] is None:
            self.countdown.setText("not in the turns" if node["state"] != MachineState.ACTIVE else "joining…")
            self.progress.setValue(0)
            return
        left = max(0.0, node["next_turn_in"] - elapsed)
        self.countdown.setText(f"{left:.1f} s")
        cycle = max(self.cycle, 1e-6)
        self.progress.setValue(int(1000 * max(0.0, 1 - left / cycle)))


def _restyle(widget: QWidget, sheet: str) -> None:
    """Set a widget's style sheet only when it changes: each call re-polishes the widget, same sheet or not."""
    if widget.styleSheet() != sheet:
        widget.setStyleSheet(sheet)


def node_dock(panel: NodePanel, window: QWidget) -> QDockWidget:
    """The dock that holds this machine's panel: movable and closable, never floating off alone."""
    dock = QDockWidget("This machine", window)
    dock.setObjectName("nodeDock")
    dock.setWidget(panel)
    dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable | QDockWidget.DockWidgetFeature.DockWidgetClosable)
    return dock
