"""Ctrl+C reaches the app while Qt's event loop sleeps, with no timer polling for it."""

from __future__ import annotations

import signal

from desktop_app.services.signal_wakeup import SignalWakeup


def test_a_signal_wakes_the_event_loop_and_runs_its_handler(qtbot):
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: seen.append(signum))
    wakeup = SignalWakeup()
    try:
        with qtbot.waitSignal(wakeup.notifier.activated, timeout=2000):
            signal.raise_signal(signal.SIGINT)
        assert seen == [signal.SIGINT]
    finally:
        wakeup.close()
        signal.signal(signal.SIGINT, previous)
    assert signal.set_wakeup_fd(-1) == -1  # close() put the previous wakeup fd back
