"""PySide6 6.12.0 on CPython 3.11 loses a reference to None on every Qt call that
returns None, and the app aborts ("none_dealloc") after minutes of streaming; that is
why pyproject.toml keeps PySide6 below 6.12. This test catches a binding that leaks."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject


def test_qt_calls_do_not_leak_references_to_none(qapp):
    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(1000):
        probe.setObjectName("probe")
    assert before - sys.getrefcount(None) < 100
