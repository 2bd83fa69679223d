"""The live block map: one cell per KV block, colored by state, owners in the tooltip."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtCore import QEvent, QPoint, QRect, QSize, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from desktop_app.widgets import theme

STATES = ("free", "cached", "used", "shared")
_GAP = 1
_MIN_CELL = 5
_MAX_CELL = 14
_MAX_HEIGHT = 220


def state_color(state: str) -> QColor:
    c = theme.current()
    return QColor({"free": c.block_free, "cached": c.block_cached, "used": c.block_used,
                   "shared": c.block_shared}.get(state, c.block_free))


class BlockMap(QWidget):
    """Paints `blocks` (engine BlockInfo objects) as a grid; hover shows who owns a cell."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("blockMap")
        self.setMouseTracking(True)
        sp = QSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        sp.setHeightForWidth(True)
        self.setSizePolicy(sp)
        self._blocks: list = []
        # Maps an owner label ("request_id:index") to something a person reads.
        self.describe_owner: Callable[[str], str] = lambda owner: owner

    @property
    def blocks(self) -> list:
        return self._blocks

    def set_blocks(self, blocks: Sequence) -> None:
        resized = len(blocks) != len(self._blocks)
        self._blocks = list(blocks)
        if resized:
            self.updateGeometry()
        self.update()

    # -- geometry ----------------------------------------------------------------------
    def _cell_size(self, width: int) -> int:
        n = max(1, len(self._blocks))
        # The largest cell that fits every block within the height cap.
        for cell in range(_MAX_CELL, _MIN_CELL - 1, -1):
            cols = max(1, (width + _GAP) // (cell + _GAP))
            rows = -(-n // cols)
            if rows * (cell + _GAP) <= _MAX_HEIGHT:
                return cell
        return _MIN_CELL

    def _columns(self, width: int) -> int:
        return max(1, (width + _GAP) // (self._cell_size(width) + _GAP))

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt override
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt override
        if not self._blocks:
            return _MIN_CELL
        cols = self._columns(width)
        rows = -(-len(self._blocks) // cols)
        return rows * (self._cell_size(width) + _GAP)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(240, self.heightForWidth(240))

    def cell_rect(self, index: int) -> QRect:
        cell = self._cell_size(self.width())
        cols = self._columns(self.width())
        row, col = divmod(index, cols)
        return QRect(col * (cell + _GAP), row * (cell + _GAP), cell, cell)

    def block_at(self, pos: QPoint):
        cell = self._cell_size(self.width())
        cols = self._columns(self.width())
        col, row = pos.x() // (cell + _GAP), pos.y() // (cell + _GAP)
        if col >= cols or pos.x() < 0 or pos.y() < 0:
            return None
        index = row * cols + col
        return self._blocks[index] if index < len(self._blocks) else None

    # -- painting and tooltips -------------------------------------------------------------
    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        colors = {s: state_color(s) for s in STATES}
        for i, block in enumerate(self._blocks):
            painter.fillRect(self.cell_rect(i), colors.get(block.state, colors["free"]))
        painter.end()

    def tooltip_for(self, block) -> str:
        lines = [f"Block {block.block_id}: {block.state}, ref count {block.ref_count}"]
        if block.owners:
            lines.append("Owners:")
            lines.extend(f"  {self.describe_owner(o)}" for o in block.owners)
        elif block.state == "cached":
            lines.append("Holds a reusable prefix; free to evict")
        return "\n".join(lines)

    def event(self, event) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            block = self.block_at(event.pos())
            if block is None:
                QToolTip.hideText()
                event.ignore()
            else:
                QToolTip.showText(event.globalPos(), self.tooltip_for(block), self)
            return True
        return super().event(event)


class Legend(QWidget):
    """A row of colored squares naming the block states."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(18)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(240, 18)

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        x = 0
        metrics = painter.fontMetrics()
        painter.setPen(self.palette().color(self.foregroundRole()))
        for state in STATES:
            painter.fillRect(QRect(x, 4, 10, 10), state_color(state))
            x += 14
            painter.drawText(QRect(x, 0, 200, 18), Qt.AlignmentFlag.AlignVCenter, state)
            x += metrics.horizontalAdvance(state) + 12
        painter.end()
