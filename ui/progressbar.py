"""A running job's progress as a bar in the jobs table's state cell (context.progress, written by its node about
once a second).

The model says what the cells read (the state, and the progress with its message in the state's tooltip and its own
column); this delegate only paints: the state's dot, then a bar filled to the row's fraction with its percentage on
it, where "running" would be. A job not running, or silent, is drawn as any other cell."""

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QStyle, QStyledItemDelegate, QStyleOptionViewItem

from queueprocessor.rules.states import Outcome

from . import theme
from .models import ROW_ROLE, running_fraction


class ProgressDelegate(QStyledItemDelegate):
    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index) -> None:
        row = index.data(ROW_ROLE)
        fraction = running_fraction(row) if row else None
        if fraction is None:
            super().paint(painter, option, index)
            return
        item = QStyleOptionViewItem(option)
        self.initStyleOption(item, index)
        item.text = ""  # the bar says it
        style = option.widget.style() if option.widget else None
        if style is not None:  # the row's background, selection and the state's dot, as any cell draws them
            style.drawControl(QStyle.ControlElement.CE_ItemViewItem, item, painter, option.widget)
            text = style.subElementRect(QStyle.SubElement.SE_ItemViewItemText, item, option.widget)
        else:
            text = option.rect
        scheme = theme.current()
        track = QRectF(text).adjusted(1, 4, -3, -4)
        filled = QRectF(track)
        filled.setWidth(track.width() * fraction)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor(scheme.border))
        painter.drawRoundedRect(track, 3, 3)
        painter.setBrush(QColor(theme.OUTCOME[Outcome.RUNNING]))
        painter.drawRoundedRect(filled, 3, 3)
        painter.setPen(QColor(scheme.text))
        painter.drawText(track, Qt.AlignmentFlag.AlignCenter, f"{fraction:.0%}")
        painter.restore()
