"""The models dialog's Discover list: a curated catalog of models Folio runs, shipped with
the app as ``catalog.json`` beside this module (no Qt here).

Each entry is a real Hugging Face repo (a GGUF file of it, or its safetensors) with the
facts a newcomer compares: parameters, quantization, download size, context length. The
memory a model needs is not typed into the data but computed by ``memory_needed`` from the
entry's facts with the engine's own rule, the one the local models' table uses
(engine.runner.kv_cache.estimate_memory)::

    memory needed = weights + KV pool
    weights       = the file's bytes (a GGUF file kept quantized, Weights "stored"),
                    else parameters x the bytes of the dtype the engine computes in
    KV pool       = blocks x block bytes, one block holding block_size tokens of
                    2 (K and V) x layers x kv_heads x head_dim x the KV dtype's bytes;
                    blocks: four contexts of min(context, max_model_len) tokens, at most
                    2 GiB, never less than one context

So an entry's figure is what the same model shows under "On this computer" once
downloaded, on this machine's device and with the app's engine settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from engine.models import SUPPORTED_MODEL_TYPES

CATALOG_FILE = "catalog.json"
_TEXT_FIELDS = ("name", "family", "architecture", "repo", "quantization")
_COUNT_FIELDS = ("parameters", "file_bytes", "context", "layers", "kv_heads", "head_dim")


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    name: str  # "Llama 3.2 1B Instruct"
    family: str  # "Llama 3.2"
    architecture: str  # the Hugging Face model_type, one of engine.models' families
    repo: str  # "bartowski/Llama-3.2-1B-Instruct-GGUF"
    file: str | None  # the .gguf file to fetch; None: the repo's safetensors
    quantization: str  # "Q4_K_M", "bfloat16"
    parameters: int
    file_bytes: int  # the download's size
    context: int  # the model's context length in tokens
    layers: int
    kv_heads: int
    head_dim: int
    active_parameters: int | None = None  # a mixture of experts: what one token reads

    # What engine.runner.kv_cache.estimate_memory reads off a catalog ModelInfo.
    @property
    def format(self) -> str:
        return "gguf" if self.file else "hf"

    @property
    def size_bytes(self) -> int:
        return self.file_bytes

    @property
    def num_parameters(self) -> int:
        return self.parameters

    @property
    def context_length(self) -> int:
        return self.context

    @property
    def num_layers(self) -> int:
        return self.layers

    @property
    def kv_layers(self) -> int:
        return self.layers

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads

    @property
    def hybrid(self) -> None:
        return None

    @property
    def mxfp4(self) -> None:
        return None

    @property
    def search_text(self) -> str:
        return " ".join((self.name, self.family, self.architecture, self.repo,
                         self.quantization, self.file or "safetensors")).lower()


def load_catalog(path: Path | str | None = None) -> tuple[CatalogEntry, ...]:
    """The catalog's entries in the file's order; a malformed entry raises ValueError
    naming the entry and the field."""
    if path is None:
        text = resources.files("desktop_app.data").joinpath(CATALOG_FILE).read_text("utf-8")
    else:
        text = Path(path).read_text("utf-8")
    data = json.loads(text)
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, list):
        raise ValueError("models: the catalog must hold a list of models")
    return tuple(parse_entry(raw, index) for index, raw in enumerate(models))


def parse_entry(raw: Any, index: int = 0) -> CatalogEntry:
    if not isinstance(raw, dict):
        raise ValueError(f"models[{index}]: an entry must be an object")
    where = f"models[{index}] ({raw.get('name', '?')})"
    for field in _TEXT_FIELDS:
        if not isinstance(raw.get(field), str) or not raw[field].strip():
            raise ValueError(f"{where}.{field}: must be a non-empty string")
    for field in _COUNT_FIELDS:
        value = raw.get(field)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{where}.{field}: must be a positive integer, got {value!r}")
    if raw["architecture"] not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{where}.architecture: {raw['architecture']!r} is not a family "
                         f"Folio runs ({', '.join(SUPPORTED_MODEL_TYPES)})")
    if raw["repo"].count("/") != 1:
        raise ValueError(f"{where}.repo: must look like 'owner/name', got {raw['repo']!r}")
    file = raw.get("file")
    if file is not None and (not isinstance(file, str) or not file.endswith(".gguf")
                             or "/" in file):
        raise ValueError(f"{where}.file: must be a top-level .gguf file name or null, "
                         f"got {file!r}")
    active = raw.get("active_parameters")
    if active is not None and (isinstance(active, bool) or not isinstance(active, int)
                               or not 0 < active < raw["parameters"]):
        raise ValueError(f"{where}.active_parameters: must be a positive integer below "
                         f"parameters, got {active!r}")
    return CatalogEntry(raw["name"], raw["family"], raw["architecture"], raw["repo"], file,
                        raw["quantization"], raw["parameters"], raw["file_bytes"],
                        raw["context"], raw["layers"], raw["kv_heads"], raw["head_dim"],
                        active)


def memory_needed(entry: CatalogEntry, engine_config) -> int:
    """The bytes loading ``entry`` takes under ``engine_config`` (the module doc's formula:
    the engine's estimate for a downloaded model, from the entry's facts)."""
    from engine.runner.kv_cache import estimate_memory

    return estimate_memory(entry, engine_config).total_bytes


def search(entries, query: str) -> list[CatalogEntry]:
    """The entries whose name, family, repo or quantization hold every word of ``query``
    ("qwen 4b", "q8", "gemma"); all of them for a blank query."""
    words = query.lower().split()
    return [e for e in entries if all(w in e.search_text for w in words)]
