"""Whether a model on disk ships a multi-token-prediction head Folio runs
(``EngineConfig.speculative="mtp"``), read from its config and safetensors headers only:
what the app's Speed setting asks before offering "MTP head"."""

from __future__ import annotations

import json
from pathlib import Path

from engine.models.qwen35_mtp import MTP_PREFIX

# The configs whose MTP head engine/models/qwen35_mtp.py builds (a multimodal release's
# text part names the same types).
_MTP_MODEL_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_moe")


def mtp_head_missing(source: str | Path | None) -> str | None:
    """None when ``source`` (a model folder, a .gguf file, "starter" or a cached repo id)
    has an MTP head Folio runs; else why not, in a user's words."""
    if not source:
        return "no model is loaded"
    from engine.loaders.catalog import resolve_model
    from engine.loaders.safetensors import read_safetensors_header, safetensors_shards

    try:
        path = Path(resolve_model(str(source)))
    except (OSError, ValueError):
        return "the model's files cannot be read"
    if path.is_file():
        return "GGUF files carry no MTP head (use the model's Hugging Face folder)"
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "the model's config cannot be read"
    text = config.get("text_config") or {}
    model_type = text.get("model_type") or config.get("model_type")
    layers = text.get("mtp_num_hidden_layers", config.get("mtp_num_hidden_layers")) or 0
    if model_type not in _MTP_MODEL_TYPES or not isinstance(layers, int) or layers < 1:
        return "this model has no MTP head (Qwen3.5 and Qwen3.5-MoE models ship one)"
    try:
        names = [name for shard in safetensors_shards(path)
                 for name in read_safetensors_header(shard)]
    except (OSError, ValueError):
        return "the model's weights cannot be read"
    if not any(name.startswith(MTP_PREFIX) for name in names):
        return "this copy of the model has no MTP weights (mtp.* tensors)"
    return None
