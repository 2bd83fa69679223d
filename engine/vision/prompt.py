"""Images in the prompt builder: a message's image parts become the model's image
marker in its text, and after the template is rendered and tokenized each marker
token becomes the image's own tokens (the expansion its processor writes), recorded as
an ``ImageSpan`` for the prefix cache and the runner.

The expansion happens on ids, after the template, as transformers' processors do it on
text: the template sees one marker per image wherever the user put it, and the image's
tokens (hundreds) never pass through the template. A text that holds the marker itself
(``<image>`` typed by the user) is refused by name, since it would be taken for an image.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from engine.core.sequence import ImageSpan
from engine.vision.decode import decode_image
from engine.vision.model import PreparedImage, VisionModel
from engine.vision.sources import IMAGE_PART_TYPES, image_bytes

TEXT_PART = "text"
_RECENT = 32  # prepared images kept by their bytes: a chat's history is decoded once


class ImageReader:
    """Image parts to prepared images for one vision model; thread-safe (the prompt
    builder runs on its callers' threads; two threads may decode one image twice)."""

    def __init__(self, vision: VisionModel) -> None:
        self.vision = vision
        self._recent: OrderedDict[bytes, PreparedImage] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, part: dict, where: str) -> PreparedImage:
        data = image_bytes(part, where)
        digest = hashlib.blake2b(data, digest_size=16).digest()
        with self._lock:
            prepared = self._recent.get(digest)
        if prepared is None:
            prepared = self.vision.prepare(decode_image(data, where))
            with self._lock:
                self._recent[digest] = prepared
                while len(self._recent) > _RECENT:
                    self._recent.popitem(last=False)
        return prepared

    def message(self, message: dict, i: int) -> tuple[dict, list[PreparedImage]]:
        """``message`` with its content as text, each image a marker; its images."""
        content = message.get("content")
        if not isinstance(content, list):
            return message, []
        where = f"messages[{i}].content"
        texts: list[str] = []
        images: list[PreparedImage] = []
        marker = self.vision.image_token
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind == TEXT_PART and isinstance(part.get("text"), str):
                if marker in part["text"]:
                    raise ValueError(f"{where}[{j}].text: holds {marker!r}, this model's "
                                     "image marker; attach the image as an image part")
                texts.append(part["text"])
            elif kind in IMAGE_PART_TYPES:
                images.append(self.read(part, f"{where}[{j}]"))
                texts.append(self.vision.marker_text)
            elif kind == TEXT_PART:
                raise ValueError(f"{where}[{j}].text: a text part needs its text")
            else:
                raise ValueError(f"{where}[{j}].type: {kind!r} parts are not supported "
                                 "(text, image, image_url)")
        return {**message, "content": "".join(texts)}, images


def expand_images(ids: list[int], images: list[PreparedImage], marker_id: int,
                  encode) -> tuple[list[int], tuple[ImageSpan, ...]]:
    """``ids`` with the k-th ``marker_id`` replaced by image k's tokens (``encode`` of
    its text), and each image's span. ValueError when the rendered prompt holds a
    different number of markers than there are images (a template that drops images)."""
    found = [p for p, t in enumerate(ids) if t == marker_id]
    if len(found) != len(images):
        raise ValueError(f"messages: {len(images)} image(s) sent, but the chat template "
                         f"rendered {len(found)}; this template does not show images")
    out: list[int] = []
    spans: list[ImageSpan] = []
    last = 0
    for place, image in zip(found, images, strict=True):
        out += ids[last:place]
        tokens = encode(image.text)
        spans.append(ImageSpan(len(out), len(out) + len(tokens), image.key, image, image.grid))
        out += tokens
        last = place + 1
    out += ids[last:]
    return out, tuple(spans)
