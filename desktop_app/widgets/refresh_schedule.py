"""When the memory panel reads new figures: never by polling an idle engine.

A local engine's figures change only while it runs requests (the worker's snapshots, see
engine/worker.py), so the panel polls only while the engine is active and the panel is
visible, and otherwise reads once when something happens: a reply ends, a model loads or
unloads, the panel is shown (VramPanel calls `refresh` itself for those). A remote server's
figures change with other clients' requests too: they are polled while the panel is
visible, more slowly.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer

BUSY_INTERVAL_MS = 400
REMOTE_INTERVAL_MS = 1500


class RefreshSchedule(QObject):
    """Runs `timer` (calling `refresh`) only while the panel is visible and its figures
    can change on their own: the engine active, or a remote model."""

    def __init__(self, refresh: Callable[[], None], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.timer = QTimer(self)
        self.timer.timeout.connect(refresh)
        self.active = False
        self.visible = False
        self.remote = False

    def set_active(self, active: bool) -> None:
        self.active = active
        self._update()

    def set_visible(self, visible: bool) -> None:
        self.visible = visible
        self._update()

    def set_remote(self, remote: bool) -> None:
        self.remote = remote
        self._update()

    @property
    def polling(self) -> bool:
        return self.visible and (self.active or self.remote)

    def _update(self) -> None:
        if not self.polling:
            self.timer.stop()
            return
        interval = BUSY_INTERVAL_MS if self.active else REMOTE_INTERVAL_MS
        if not self.timer.isActive() or self.timer.interval() != interval:
            self.timer.start(interval)
