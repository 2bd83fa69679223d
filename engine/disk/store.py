"""The disk tier of the KV cache: full blocks kept as files, found again by their hash.

One file per block, under ``<root>/<model fingerprint>/<KV group>/<block hash>.kvb``
(the root is ``FOLIO_KV_CACHE_DIR``, else ``kv`` in ``FOLIO_CACHE_DIR`` or the user
cache): a short header naming what the
block is (the fingerprint of everything its K/V depends on, the group, its hash chain,
a keyed hash of its tokens, never the tokens: `key.py`; the payload's size and
CRC-32), then the block's K/V bytes as the pool holds them. Safe by construction:

- private: folders 0700 and files 0600 from the moment they are made (`files.py`);
  the root and what an older Folio left under it are tightened at open;
- a file is written under a temporary name and renamed, so a reader (this process after
  a crash, another Folio on the same folder) sees a whole file or none; a killed
  writer's temporary files are removed at open (`scan.py`, counted in ``stats``);
- a load checks the header against the block it wants and the payload against its
  checksum; a corrupt, truncated, foreign or unreadable file is skipped (the block is
  recomputed), counted in the log and removed;
- a write that fails (disk full, read-only folder) turns the tier off with one warning;
- the folder is capped: past ``max_bytes`` the least recently used files go first (a
  load marks a file used), at open too (a smaller cap than before trims the folder).

Writes run on a thread of their own; ``flush`` waits for them.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import struct
import threading
import zlib
from pathlib import Path

from engine.core.kv_stats import DiskTierStats
from engine.disk.files import make_private_dirs, new_nonce, temp_path, write_private
from engine.disk.key import installation_key, tokens_mac
from engine.disk.scan import scan

log = logging.getLogger(__name__)

# 2: the header holds a MAC of the tokens (`key.py`); a version 1 file is a miss.
MAGIC = b"FOLIOKV2"
SUFFIX = ".kvb"
_LEN = struct.Struct("<I")


def kv_cache_root() -> Path:
    import platformdirs

    if os.environ.get("FOLIO_KV_CACHE_DIR"):
        return Path(os.environ["FOLIO_KV_CACHE_DIR"])
    return Path(os.environ.get("FOLIO_CACHE_DIR") or platformdirs.user_cache_dir("folio")) / "kv"


class DiskStore:
    """Block files of every model under ``root``; ``max_bytes`` caps them all."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.enabled = max_bytes > 0
        self._lock = threading.Lock()
        self._files: dict[Path, tuple[int, int]] = {}  # path -> (last use ns, bytes)
        self._bytes = 0
        self.hit_blocks = 0
        self.skipped_files = 0
        self.written_blocks = 0
        self.stale_files = 0  # a killed writer's temporary files removed at open
        self._key = b""
        self._nonce = new_nonce()
        self._tmp_ids = itertools.count()
        self._queue: queue.Queue = queue.Queue()
        self._writer: threading.Thread | None = None
        if self.enabled:
            try:
                self._open()
            except OSError as exc:
                self._turn_off(f"cannot use {self.root}: {exc}")

    # --------------------------------------------------------------- the index
    def _open(self) -> None:
        make_private_dirs(self.root)
        self._key, new_key = installation_key(self.root)
        found = scan(self.root, SUFFIX, MAGIC, drop_old=new_key)
        self._files = found.files
        self._bytes = sum(size for _, size in found.files.values())
        self.stale_files = found.stale_files
        self._enforce_cap()

    def tokens_mac(self, block_hash: bytes, token_ids: tuple[int, ...]) -> str:
        """What a header says of a block's tokens (`key.py`)."""
        return tokens_mac(self._key, block_hash, token_ids)

    def path_for(self, fingerprint: str, group: int, block_hash: bytes) -> Path:
        return self.root / fingerprint / str(group) / (block_hash.hex() + SUFFIX)

    def has(self, path: Path) -> bool:
        if not self.enabled:
            return False
        with self._lock:
            if path in self._files:
                return True
        # Another process may have written it since this one scanned the folder.
        try:
            st = path.stat()
        except OSError:
            return False
        self._remember(path, st.st_mtime_ns, st.st_size)
        return True

    def _remember(self, path: Path, used_ns: int, size: int) -> None:
        with self._lock:
            old = self._files.get(path)
            self._bytes += size - (old[1] if old else 0)
            self._files[path] = (used_ns, size)

    def _forget(self, path: Path, remove: bool) -> None:
        with self._lock:
            old = self._files.pop(path, None)
            if old:
                self._bytes -= old[1]
        if remove:
            try:
                path.unlink()
            except OSError:
                pass

    # ------------------------------------------------------------------ reads
    def load(self, path: Path, header: dict, payload_size: int) -> bytes | None:
        """The payload of the file at ``path`` if its header equals ``header`` and the
        payload has ``payload_size`` bytes and its checksum; else None (counted, logged,
        the file removed)."""
        if not self.enabled:
            return None
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            return self._skip(path, f"unreadable ({exc})", remove=False)
        problem = _check(data, header, payload_size)
        if problem is not None:
            return self._skip(path, problem, remove=True)
        try:
            os.utime(path)  # least recently used goes first
        except OSError:
            pass
        self._remember(path, _now_ns(), len(data))
        with self._lock:
            self.hit_blocks += 1
        return data[-payload_size:]

    def _skip(self, path: Path, why: str, remove: bool) -> None:
        with self._lock:
            self.skipped_files += 1
            count = self.skipped_files
        log.warning("KV disk tier: skipped %s: %s (recomputed; %d skipped so far)",
                    path.name, why, count)
        self._forget(path, remove)
        return None

    # ----------------------------------------------------------------- writes
    def put(self, path: Path, header: dict, payload: bytes) -> None:
        """Write a block file (on the writer thread)."""
        if not self.enabled:
            return
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="folio-kv-disk",
                                            daemon=True)
            self._writer.start()
        self._queue.put((path, header, payload))

    def flush(self) -> None:
        """Wait until every queued block is written (or the tier turned off)."""
        if self._writer is not None:
            self._queue.join()

    def _write_loop(self) -> None:
        while True:
            path, header, payload = self._queue.get()
            try:
                if self.enabled:
                    self._write(path, header, payload)
            finally:
                self._queue.task_done()

    def _write(self, path: Path, header: dict, payload: bytes) -> None:
        head = json.dumps({**header, "size": len(payload),
                           "crc32": zlib.crc32(payload)}, sort_keys=True).encode()
        tmp = temp_path(path, self._nonce, next(self._tmp_ids))
        try:
            make_private_dirs(path.parent)
            write_private(path, tmp, MAGIC + _LEN.pack(len(head)) + head, payload)
        except OSError as exc:
            self._turn_off(f"cannot write {path.parent}: {exc}")
            return
        size = len(MAGIC) + _LEN.size + len(head) + len(payload)
        self._remember(path, _now_ns(), size)
        with self._lock:
            self.written_blocks += 1
        self._enforce_cap()

    def _enforce_cap(self) -> None:
        with self._lock:
            if self._bytes <= self.max_bytes:
                return
            by_age = sorted(self._files.items(), key=lambda item: item[1][0])
        for path, _ in by_age:
            with self._lock:
                if self._bytes <= self.max_bytes:
                    return
            self._forget(path, remove=True)

    def _turn_off(self, why: str) -> None:
        if self.enabled:
            self.enabled = False
            log.warning("KV disk tier turned off: %s; chats go on without it", why)

    # ------------------------------------------------------------------ other
    def clear(self) -> None:
        """Remove every block file this process knows of (the memory panel's Clear)."""
        self.flush()
        with self._lock:
            paths = list(self._files)
        for path in paths:
            self._forget(path, remove=True)

    def stats(self, hit_tokens: int = 0) -> DiskTierStats:
        with self._lock:
            return DiskTierStats(self.enabled, len(self._files), self._bytes, self.max_bytes,
                                 self.hit_blocks, self.skipped_files, self.written_blocks,
                                 hit_tokens, self.stale_files)


def _check(data: bytes, header: dict, payload_size: int) -> str | None:
    """Why ``data`` is not the block file ``header`` describes, or None."""
    if data.startswith(MAGIC[:-1]) and not data.startswith(MAGIC):
        return "another version's file"
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _LEN.size:
        return "not a block file"
    (head_len,) = _LEN.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    try:
        stored = json.loads(data[start:start + head_len])
    except ValueError:
        return "a damaged header"
    if not isinstance(stored, dict):
        return "a damaged header"
    for key, value in header.items():
        if stored.get(key) != value:
            return f"another block's file ({key} differs)"
    payload = data[start + head_len:]
    if stored.get("size") != payload_size or len(payload) != payload_size:
        return "truncated"
    if zlib.crc32(payload) != stored.get("crc32"):
        return "a checksum mismatch"
    return None


def _now_ns() -> int:
    import time

    return time.time_ns()
