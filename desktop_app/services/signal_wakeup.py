"""Ctrl+C in the terminal while Qt's event loop sleeps.

Python runs a signal handler only between bytecodes, and Qt's loop runs none while it
waits for events, so a SIGINT would wait for the next event. Instead of a timer waking
Python a few times a second (CPU an idle app would spend for nothing), the C-level
handler writes the signal's number to a socket (signal.set_wakeup_fd) that a
QSocketNotifier watches: reading it runs Python code, and with it the handler.
"""

from __future__ import annotations

import signal
import socket

from PySide6.QtCore import QObject, QSocketNotifier


class SignalWakeup(QObject):
    """While it lives, a signal with a Python handler wakes the Qt event loop."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._read, self._write = socket.socketpair()
        for sock in (self._read, self._write):
            sock.setblocking(False)
        self._previous = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        self.notifier = QSocketNotifier(self._read.fileno(), QSocketNotifier.Type.Read, self)
        self.notifier.activated.connect(self._drain)

    def _drain(self) -> None:
        try:
            while self._read.recv(512):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous)
        self.notifier.setEnabled(False)
        self._read.close()
        self._write.close()
