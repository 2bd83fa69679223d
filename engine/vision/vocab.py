"""The image tokens in a model's vocabulary: a folder's added tokens by id (each family's
image token texts), and a GGUF model's image tokens looked up in its own vocabulary (an
mmproj file's images are written with its family's image tokens, which the text model
must have as single tokens: engine/vision/mmproj.py, each family's ``build_from_mmproj``)."""

from __future__ import annotations

import json
from pathlib import Path

from engine.loaders.base import FolioLoadError


def image_token_ids(tokenizer, tokens: list[str], where: str) -> dict[str, int]:
    """Each of ``tokens``' id in the text model's vocabulary, where it is one token in
    text; FolioLoadError naming the first that is not (a text model without the
    family's image tokens cannot be given images)."""
    ids = {}
    for token in tokens:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        if len(encoded) != 1 or tokenizer.convert_ids_to_tokens(encoded[0]) != token:
            raise FolioLoadError(f"{where}: the model's vocabulary has no {token!r} token, "
                                 "which this projector's images are written with; the "
                                 "mmproj file belongs to another model")
        ids[token] = encoded[0]
    return ids


def added_tokens(path: Path) -> dict[int, str]:
    """A tokenizer.json's added tokens, their texts by id; ValueError naming the file
    when it cannot be read."""
    try:
        added = json.loads(path.read_text(encoding="utf-8")).get("added_tokens", [])
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the tokenizer's added tokens ({exc})") from exc
    return {t["id"]: t["content"] for t in added if isinstance(t, dict)
            and isinstance(t.get("id"), int) and isinstance(t.get("content"), str)}
