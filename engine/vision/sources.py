"""An image content part to its bytes.

Two shapes reach the engine: Folio's own ``{"type": "image", "image": ...}`` (bytes, or a
``data:`` URL) and OpenAI's ``{"type": "image_url", "image_url": {"url": ...}}`` (a
``data:`` URL; the server turns an http(s) URL into bytes first, and only when it was
started with ``--allow-image-urls``: engine/serve/image_urls.py). The engine itself never
fetches anything.
"""

from __future__ import annotations

import base64
import binascii

IMAGE_PART_TYPES = ("image", "image_url")
# The MIME types a data: URL may name (the decoder checks the bytes themselves).
IMAGE_MIME_TYPES = ("image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif")


def part_url(part: dict, where: str) -> str | bytes:
    """The part's image: bytes, or its URL (a string)."""
    if part.get("type") == "image":
        value = part.get("image")
    else:
        value = part.get("image_url")
        if isinstance(value, dict):
            value = value.get("url")
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if not isinstance(value, str) or not value:
        field = "image" if part.get("type") == "image" else "image_url.url"
        raise ValueError(f"{where}.{field}: an image part needs its image (a data: URL)")
    return value


def image_bytes(part: dict, where: str) -> bytes:
    """The part's image bytes; ValueError naming the field for a URL that is not a
    base64 ``data:`` URL of an image type."""
    value = part_url(part, where)
    if isinstance(value, bytes):
        return value
    field = f"{where}.image" if part.get("type") == "image" else f"{where}.image_url.url"
    if value.startswith(("http://", "https://")):
        raise ValueError(f"{field}: http(s) image URLs are not fetched (a local server that "
                         "fetches any URL it is handed is a request forgery hole); send the "
                         "image as a data: URL, or start the server with --allow-image-urls")
    return decode_data_url(value, field)


def decode_data_url(url: str, field: str) -> bytes:
    if not url.startswith("data:"):
        raise ValueError(f"{field}: not a data: URL (data:image/png;base64,...)")
    header, sep, payload = url[5:].partition(",")
    if not sep:
        raise ValueError(f"{field}: a data: URL needs a comma before its data")
    mime, *params = header.split(";")
    if mime.lower() not in IMAGE_MIME_TYPES:
        raise ValueError(f"{field}: {mime or 'no type'!r} is not an image type Folio reads "
                         "(PNG, JPEG, WebP, GIF)")
    if "base64" not in (p.lower() for p in params):
        raise ValueError(f"{field}: the image's data: URL must be base64 (;base64,)")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{field}: the data: URL's base64 is invalid") from None
