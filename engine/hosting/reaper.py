"""A daemon thread that unloads a ModelHost's models idle past their keep-alive
(``folio serve``; tests call ``host.reap()`` themselves with a fake clock)."""

from __future__ import annotations

import logging
import threading

from engine.hosting.host import ModelHost

log = logging.getLogger(__name__)


class Reaper:
    def __init__(self, host: ModelHost, interval_s: float = 1.0) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self._host, self._interval_s = host, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="folio-reaper", daemon=True)

    def start(self) -> Reaper:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                for name in self._host.reap():
                    log.info("unloaded %s: idle past its keep-alive", name)
            except Exception:  # the next round tries again; serving goes on
                log.exception("unloading idle models failed")
