"""OpenAI's ``file`` content part (``{"type": "file", "file": {"file_data": "data:<media
type>;base64,<bytes>", "filename": "x.pdf"}}``) to the file's bytes, name and type; each
bad part a ValueError naming where it is."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from engine.documents.limits import MAX_FILE_BYTES, MiB

FILE_PART = "file"
DEFAULT_NAME = "attachment"


@dataclass(slots=True, frozen=True)
class FilePart:
    data: bytes
    name: str
    media_type: str | None


def file_part(part: dict, where: str) -> FilePart:
    """``where``: the part's place (``messages[0].content[1]``), for the error."""
    file = part.get("file")
    if not isinstance(file, dict):
        raise ValueError(f"{where}.file: a file part needs its file "
                         "({file_data, filename})")
    if file.get("file_id") is not None:
        raise ValueError(f"{where}.file.file_id: Folio keeps no uploaded files; send the "
                         "file's bytes as file_data (a base64 data URL)")
    for key in file:
        if key not in ("file_data", "filename", "file_id"):
            raise ValueError(f"{where}.file.{key} is not supported by Folio")
    url = file.get("file_data")
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        raise ValueError(f"{where}.file.file_data: must be a base64 data URL "
                         "(data:application/pdf;base64,...)")
    name = file.get("filename")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ValueError(f"{where}.file.filename: must be a file name")
    header, encoded = url[5:].split(";base64,", 1)
    if len(encoded) * 3 // 4 > MAX_FILE_BYTES + 2:
        raise ValueError(f"{where}.file.file_data: {name or DEFAULT_NAME}: over "
                         f"{MAX_FILE_BYTES // MiB} MiB; Folio reads files of at most "
                         f"{MAX_FILE_BYTES // MiB} MiB")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{where}.file.file_data: not valid base64 ({exc})") from exc
    return FilePart(data, (name or DEFAULT_NAME).strip(), header.split(";")[0] or None)


def file_data_url(data: bytes, media_type: str = "application/octet-stream") -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode("ascii")
