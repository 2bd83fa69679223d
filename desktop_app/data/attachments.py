"""A message's attachments (no Qt here): images and documents, read and checked once when
they are attached, stored by content hash (chat_store), and turned into the content parts
each kind of model takes.

``read_attachment`` refuses what no model could use, with a message naming the file: an
image that is not PNG, JPEG, WebP or GIF or does not decode (engine.vision.decode), a
document whose text cannot be read (an encrypted PDF, a scan, a DOCX zip bomb:
engine.documents.extract), a file over the limit, an unknown type. It reads a document's
text once to say so, and keeps its page or section count for the chip.

Parts: a local model gets the engine's own (``{"type": "image", "image": bytes}``, OpenAI's
``file`` part with a data URL); a server gets OpenAI's (``image_url`` with a data URL,
the same ``file`` part).
"""

from __future__ import annotations

import base64
import hashlib
import mimetypes
from dataclasses import dataclass, replace
from pathlib import Path, PurePath
from typing import Any

from engine.documents import DocumentError, extract
from engine.documents.extract import KINDS_TEXT, TEXT_SUFFIXES
from engine.documents.limits import MAX_FILE_BYTES, MiB
from engine.vision.decode import ImageError, decode_image

IMAGE = "image"
FILE = "file"
KINDS = (IMAGE, FILE)
# The formats the engine decodes (engine.vision.decode.FORMATS), by suffix.
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
               ".webp": "image/webp", ".gif": "image/gif"}
_FORMAT_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp",
                 "GIF": "image/gif"}
