"""The memory panel's chart: the share of the KV pool in use over the last few minutes."""

from __future__ import annotations

import time
from collections import deque

from PySide6.QtCore import QPointF, QSize
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QWidget

from desktop_app.widgets import theme
from desktop_app.widgets.memory_rows import format_percent
from desktop_app.widgets.refresh_schedule import BUSY_INTERVAL_MS

HISTORY_SECONDS = 300.0


class Sparkline(QWidget):
    """KV usage (fraction of the pool in use) over the last few minutes.

    Samples come only while the engine runs (the panel does not poll an idle one), and
    usage does not change while it is idle: after a gap the line steps instead of sloping
    across it, and the last value runs on to the right edge, which is now."""

    GAP_S = 2 * BUSY_INTERVAL_MS / 1000  # longer without a sample: the engine was idle

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("kvSparkline")
        self.samples: deque[tuple[float, float]] = deque()
        self.clock = time.monotonic
        self.setMinimumHeight(48)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(240, 56)

    def add(self, fraction: float, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        if self.samples and now - self.samples[-1][0] > self.GAP_S:
            self.samples.append((now, self.samples[-1][1]))
        self.samples.append((now, fraction))
        while self.samples and now - self.samples[0][0] > HISTORY_SECONDS:
            self.samples.popleft()
        self.update()

    def scale(self) -> float:
        """The fraction at the top of the chart: small usage still shows a shape."""
        peak = max((frac for _, frac in self.samples), default=0.0)
        return min(1.0, max(0.05, peak * 1.25))

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt override
        c = theme.current()
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        w, h = self.width(), self.height()
        painter.fillRect(0, 0, w, h, QColor(c.base))
        painter.setPen(QPen(QColor(c.border), 1))
        painter.drawRect(0, 0, w - 1, h - 1)
        top = self.scale()
        if self.samples:
            newest = max(self.samples[-1][0], self.clock())
            path = QPainterPath()
            for i, (t, frac) in enumerate([*self.samples, (newest, self.samples[-1][1])]):
                x = (w - 2) * (1 - (newest - t) / HISTORY_SECONDS) + 1
                y = (h - 3) * (1 - min(1.0, max(0.0, frac / top))) + 1
                path.moveTo(x, y) if i == 0 else path.lineTo(x, y)
            fill = QPainterPath(path)
            fill.lineTo(QPointF(w - 1, h - 1))
            fill.lineTo(QPointF(path.elementAt(0).x, h - 1))
            area = QColor(c.accent)
            area.setAlpha(50)
            painter.fillPath(fill, area)
            painter.setPen(QPen(QColor(c.accent), 1.5))
            painter.drawPath(path)
        if self.samples:
            painter.setPen(QColor(c.muted))
            painter.drawText(6, 14, f"now {format_percent(self.samples[-1][1])} · "
                                    f"scale {format_percent(top)}")
        painter.end()


