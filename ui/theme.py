"""Colours, the style sheet and icons, following the system's light or dark scheme.

Every colour the app draws with comes from here, so plots, tables and the
style sheet agree, and a scheme change (the user flips the desktop to dark)
re-themes everything through `Theme.changed`.
"""

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import QByteArray, QObject, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication

from queueprocessor.rules.states import JobState, MachineState, Outcome

from .queuestate import QueueState

# resources/ sits beside the package in a checkout; an installed wheel carries it as ui/resources (pyproject
# maps the one to the other).
_HERE = Path(__file__).resolve().parent
RESOURCES = _HERE / "resources" if (_HERE / "resources").is_dir() else _HERE.parent / "resources"

# Outcome of a run, state of a job: one colour each, at least 3:1 against the light and the dark plot
# background (WCAG AA for graphics). As text, pass them through `readable`.
OUTCOME: dict[str, str] = {
    Outcome.RUNNING: "#3b82f6",
    Outcome.SUCCEEDED: "#22a05b",
    Outcome.FAILED: "#dc4a4a",
    Outcome.TIMEOUT: "#a855f7",
    Outcome.LOST: "#d97706",
    Outcome.CANCELLED: "#8b919b",
    Outcome.SNOOZED: "#db2777",
}
JOB_STATE: dict[str, str] = {
    JobState.WAITING: "#0e7490",
    JobState.QUEUED: "#b7791f",
    JobState.RUNNING: OUTCOME[Outcome.RUNNING],
    JobState.SUCCEEDED: OUTCOME[Outcome.SUCCEEDED],
    JobState.FAILED: OUTCOME[Outcome.FAILED],
    JobState.CANCELLED: OUTCOME[Outcome.CANCELLED],
}
# Darker: the state badge writes white on them (4.5:1), and as dots they still stand 3:1 off a dark base.
MACHINE_STATE: dict[str, str] = {
    MachineState.ACTIVE: "#15803d",
    MachineState.PAUSED: "#a16207",
    MachineState.DRAINING: "#2563eb",
    MachineState.STOPPED: "#6b7280",
    MachineState.DEAD: "#dc2626",
}
# A queue as the Queues tab judges it: paused like a paused machine; unserved (its jobs wait for a machine that
# serves it) as alarming as a dead one.
QUEUE_STATE: dict[str, str] = {
    QueueState.ACTIVE: MACHINE_STATE[MachineState.ACTIVE],
    QueueState.PAUSED: MACHINE_STATE[MachineState.PAUSED],
    QueueState.UNSERVED: MACHINE_STATE[MachineState.DEAD],
}
# A queue's breaker (rules/breaker.py): closed as an active machine, open as a dead one, trying again as a paused one.
BREAKER_STATE: dict[str, str] = {
    "closed": MACHINE_STATE[MachineState.ACTIVE],
    "open": MACHINE_STATE[MachineState.DEAD],
    "half-open": MACHINE_STATE[MachineState.PAUSED],
    "ramp": MACHINE_STATE[MachineState.PAUSED],
}


@dataclass(frozen=True)
class Scheme:
    name: str
    window: str
    base: str
    alt_base: str
    text: str
    muted: str
    border: str
    accent: str
    highlight_text: str
    plot_bg: str
    lane_bg: str
    dead_bg: str
    unsynced_bg: str
    faint_slot: str
    turn: str
    turn_claimed: str


LIGHT = Scheme(
    "light",
    window="#f3f4f6",
    base="#ffffff",
    alt_base="#f7f8fa",
    text="#1f2328",
    muted="#6b7280",
    border="#d5d9e0",
    accent="#2563eb",
    highlight_text="#ffffff",
    plot_bg="#ffffff",
    lane_bg="#f1f3f6",
    dead_bg="#fde2e2",
    unsynced_bg="#fff4d6",
    faint_slot="#e3eaf7",
    turn="#6b8ee0",
    turn_claimed="#1e3a8a",
)
DARK = Scheme(
    "dark",
    window="#1e2126",
    base="#16181c",
    alt_base="#1b1e23",
    text="#e6e8eb",
    muted="#9aa3ae",
    border="#343a42",
    accent="#4f8cff",
    highlight_text="#ffffff",
    plot_bg="#16181c",
    lane_bg="#1f232a",
    dead_bg="#4a1f22",
    unsynced_bg="#45391a",
    faint_slot="#222a38",
    turn="#3f63b0",
    turn_claimed="#a9c7ff",
)


class Theme(QObject):
    """The active scheme; emits `changed` when the system (or the user) switches light/dark."""

    changed = Signal()

    def __init__(self, app: QApplication, choice: str = "auto"):
        super().__init__(app)
        self.app = app
        self.choice = choice
        self.scheme = LIGHT
        app.setStyle("Fusion")
        hints = QGuiApplication.styleHints()
        hints.colorSchemeChanged.connect(self._system_changed)
        self.apply()

    def _system_changed(self, _scheme) -> None:
        if self.choice == "auto":
            self.apply()

    def apply(self) -> None:
        if self.choice == "auto":
            dark = QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark
        else:
            dark = self.choice == "dark"
        self.scheme = DARK if dark else LIGHT
        self.app.setPalette(palette(self.scheme))
        self.app.setStyleSheet(style_sheet(self.scheme))
        pg.setConfigOptions(background=self.scheme.plot_bg, foreground=self.scheme.text, antialias=False)
        icon.cache_clear()
        self.changed.emit()


