"""A workflow or group as a graph of its steps, coloured by state and redrawn from every snapshot while it is open.

Steps stand in columns by dependency depth (a step with no parent in the flow in the first, a step in the column
after its deepest parent's), a group's callback after its members. A column of many steps wraps into a block of
sub-columns, and the edges out of such a block leave from its right side, so a fan-in of 10,000 members reads as
one block converging on its callback rather than 10,000 crossing lines. The graph is rebuilt only when the steps
change; a change of state only recolours. What it draws is `Snapshot.flow` (the dashboard reads it on the worker
thread, see views.Query.flow_id); a click on a step goes to its job.
"""

import math
from dataclasses import dataclass
from functools import cache
from html import escape

from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import (
    QGraphicsPathItem,
    QGraphicsScene,
    QGraphicsSimpleTextItem,
    QGraphicsView,
    QLabel,
    QVBoxLayout,
    QWidget,
)

from queueprocessor.rules.states import JobState

from . import theme
from .joblinks import waits_text

WIDTH, HEIGHT = 150.0, 40.0  # a step's box
GAP_X, GAP_Y = 60.0, 12.0  # between depth columns, and between boxes
SUB_GAP = 14.0  # between the sub-columns of a wrapped column
FEW_ROWS = 10  # a column of up to this many steps is not wrapped
WORDS = 400  # steps up to which boxes are written in: more are too small to read at a glance (tooltips still say)
JOB = 0  # the item data key holding a box's job id


@dataclass
class Node:
    """One step as drawn: its job, what it is called, its state, and whom it runs after (job ids in the flow)."""

    job_id: int
    label: str
    state: str
    parents: list[int]
    tip: str
    named: bool = True  # the label is a name (a step's, or "callback"), so the box says its job id too


def nodes_of(flow: dict) -> list[Node]:
    """The flow's steps, and a group's callback, with their parents as job ids in the flow."""
    steps = flow["steps"]
    by_name = {step["name"]: step["job_id"] for step in steps if step["name"]}
    inside = {step["job_id"] for step in steps}
    found = []
    for step in steps:
        parents = [by_name.get(p, p) for p in step["after"]]
        outside = [p for p in parents if p not in inside]
        lines = [f"job {step['job_id']}" + (f" · step {step['name']}" if step["name"] else ""), step["state"]]
        if step["state"] == JobState.WAITING:
            lines.append(waits_text(step.get("waits_for", [])))
        if outside:
            lines.append("also runs after job " + ", ".join(str(p) for p in outside))
        if step["last_error"]:
            lines.append(step["last_error"].splitlines()[0][:200])
        label = step["name"] or f"job {step['job_id']}"
        kept = [p for p in parents if p in inside]
        found.append(Node(step["job_id"], label, step["state"], kept, "\n".join(lines), bool(step["name"])))
    callback = flow.get("callback")
    if callback:
        tip = f"job {callback['id']} · the callback: runs once after all {len(steps):,} members have ended"
        found.append(Node(callback["id"], "callback", callback["state"], sorted(inside), f"{tip}\n{callback['state']}"))
    return found


def depths(nodes: list[Node]) -> dict[int, int]:
    """Each step's column: 0 without parents in the flow, else one after its deepest parent's. Parents come before
    their children (a flow is enqueued so), so one pass does."""
    depth: dict[int, int] = {}
    for node in nodes:
        depth[node.job_id] = 1 + max((depth.get(p, 0) for p in node.parents), default=-1)
    return depth


def rows_for(count: int) -> int:
    """The rows of a column of `count` steps: all in one column up to FEW_ROWS, else a block about twice as tall
    as wide in boxes (a box is about four times as wide as tall), so a big group reads as a block."""
    return count if count <= FEW_ROWS else max(FEW_ROWS, math.ceil(math.sqrt(2 * count)))


@cache
def paints(fill: str) -> tuple[QBrush, QPen, QBrush]:
    """A state colour's fill, outline and ink, made once: a group may draw 10,000 boxes."""
    return QBrush(QColor(fill)), QPen(QColor(fill).darker(130), 1), QBrush(QColor(theme.ink(fill)))


