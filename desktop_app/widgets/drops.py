"""What was dropped or pasted, sorted before anything is inserted: image files, other
files, image pixels with no file (a copied picture, kept as PNG bytes), or text.

This is the one place a drop on the chat or a paste into the composer is read; the
attach controls (controllers/attach.py) attach what it sorts. A file's ``file://``
address is never inserted as text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QBuffer, QIODevice, QMimeData, QUrl
from PySide6.QtGui import QImage

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif",
                            ".tiff", ".svg", ".heic", ".avif"})


@dataclass(slots=True, frozen=True)
class Dropped:
    """A drop or paste, sorted. `text` is set only when nothing else came."""

    images: tuple[str, ...] = ()  # local paths of image files
    files: tuple[str, ...] = ()  # local paths of other files
    image_data: bool = False  # pixels with no file behind them
    text: str = ""
    image_png: bytes = b""  # those pixels as PNG ("" when they could not be read)

    @property
    def has_attachments(self) -> bool:
        return bool(self.images or self.files or self.image_data)


def _file_lines(text: str) -> list[str]:
    """The local paths in `text` when every line of it is a file:// address (what some
    file managers put on the clipboard as plain text); else none."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines or not all(line.startswith("file://") for line in lines):
        return []
    return [QUrl(line).toLocalFile() for line in lines]


def classify(mime: QMimeData) -> Dropped:
    paths = [url.toLocalFile() for url in mime.urls() if url.isLocalFile()]
    text = mime.text() if mime.hasText() else ""
    if not paths:
        paths = _file_lines(text)
    if paths:
        images = tuple(p for p in paths if Path(p).suffix.lower() in IMAGE_SUFFIXES)
        files = tuple(p for p in paths if p not in images)
        return Dropped(images=images, files=files)
    if mime.hasImage():
        return Dropped(image_data=True, image_png=_png(mime.imageData()))
    return Dropped(text=text)


def _png(image: object) -> bytes:
    if not isinstance(image, QImage) or image.isNull():
        return b""
    buffer = QBuffer()
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    return bytes(buffer.data())