MAX_IMAGE_BYTES = 20 * MiB
DOCUMENT_SUFFIXES = (".pdf", ".docx", ".md", ".markdown", ".html", ".htm", ".txt")
_DOCUMENT_TYPES = {
    ".pdf": "application/pdf", ".md": "text/markdown", ".markdown": "text/markdown",
    ".html": "text/html", ".htm": "text/html",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document"}
_SECTION_WORDS = {"pdf": "page"}


class AttachmentError(ValueError):
    """A file that cannot be attached; the message names the file and why."""


@dataclass(slots=True, frozen=True)
class Attachment:
    """One attached image or document. ``data`` is None for one read back from the store
    without its bytes (``ChatStore.attachment_data`` has them, by ``sha256``).
    ``detail``: what the chip says besides the name ("3 pages", "12 sections")."""

    kind: str
    name: str
    media_type: str
    sha256: str
    size: int
    detail: str = ""
    data: bytes | None = None

    def without_data(self) -> Attachment:
        return replace(self, data=None)


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_image_name(name: str) -> bool:
    return PurePath(name).suffix.lower() in IMAGE_TYPES


def image_filter() -> str:
    images = " ".join(f"*{s}" for s in IMAGE_TYPES)
    return f"Images ({images});;All files (*)"


def dialog_filter(images: bool = True) -> str:
    """The file dialog's filter: documents (and images where the model sees them)
    first, then every file."""
    image_globs = " ".join(f"*{s}" for s in IMAGE_TYPES)
    documents = " ".join(f"*{s}" for s in sorted({*DOCUMENT_SUFFIXES, *TEXT_SUFFIXES}))
    if not images:
        return f"Documents ({documents});;All files (*)"
    return (f"Images and documents ({image_globs} {documents});;Images ({image_globs});;"
            f"Documents ({documents});;All files (*)")


def read_file(path: str | Path) -> Attachment:
    """The file at ``path``, checked (AttachmentError naming it)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise AttachmentError(_over(path.name, size, MAX_FILE_BYTES))
        data = path.read_bytes()
    except OSError as exc:
        raise AttachmentError(f"{path.name}: could not be read ({exc.strerror or exc})"
                              ) from None
    return read_attachment(path.name, data)


def read_attachment(name: str, data: bytes, media_type: str | None = None) -> Attachment:
    """``data`` named ``name`` as an image (by its suffix or type) or a document."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("name: an attachment needs a file name")
    if is_image_name(name) or (media_type or "").startswith("image/"):
        return read_image(name, data)
    return read_document(name, data, media_type)


def read_image(name: str, data: bytes) -> Attachment:
    if len(data) > MAX_IMAGE_BYTES:
        raise AttachmentError(_over(name, len(data), MAX_IMAGE_BYTES))
    try:
        decoded = decode_image(data, name)
    except ImageError as exc:
        raise AttachmentError(str(exc)) from None
    width, height = decoded.source_size
    return Attachment(IMAGE, name, _FORMAT_TYPES[decoded.format], sha256_of(data), len(data),
                      f"{width} × {height}", bytes(data))


def read_document(name: str, data: bytes, media_type: str | None = None) -> Attachment:
    if len(data) > MAX_FILE_BYTES:
        raise AttachmentError(_over(name, len(data), MAX_FILE_BYTES))
    try:
        document = extract(data, name, media_type)
    except DocumentError as exc:
        raise AttachmentError(str(exc)) from None
    word = _SECTION_WORDS.get(document.kind, "section")
    count = len(document.sections)
    detail = f"{count} {word}{'s' if count != 1 else ''}"
    suffix = PurePath(name).suffix.lower()
    media = (_DOCUMENT_TYPES.get(suffix) or media_type or mimetypes.guess_type(name)[0]
             or ("text/plain" if document.kind == "text" else "application/octet-stream"))
    return Attachment(FILE, name, media, sha256_of(data), len(data), detail, bytes(data))


def _over(name: str, size: int, limit: int) -> str:
    return (f"{name}: {size / MiB:.1f} MiB is over the limit; Folio attaches files of at "
            f"most {limit // MiB} MiB")


def data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode("ascii")


def engine_part(attachment: Attachment, data: bytes) -> dict[str, Any]:
    """The engine's content part for it (a local model)."""
    if attachment.kind == IMAGE:
        return {"type": "image", "image": data}
    return {"type": "file", "file": {"file_data": data_url(attachment.media_type, data),
                                     "filename": attachment.name}}


def image_type(data: bytes) -> str:
    """An image's media type from its first bytes (the formats read_image accepts)."""
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    if data.startswith(b"GIF8"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return "image/png"


def openai_part(part: dict[str, Any]) -> dict[str, Any]:
    """An engine part as OpenAI's API takes it (a server): an image's bytes as an
    ``image_url`` data URL; text and file parts as they are."""
    if part.get("type") == "image" and isinstance(part.get("image"), bytes):
        data = part["image"]
        return {"type": "image_url", "image_url": {"url": data_url(image_type(data), data)}}
    return part


def message_content(text: str, attachments, data_of) -> Any:
    """A user message's content for the engine: its text alone, or each attachment's
    part in order and then the text. ``data_of(sha256)``: the bytes of one stored
    without them."""
    if not attachments:
        return text
    parts: list[dict[str, Any]] = [
        engine_part(a, a.data if a.data is not None else data_of(a.sha256))
        for a in attachments]
    if text:
        parts.append({"type": "text", "text": text})
    return parts


def with_prompt_modes(attachments, prompt) -> list[Attachment]:
    """The attachments with each document's tokens and mode as the engine's prompt
    (``ChatPrompt.documents``: whole, or searched) read it, in its chip's detail."""
    documents = {d.sha256: d for d in getattr(prompt, "documents", ()) or ()}
    out = []
    for a in attachments:
        doc = documents.get(a.sha256) if a.kind == FILE else None
        if doc is not None:
            mode = "whole" if doc.mode == "whole" else "searched"
            base = a.detail.split(" · ")[0]
            a = replace(a, detail=f"{base} · {doc.tokens:,} tokens · {mode}")
        out.append(a)
    return out


def openai_content(content: Any) -> Any:
    """A message's content for a server: a text stays text, parts become OpenAI's."""
    if isinstance(content, list):
        return [openai_part(p) for p in content if isinstance(p, dict)]
    return content


def content_text(content: Any) -> str:
    """The text of a message's content, whether a string or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content
                         if isinstance(p, dict) and p.get("type") == "text")
    return ""


def size_text(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    if size < MiB:
        return f"{size / 1024:.0f} KB"
    return f"{size / MiB:.1f} MB"


KNOWN_TYPES = f"images (PNG, JPEG, WebP, GIF) and documents ({KINDS_TEXT})"
