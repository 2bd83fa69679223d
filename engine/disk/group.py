"""One KV group's view of the disk store (`engine/disk/store.py`): a block's file
named by its hash chain under the group's fingerprint, and that fingerprint: everything a
block's K/V depends on, so a file from another model, dtype or layout is never found (and
one swapped in by hand fails its header check: the header's hash, and the MAC of the
block's tokens that stands in for them, `key.py`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from engine.disk.store import DiskStore


def model_identity(path: str | Path) -> list:
    """The model file's (or folder's files') names, sizes and modification times."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    out = [str(path.resolve())]
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            continue
        out.append([f.name, st.st_size, st.st_mtime_ns])
    return out


def fingerprint(*parts: object) -> str:
    h = hashlib.blake2b(repr(parts).encode(), digest_size=16)
    return h.hexdigest()


class GroupDisk:
    """KV group ``group``'s view of the store: the `LowerTier` its `TierBlocks` asks
    (engine/core/tier_blocks.py), and what the tier reads and writes."""

    def __init__(self, store: DiskStore, model_fingerprint: str, group: int,
                 payload_size: int) -> None:
        self.store = store
        self.fingerprint = model_fingerprint
        self.group = group
        self.payload_size = payload_size
        # Blocks whose file failed a read: a miss from then on, even if the file stays
        # (an unreadable one is not removed), so a retried request never waits on it.
        self.bad: set[bytes] = set()

    def _path(self, block_hash: bytes) -> Path:
        return self.store.path_for(self.fingerprint, self.group, block_hash)

    def _header(self, block_hash: bytes, token_ids: tuple[int, ...]) -> dict:
        # The tokens as a MAC, never in clear: checked as surely, read by no one.
        return {"fingerprint": self.fingerprint, "group": self.group,
                "hash": block_hash.hex(),
                "tokens_mac": self.store.tokens_mac(block_hash, token_ids)}

    def has(self, block_hash: bytes) -> bool:
        return block_hash not in self.bad and self.store.has(self._path(block_hash))

    def load(self, block_hash: bytes, token_ids: tuple[int, ...]) -> bytes | None:
        """The block's checked content, or None (missing, corrupt, foreign)."""
        payload = self.store.load(self._path(block_hash),
                                  self._header(block_hash, token_ids), self.payload_size)
        if payload is None:
            self.bad.add(block_hash)
        return payload

    def save(self, block_hash: bytes, token_ids: tuple[int, ...], payload: bytes) -> None:
        self.bad.discard(block_hash)  # a fresh, whole file
        self.store.put(self._path(block_hash), self._header(block_hash, token_ids), payload)
