"""The disk tier's background reader: block files read and checked off the step loop.

The tier (`tier.py`) submits a ticket per block a prefix hit needs from disk
(engine/core/disk_loads.py); this thread reads each file, checks its header and
checksum (`DiskStore.load`: file reads and zlib's CRC release the GIL, so the step loop
keeps running the other requests meanwhile) and keeps the payload in memory, a staging
buffer, until the tier polls for it and copies it into its block. Reads run in the
order submitted, so the tier copies block i while this thread reads block i + 1.
A cancelled ticket is skipped if not read yet, and dropped if it was.
"""

from __future__ import annotations

import logging
import queue
import threading

from engine.disk.group import GroupDisk

log = logging.getLogger(__name__)

# (ticket, checked payload, or None: missing, corrupt, foreign, unreadable)
Result = tuple[int, bytes | None]


class DiskReader:
    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self._done: list[Result] = []
        self._cancelled: set[int] = set()
        self._ready = threading.Condition()
        self._outstanding = 0
        self._thread: threading.Thread | None = None

    def submit(self, ticket: int, disk: GroupDisk, block_hash: bytes,
               token_ids: tuple[int, ...]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="folio-kv-read",
                                            daemon=True)
            self._thread.start()
        with self._ready:
            self._outstanding += 1
        self._jobs.put((ticket, disk, block_hash, token_ids))

    def cancel(self, ticket: int) -> None:
        with self._ready:
            self._cancelled.add(ticket)

    def poll(self, wait_s: float = 0.0) -> list[Result]:
        """The reads finished since the last poll; with ``wait_s``, wait up to that long
        for at least one while any is outstanding."""
        with self._ready:
            if not self._done and wait_s > 0 and self._outstanding:
                self._ready.wait(wait_s)
            done, self._done = self._done, []
            kept = [r for r in done if r[0] not in self._cancelled]
            self._cancelled.difference_update(r[0] for r in done)
            return kept

    def _loop(self) -> None:
        while True:
            ticket, disk, block_hash, token_ids = self._jobs.get()
            with self._ready:
                skip = ticket in self._cancelled
                if skip:
                    self._cancelled.discard(ticket)
                    self._outstanding -= 1
            if skip:
                continue
            try:
                payload = disk.load(block_hash, token_ids)
            except Exception:  # never leave a waiting request without an answer
                log.exception("KV disk tier: reading a block failed (recomputed)")
                payload = None
            with self._ready:
                self._outstanding -= 1
                self._done.append((ticket, payload))
                self._ready.notify_all()
