"""Search the Hugging Face Hub by name for models Folio can load (no Qt here; run it on a
plain thread, it waits on the network).

The Hub's listing carries each repo's tags: its weights' format ("gguf", "safetensors")
and its config's model_type ("llama", "qwen3", ...). A repo is kept when it has one of
those formats and a model_type of a family Folio runs (engine.models.registry); anything
else (an unknown architecture, PyTorch .bin weights only) could not load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from huggingface_hub import HfApi

from desktop_app.services.downloads import DownloadError, as_download_error
from engine.models import SUPPORTED_MODEL_TYPES
from engine.models.registry import GGUF_ARCHITECTURES

# The tag names of the families: HF model_types and llama.cpp's architectures, and the
# multimodal releases' model_types whose text part loads (gemma3, gemma4, qwen3_5...).
LOADABLE_TAGS = frozenset(SUPPORTED_MODEL_TYPES) | frozenset(GGUF_ARCHITECTURES) | {
    t.removesuffix("_text") for t in SUPPORTED_MODEL_TYPES}
MAX_RESULTS = 30
# The listing is filtered after it arrives: ask for more than is shown.
_ASKED = 4 * MAX_RESULTS


@dataclass(frozen=True, slots=True)
class HubModel:
    repo_id: str
    format: str  # "GGUF" or "safetensors"
    architecture: str  # the family tag that matched
    downloads: int


def search_hub(query: str, *, api: HfApi | None = None,
               limit: int = MAX_RESULTS) -> list[HubModel]:
    """The Hub's most downloaded repos whose name holds ``query``, filtered to those Folio
    can load; raises DownloadError (kind "offline" when the Hub cannot be reached)."""
    if not isinstance(query, str) or not query.strip():
        raise ValueError("query: type part of a model's name to search the Hub")
    api = api or HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
    try:
        listing = api.list_models(search=query.strip(), sort="downloads", limit=_ASKED)
        found = []
        for model in listing:
            hit = loadable(model.id, list(model.tags or ()), model.downloads or 0)
            if hit is not None:
                found.append(hit)
            if len(found) == limit:
                break
    except DownloadError:
        raise
    except Exception as err:  # the same words as a download's for the same failure
        raise as_download_error(err, query, "main", None) from err
    return found


def loadable(repo_id: str, tags: list[str], downloads: int = 0) -> HubModel | None:
    """The repo as a search result, or None when Folio could not load it."""
    tag_set = set(tags)
    if "gguf" in tag_set:
        fmt = "GGUF"
    elif "safetensors" in tag_set:
        fmt = "safetensors"
    else:
        return None
    family = next((t for t in tags if t in LOADABLE_TAGS), None)
    if family is None:
        return None
    return HubModel(repo_id, fmt, family, downloads)
