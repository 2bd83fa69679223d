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
                  encode, joint_id: int | None = None, decode=None,
                  special_ids: frozenset[int] = frozenset()
                  ) -> tuple[list[int], tuple[ImageSpan, ...]]:
    """``ids`` with the k-th ``marker_id`` replaced by image k's tokens (``encode`` of
    its text), and each image's span. ValueError when the rendered prompt holds a
    different number of markers than there are images (a template that drops images).
    ``joint_id``: for a model whose image tokens attend to each other both ways, the
    image token's id; each span's run of them is its ``joint`` range.

    An image text that opens or closes with text of its own (Gemma 3's newlines) is
    tokenized together with the text it joins (``decode``: back to the last special
    token and on to the next one, ``special_ids``), as a processor tokenizes the whole
    expanded prompt: "user\n" then "\n\n<start_of_image>" are one run of newlines to
    the tokenizer. The span is then the image text's special tokens and what lies
    between them."""
    found = [p for p, t in enumerate(ids) if t == marker_id]
    if len(found) != len(images):
        raise ValueError(f"messages: {len(images)} image(s) sent, but the chat template "
                         f"rendered {len(found)}; this template does not show images")
    out: list[int] = []
    spans: list[ImageSpan] = []
    last = 0
    for place, image in zip(found, images, strict=True):
        out += ids[last:place]
        text, after = image.text, place + 1
        joins = decode is not None
        if joins and text[:1].isspace():  # the text before it, back to a special token
            cut = len(out)
            while cut > 0 and out[cut - 1] not in special_ids:
                cut -= 1
            text = decode(out[cut:]) + text
            del out[cut:]
        if joins and text[-1:].isspace():  # the text after it, on to a special token
            while after < len(ids) and ids[after] not in special_ids:
                after += 1
            text += decode(ids[place + 1:after])
        tokens = encode(text)
        start, end = len(out), len(out) + len(tokens)
        own = [i for i, t in enumerate(tokens) if t in special_ids]
        if joins and own:
            start, end = len(out) + own[0], len(out) + own[-1] + 1
        joint = None if joint_id is None else _run(tokens, joint_id, len(out))
        spans.append(ImageSpan(start, end, image.key, image, grid=image.grid,
                               joint=joint))
        out += tokens
        last = after
    out += ids[last:]
    return out, tuple(spans)


def _run(tokens: list[int], token_id: int, offset: int) -> tuple[int, int]:
    """[first, last + 1) of ``token_id`` in ``tokens``, shifted by ``offset``; the
    image's tokens must be one unbroken run."""
    places = [p for p, t in enumerate(tokens) if t == token_id]
    if not places or places[-1] + 1 - places[0] != len(places):
        raise ValueError("an image's text does not tokenize to one run of image tokens")
    return offset + places[0], offset + places[-1] + 1