def paint_plot(plot: pg.PlotWidget) -> None:
    """A plot in the current scheme: its background, and its axes' lines and labels."""
    scheme = current()
    plot.setBackground(scheme.plot_bg)
    for name in ("left", "bottom"):
        axis = plot.getPlotItem().getAxis(name)
        axis.setPen(scheme.border)
        axis.setTextPen(scheme.text)


def palette(s: Scheme) -> QPalette:
    p = QPalette()
    roles = {
        QPalette.ColorRole.Window: s.window,
        QPalette.ColorRole.WindowText: s.text,
        QPalette.ColorRole.Base: s.base,
        QPalette.ColorRole.AlternateBase: s.alt_base,
        QPalette.ColorRole.Text: s.text,
        QPalette.ColorRole.Button: s.window,
        QPalette.ColorRole.ButtonText: s.text,
        QPalette.ColorRole.Highlight: s.accent,
        QPalette.ColorRole.HighlightedText: s.highlight_text,
        QPalette.ColorRole.ToolTipBase: s.base,
        QPalette.ColorRole.ToolTipText: s.text,
        QPalette.ColorRole.PlaceholderText: s.muted,
        QPalette.ColorRole.Link: s.accent,
        QPalette.ColorRole.Mid: s.border,
    }
    for role, colour in roles.items():
        p.setColor(role, QColor(colour))
    for role in (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor(s.muted))
    return p


def style_sheet(s: Scheme) -> str:
    """resources/style.qss with the scheme's colours put in for its @names."""
    text = (RESOURCES / "style.qss").read_text().replace("@arrows", (RESOURCES / "icons" / "arrows").as_posix())
    for name in sorted(Scheme.__dataclass_fields__, key=len, reverse=True):
        text = text.replace(f"@{name}", getattr(s, name))
    return text


def luminance(colour: str) -> float:
    """WCAG relative luminance of a #rrggbb colour."""
    channels = (int(colour[n : n + 2], 16) / 255 for n in (1, 3, 5))
    r, g, b = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio of two colours, 1 to 21."""
    light, dark = sorted((luminance(a), luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def ink(background: str) -> str:
    """The text colour to write on a filled background: white or near-black, whichever reads better."""
    return "#ffffff" if contrast("#ffffff", background) >= contrast("#1f2328", background) else "#1f2328"


@cache
def readable(colour: str, background: str, ratio: float = 4.5) -> str:
    """`colour` darkened or lightened (hue kept) until text in it reads on `background` (WCAG AA: 4.5:1)."""
    shade = QColor(colour)
    towards = QColor("#000000" if luminance(background) > 0.18 else "#ffffff")
    for step in range(21):
        t = step / 20
        mixed = QColor.fromRgbF(
            *(
                a + (b - a) * t
                for a, b in (
                    (shade.redF(), towards.redF()),
                    (shade.greenF(), towards.greenF()),
                    (shade.blueF(), towards.blueF()),
                )
            )
        )
        if contrast(mixed.name(), background) >= ratio:
            return mixed.name()
    return towards.name()


def current() -> Scheme:
    theme = QApplication.instance().findChild(Theme) if QApplication.instance() else None
    return theme.scheme if theme else LIGHT


@cache
def icon(name: str, colour: str | None = None) -> QIcon:
    """An icon from resources/icons, drawn in the text colour (or `colour`), sharp at any scale."""
    svg = (RESOURCES / "icons" / f"{name}.svg").read_text()
    svg = svg.replace("currentColor", colour or current().text)
    renderer = QSvgRenderer(QByteArray(svg.encode()))
    result = QIcon()
    for size in (16, 20, 24, 32, 48, 64, 128, 256):
        pixmap = QPixmap(size, size)
        pixmap.fill(Qt.GlobalColor.transparent)
        painter = QPainter(pixmap)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter, QRectF(0, 0, size, size))
        painter.end()
        result.addPixmap(pixmap)
    return result


@cache
def colour(name: str) -> QColor:
    """One QColor per colour, made once: table models hand these out for every painted cell."""
    return QColor(name)


@cache
def dot(colour: str, size: int = 10) -> QIcon:
    """A filled circle: the state marks in tables and the status bar."""
    scale = 4  # drawn large, so it stays round on high-DPI screens
    pixmap = QPixmap(size * scale, size * scale)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor(colour))
    painter.drawEllipse(QRectF(scale, scale, (size - 2) * scale, (size - 2) * scale))
    painter.end()
    return QIcon(pixmap)
