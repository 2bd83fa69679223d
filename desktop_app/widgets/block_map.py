"""The live block map: one cell per KV block, colored by state, owners in the tooltip; a
dot marks a block holding an image's tokens.

A pool has thousands of blocks and the panel refreshes a few times a second while the
engine runs, but a step changes only a few of them: a refresh asks Qt to repaint just the
cells whose state changed, and a paint fills only the cells inside the region asked for.
The map's height is fixed (cells shrink to fit it), so the dock keeps its layout when a
model loads, unloads or brings a pool of another size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtCore import QEvent, QPoint, QRect, QSize, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from desktop_app.widgets import theme

STATES = ("free", "cached", "used", "shared")
_GAP = 1
_MIN_CELL = 2
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
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(_MAX_HEIGHT)
        self._blocks: list = []
        # Each cell's state and image mark as last painted or asked for.
        self._states: list[tuple[str, bool]] = []
        # Maps an owner label ("request_id:index") to something a person reads.
        self.describe_owner: Callable[[str], str] = lambda owner: owner

    @property
    def blocks(self) -> list:
        return self._blocks

    def set_blocks(self, blocks: Sequence) -> None:
        """Show `blocks`; only the cells whose state (or image mark) changed are
        repainted (all of them when the pool's size changed, as every cell moves)."""
        states = [(block.state, getattr(block, "image", False)) for block in blocks]
        old, self._blocks, self._states = self._states, list(blocks), states
        if len(states) != len(old):
            self._fit_height()
            self.update()
            return
        for i, (before, now) in enumerate(zip(old, states, strict=True)):
            if before != now:
                self.update(self.cell_rect(i))

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

    def grid_height(self, width: int) -> int:
        """The height the cells take at `width` (at most the widget's fixed height)."""
        if not self._blocks:
            return 0
        rows = -(-len(self._blocks) // self._columns(width))
        return rows * (self._cell_size(width) + _GAP)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(240, _MAX_HEIGHT)

    def _fit_height(self) -> None:
        # Only a pool too big for the smallest cells grows the map past its fixed height.
        self.setFixedHeight(max(_MAX_HEIGHT, self.grid_height(self.width())))

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._fit_height()

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
    def cells_in(self, rect: QRect) -> range:
        """The indices of the cells in the rows `rect` crosses (a paint fills no others)."""
        step = self._cell_size(self.width()) + _GAP
        cols = self._columns(self.width())
        first = max(0, rect.top() // step) * cols
        last = (max(0, rect.bottom()) // step + 1) * cols
        return range(first, min(last, len(self._blocks)))

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        colors = {s: state_color(s) for s in STATES}
        mark = QColor(theme.current().text)
        area = event.rect()
        for i in self.cells_in(area):
            cell = self.cell_rect(i)
            if cell.intersects(area):
                state, image = self._states[i]
                painter.fillRect(cell, colors.get(state, colors["free"]))
                if image and cell.width() >= 4:
                    # A dot in the middle: the block holds an image's tokens.
                    side = max(2, cell.width() // 3)
                    painter.fillRect(QRect(cell.center().x() - side // 2,
                                           cell.center().y() - side // 2, side, side), mark)
        painter.end()

    def tooltip_for(self, block) -> str:
        lines = [f"Block {block.block_id}: {block.state}, ref count {block.ref_count}"]
        if getattr(block, "image", False):
            lines.append("Holds an image's tokens")
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