class StepBox(QGraphicsPathItem):
    """A step's rounded box, filled with its state's colour, with its name and state written in it (`words`)."""

    def __init__(self, node: Node, rect: QRectF, words: bool):
        path = QPainterPath()
        path.addRoundedRect(rect, 6, 6)
        super().__init__(path)
        self.setData(JOB, node.job_id)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.texts = (QGraphicsSimpleTextItem(self), QGraphicsSimpleTextItem(self)) if words else ()
        self.rect = rect
        self.state = self.tip = ""
        self.show_node(node)

    def show_node(self, node: Node) -> None:
        if node.state == self.state and node.tip == self.tip:
            return  # most steps of a big group keep their state from one snapshot to the next
        self.state, self.tip = node.state, node.tip
        fill, outline, ink = paints(theme.JOB_STATE.get(node.state, theme.current().muted))
        self.setBrush(fill)
        self.setPen(outline)
        self.setToolTip(node.tip)
        state = f"{node.state} · job {node.job_id}" if node.named else node.state
        for item, words, y in zip(self.texts, (node.label, state), (5, 22), strict=False):
            item.setText(words)
            while item.boundingRect().width() > WIDTH - 16 and len(words) > 2:  # cut a long name short
                words = words[:-2]
                item.setText(words + "…")
            item.setBrush(ink)
            item.setPos(self.rect.x() + 8, self.rect.y() + y)


