"""A model download in progress, kept so that it resumes: the files of one repo commit in a
private folder of the Hugging Face cache until all of them are there, then moved into the
cache as huggingface_hub lays it out (no Qt here; desktop_app.services.downloads drives it).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from huggingface_hub import constants
from huggingface_hub import file_download as hf_file_download

PARTIAL_PREFIX = ".folio-partial-"
# Smaller chunks than huggingface_hub's 10 MB default: a cancel and each progress report wait
# for the current chunk.
CHUNK_SIZE = 1024 * 1024


class PartialDownload:
    """A download in progress: ``<cache>/.folio-partial-<repo folder>-<commit>/``, each
    file as ``<name>.part`` while it arrives, ``<name>`` once whole. It outlives a cancel,
    a failure and the process, so the next download of the same commit resumes where the
    bytes stop (an HTTP range request); only a finished set of files moves into the cache
    proper (``publish``), so the model list never sees half a model."""

    def __init__(self, cache: Path, folder: str, commit: str) -> None:
        self.commit = commit
        self.root = cache / f"{PARTIAL_PREFIX}{folder}-{commit}"
        # An older commit's partial download of the same repo can never be finished.
        for stale in cache.glob(f"{PARTIAL_PREFIX}{folder}-*"):
            if stale != self.root:
                shutil.rmtree(stale, ignore_errors=True)

    def kept_bytes(self, names: list[str]) -> int:
        """Bytes of ``names`` already here (whole or in part)."""
        total = 0
        for name in names:
            for path in (self.root / name, self.root / f"{name}.part"):
                if path.is_file():
                    total += path.stat().st_size
        return total

    def fetch(self, name: str, url: str, headers: dict, size: int, progress_class,
              after_write: Callable[[], None]) -> bool:
        """Fetch ``name`` from ``url`` into this folder, resuming its ``.part`` file.
        ``progress_class``: the tqdm stand-in huggingface_hub reports chunks to;
        ``after_write``: called once each chunk is on disk (raising there stops the
        download and keeps that chunk). True when the file was already whole here."""
        whole, part = self.root / name, self.root / f"{name}.part"
        if whole.is_file():
            return True
        self.root.mkdir(parents=True, exist_ok=True)
        resume = part.stat().st_size if part.is_file() else 0
        if resume > size:  # not this file's bytes: start again
            part.unlink()
            resume = 0
        constants.DOWNLOAD_CHUNK_SIZE = min(constants.DOWNLOAD_CHUNK_SIZE, CHUNK_SIZE)
        try:
            with part.open("ab") as out:
                hf_file_download.http_get(url, _Written(out, after_write),
                                          resume_size=resume, headers=headers,
                                          expected_size=size, tqdm_class=progress_class)
        finally:
            if part.is_file() and part.stat().st_size == 0:
                part.unlink()
        os.replace(part, whole)
        return False

    def publish(self, storage: Path, etags: dict[str, str | None]) -> None:
        """Lay the files out as huggingface_hub does (blobs named by etag, the snapshot's
        relative links to them), then move them into the cache (``_publish``)."""
        commit = self.commit
        staged = self.root / "staged"
        snap = staged / "snapshots" / commit
        snap.mkdir(parents=True, exist_ok=True)
        (staged / "blobs").mkdir(exist_ok=True)
        for name, etag in etags.items():
            etag = etag or _local_etag(name)
            blob = staged / "blobs" / etag
            os.replace(self.root / name, blob)
            try:
                os.symlink(Path("..", "..", "blobs", etag), snap / name)
            except OSError:  # no symlinks (Windows without developer mode): the file itself
                os.replace(blob, snap / name)
        _publish(staged, storage, commit)
        shutil.rmtree(self.root, ignore_errors=True)


class _Written:
    """The ``.part`` file as http_get writes it, calling ``after_write`` after each chunk."""

    def __init__(self, out: BinaryIO, after_write: Callable[[], None]) -> None:
        self._out, self._after_write = out, after_write

    def write(self, data: bytes) -> int:
        n = self._out.write(data)
        self._out.flush()
        self._after_write()
        return n

    def __getattr__(self, name: str):  # seek, tell, truncate: the file's own
        return getattr(self._out, name)


def _local_etag(name: str) -> str:
    # A listing without blob ids (a mirror): a stable name for the blob is all that counts.
    return hashlib.sha1(name.encode()).hexdigest()


def _publish(src: Path, dst: Path, commit: str) -> None:
    """Move a finished download into the real cache: blobs first, then the snapshot."""
    if (src / "blobs").is_dir():
        for blob in (src / "blobs").iterdir():
            target = dst / "blobs" / blob.name
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(blob, target)
    src_snap, dst_snap = src / "snapshots" / commit, dst / "snapshots" / commit
    if not dst_snap.exists():
        dst_snap.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src_snap, dst_snap)  # the whole snapshot appears at once
        return
    # Relative symlinks (../../blobs/x) stay valid: both trees have the same layout.
    for entry in sorted(src_snap.rglob("*")):
        if entry.is_symlink() or entry.is_file():
            target = dst_snap / entry.relative_to(src_snap)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(entry, target)
