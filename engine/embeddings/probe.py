"""``probe``: whether a path is an embedding model Folio runs, read from its headers and
config files only (no torch, no weights), for the app's settings to refuse a bad pick at
once; the load (load.py) checks the rest."""

from __future__ import annotations

import json
from pathlib import Path

from engine.embeddings.sentence_config import read_sentence_config

# A decoder says it is an embedder by how it pools; a chat model says nothing (load.py
# refuses one in the same words).
NOT_AN_EMBEDDER = ("{name}: a decoder that does not say how it pools (no sentence-"
                   "transformers Pooling module in modules.json, no GGUF pooling_type): a "
                   "chat model, not an embedding model")

BERT_TYPES = {"bert": "BERT", "nomic_bert": "nomic-bert"}
GGUF_BERT = {"bert": "BERT", "nomic-bert": "nomic-bert"}
# Decoders with full attention in every layer: what decoder.py runs.
DECODER_TYPES = {"qwen3": "Qwen3", "qwen2": "Qwen2", "llama": "Llama", "mistral": "Mistral"}


def probe(path: str | Path) -> str:
    """A short description of the embedding model at ``path`` ("BERT, folder"); a
    ValueError saying what is wrong otherwise."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ValueError(f"{path}: no such file or folder")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"{path.name}: not a model; pick a .gguf file or a model "
                             "folder (with config.json)")
        arch, pooling = _gguf_keys(path)
        kind = GGUF_BERT.get(arch) or DECODER_TYPES.get(arch)
        if kind is None:
            raise ValueError(f"{path.name}: a GGUF of architecture {arch!r}, not an "
                             "embedding model Folio runs (BERT, nomic-bert, or a Qwen3 / "
                             "Qwen2 / Llama / Mistral decoder)")
        if arch in DECODER_TYPES and pooling is None:
            raise ValueError(NOT_AN_EMBEDDER.format(name=path.name))
        return f"{kind}, GGUF"
    config_path = path / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path.name}: no config.json; pick a model folder or a .gguf "
                         "file") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{config_path}: unreadable ({exc})") from exc
    model_type = config.get("model_type") if isinstance(config, dict) else None
    kind = BERT_TYPES.get(model_type) or DECODER_TYPES.get(model_type)
    if kind is None:
        raise ValueError(f"{path.name}: a {model_type!r} model, not an embedding model "
                         "Folio runs (BERT, nomic-bert, or a Qwen3 / Qwen2 / Llama / "
                         "Mistral decoder)")
    if not any(path.glob("*.safetensors")):
        raise ValueError(f"{path.name}: no .safetensors weights")
    sentence = read_sentence_config(path)  # a pooling Folio does not do: refused by name
    if model_type in DECODER_TYPES and sentence.pooling is None:
        raise ValueError(NOT_AN_EMBEDDER.format(name=path.name))
    return f"{kind}, folder"


def _gguf_keys(path: Path) -> tuple[str | None, object]:
    """general.architecture and ``{arch}.pooling_type`` (None where absent)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path, "r")
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path.name}: not a readable GGUF file ({exc})") from exc
    arch = reader.get_field("general.architecture")
    arch = None if arch is None else arch.contents()
    pooling = reader.get_field(f"{arch}.pooling_type")
    return arch, None if pooling is None else pooling.contents()
