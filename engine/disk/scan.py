"""What the disk tier finds in its folder when it opens: the block files to index, and
what must not stay.

- A killed writer's temporary file (`files.stale`) is removed: the size cap, which
  counts block files only, would never reach it.
- When the folder has no key yet (`key.installation_key` made one just now), the
  block files there are an older Folio's, whose headers hold the prompt's tokens in
  clear: each whose format is not this one is removed. Later an older file is only ever
  a miss (its magic differs), removed when read.
- A folder or file an older Folio made readable by others is made private (its owner
  being this user): the root's mode alone would keep others out, but a folder that is
  moved or linked elsewhere keeps its own.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.disk.files import PRIVATE_DIR, PRIVATE_FILE, is_temp, stale, tighten

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Scan:
    files: dict[Path, tuple[int, int]] = field(default_factory=dict)  # (last use ns, bytes)
    stale_files: int = 0
    old_files: int = 0


def scan(root: Path, suffix: str, magic: bytes, drop_old: bool) -> Scan:
    """Index the block files (``suffix``) under ``root`` and clean as above; a file that
    cannot be read or removed is left out of the index."""
    out = Scan()
    tighten(root, root.stat(), PRIVATE_DIR)
    for folder, dirs, names in os.walk(root):
        base = Path(folder)
        for name in dirs:
            try:
                tighten(base / name, (base / name).lstat(), PRIVATE_DIR)
            except OSError:
                pass
        for name in names:
            path = base / name
            try:
                st = path.stat()
                if is_temp(name):
                    if stale(name, st.st_mtime):
                        path.unlink()
                        out.stale_files += 1
                    continue
                if not name.endswith(suffix):
                    continue
                if drop_old and not _has_magic(path, magic):
                    path.unlink()
                    out.old_files += 1
                    continue
                tighten(path, path.lstat(), PRIVATE_FILE)
            except OSError:
                continue
            out.files[path] = (st.st_mtime_ns, st.st_size)
    if out.stale_files:
        log.info("KV disk tier: removed %d temporary files of a killed writer",
                 out.stale_files)
    if out.old_files:
        log.info("KV disk tier: removed %d block files of an older Folio", out.old_files)
    return out


def _has_magic(path: Path, magic: bytes) -> bool:
    with open(path, "rb") as f:
        return f.read(len(magic)) == magic