class FlowGraph(QGraphicsView):
    """The graph of one flow; `show_flow` draws a snapshot's flow, rebuilding only when its steps changed."""

    job_clicked = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setScene(QGraphicsScene(self))
        self.setDragMode(QGraphicsView.DragMode.ScrollHandDrag)
        self.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
        self.boxes: dict[int, StepBox] = {}
        self._shape: tuple = ()
        self._drawn: dict | None = None  # the flow drawn last: most polls bring it back unchanged

    def restyle(self) -> None:
        """Draw the next flow anew in the scheme now in use (the background and edges are drawn in it)."""
        self._shape, self._drawn = (), None

    def show_flow(self, flow: dict | None) -> None:
        if flow is not None and flow == self._drawn:
            return
        self._drawn = flow
        nodes = nodes_of(flow) if flow else []
        shape = tuple((node.job_id, tuple(node.parents)) for node in nodes)
        if shape != self._shape:
            self._build(nodes)
            self._shape = shape
        else:
            for node in nodes:
                self.boxes[node.job_id].show_node(node)

    def _build(self, nodes: list[Node]) -> None:
        scene = self.scene()
        scene.clear()
        self.boxes = {}
        self.setBackgroundBrush(QColor(theme.current().base))
        depth = depths(nodes)
        words = len(nodes) <= WORDS
        self.setRenderHint(QPainter.RenderHint.Antialiasing, words)  # thousands of tiny boxes paint twice as fast
        columns: dict[int, list[Node]] = {}
        for node in nodes:
            columns.setdefault(depth[node.job_id], []).append(node)
        out: dict[int, QPointF] = {}  # where edges from each step leave
        x = 0.0
        tallest = max((rows_for(len(c)) for c in columns.values()), default=0) * (HEIGHT + GAP_Y)
        for column in sorted(columns):
            members = columns[column]
            rows = rows_for(len(members))
            top = (tallest - rows * (HEIGHT + GAP_Y)) / 2  # each column centred on the tallest
            wide = math.ceil(len(members) / rows)
            right = x + wide * WIDTH + (wide - 1) * SUB_GAP
            for n, node in enumerate(members):
                left = x + (n // rows) * (WIDTH + SUB_GAP)
                rect = QRectF(left, top + (n % rows) * (HEIGHT + GAP_Y), WIDTH, HEIGHT)
                self.boxes[node.job_id] = box = StepBox(node, rect, words)
                box.setZValue(1)
                scene.addItem(box)
                out[node.job_id] = QPointF(right if wide > 1 else rect.right(), rect.center().y())
            x = right + GAP_X
        self._edges(nodes, out)
        scene.setSceneRect(QRectF(0, 0, x - GAP_X, tallest).adjusted(-12, -12, 12, 12))
        self.fit()

    def _edges(self, nodes: list[Node], out: dict[int, QPointF]) -> None:
        """A curve from each parent (its block's side, when wrapped) into each child's left side, once each."""
        pen = QPen(QColor(theme.current().muted), 1.2)
        drawn: set[tuple[float, float, int]] = set()
        for node in nodes:
            end = self.boxes[node.job_id].rect
            target = QPointF(end.left(), end.center().y())
            for parent in node.parents:
                start = out[parent]
                if (start.x(), start.y(), node.job_id) in drawn:
                    continue
                drawn.add((start.x(), start.y(), node.job_id))
                path = QPainterPath(start)
                bend = (target.x() - start.x()) / 2
                path.cubicTo(start + QPointF(bend, 0), target - QPointF(bend, 0), target)
                self.scene().addPath(path, pen)

    def fit(self) -> None:
        """The whole graph in view, never drawn larger than life."""
        self.resetTransform()
        rect = self.sceneRect()
        view = self.viewport().rect()
        scale = min(1.0, view.width() / max(rect.width(), 1), view.height() / max(rect.height(), 1))
        self.scale(scale, scale)
        self.centerOn(rect.center())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.fit()

    def wheelEvent(self, event) -> None:
        factor = 1.15 ** (event.angleDelta().y() / 120)
        self.scale(factor, factor)

    def mouseReleaseEvent(self, event) -> None:
        super().mouseReleaseEvent(event)
        item = self.itemAt(event.position().toPoint())
        while item is not None and item.data(JOB) is None:
            item = item.parentItem()
        if item is not None and event.button() == Qt.MouseButton.LeftButton:
            self.job_clicked.emit(int(item.data(JOB)))

    def shown(self) -> dict[int, tuple[str, str]]:
        """Each step's job id: the state written in its box and the colour it is filled with (what a test reads)."""
        return {job_id: (box.state, box.brush().color().name()) for job_id, box in self.boxes.items()}


def summary(flow: dict) -> str:
    """The title line: what the flow is and how far it is."""
    progress = flow["progress"]
    name = f" · {escape(flow['name'])}" if flow["name"] else ""
    counts = " · ".join(
        f'<span style="color:{theme.JOB_STATE[state]}">●</span> {progress[state]:,} {state}'
        for state in JobState
        if progress.get(state)
    )
    done = f"{progress['done']:,} of {progress['total']:,} done"
    return f"<b>{flow['kind'].capitalize()} {flow['id']}{name}</b> — {done} · {counts}"


class FlowWindow(QWidget):
    """The window a workflow or group opens in: its title line and its graph, live while open."""

    job_clicked = Signal(int)  # a step clicked: show its job
    closed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent, Qt.WindowType.Window)
        self.setWindowIcon(theme.icon("app"))
        self.flow_id: int | None = None
        layout = QVBoxLayout(self)
        self.title = QLabel("")
        self.title.setTextFormat(Qt.TextFormat.RichText)
        self.title.setWordWrap(True)
        layout.addWidget(self.title)
        self.graph = FlowGraph()
        self.graph.job_clicked.connect(self.job_clicked)
        layout.addWidget(self.graph, 1)
        hint = QLabel("Click a step to see its job; scroll to zoom, drag to move.", objectName="muted")
        layout.addWidget(hint)
        self.resize(960, 600)

    def open_flow(self, flow_id: int) -> None:
        """Show this flow (its steps arrive with the next snapshot)."""
        self.flow_id = flow_id
        self.setWindowTitle(f"Workflow or group {flow_id}")
        self.title.setText(f"Reading workflow or group {flow_id}…")
        self.graph.show_flow(None)

    def show_flow(self, flow: dict | None) -> None:
        """Draw a snapshot's flow (the one asked for; None: it does not exist, or not read yet)."""
        if flow is None or flow["id"] != self.flow_id:
            return
        if flow.get("missing"):
            self.title.setText(f"There is no workflow or group {flow['id']} in this farm (pruned, or never made).")
            self.graph.show_flow(None)
            return
        self.setWindowTitle(
            f"{flow['kind'].capitalize()} {flow['id']}" + (f" · {flow['name']}" if flow["name"] else "")
        )
        self.title.setText(summary(flow))
        self.graph.show_flow(flow)

    def closeEvent(self, event) -> None:
        super().closeEvent(event)
        self.closed.emit()
