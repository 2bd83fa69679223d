"""What was dropped or pasted, sorted before anything is inserted: image files, other
files, image pixels with no file (a copied picture), or text.

This is the one place a drop on the chat or a paste into the composer is read; the
image and document attachments (issues 44 and 45) attach what it sorts. Until a model
can take them, `notice` says in plain words why nothing was attached, and a file's
``file://`` address is never inserted as text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QMimeData, QUrl

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif",
                            ".tiff", ".svg", ".heic", ".avif"})
_NAMES_SHOWN = 2


@dataclass(slots=True, frozen=True)
class Dropped:
    """A drop or paste, sorted. `text` is set only when nothing else came."""

    images: tuple[str, ...] = ()  # local paths of image files
    files: tuple[str, ...] = ()  # local paths of other files
    image_data: bool = False  # pixels with no file behind them
    text: str = ""

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
        return Dropped(image_data=True)
    return Dropped(text=text)


def _names(paths: tuple[str, ...]) -> str:
    names = [Path(p).name for p in paths[:_NAMES_SHOWN]]
    more = len(paths) - len(names)
    return ", ".join(names) + (f" and {more} more" if more else "")


def notice(dropped: Dropped) -> str:
    """Why nothing was attached, in plain words ("" for text)."""
    lines = []
    if dropped.images or dropped.image_data:
        what = f" ({_names(dropped.images)})" if dropped.images else ""
        lines.append(f"Folio can't attach images yet{what}: the models it runs read text "
                     "only.")
    if dropped.files:
        lines.append(f"Folio can't attach files yet ({_names(dropped.files)}): open the "
                     "file and paste the text you want the model to read.")
    return " ".join(lines)
