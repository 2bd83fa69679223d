"""GGUF metadata (llama.cpp's keys) to a Hugging Face config.json-style dict.

Shared by the loader, which builds the model's config from it, and the models catalog, which
reads sizes from it without loading anything. The keys each family reads are the ones
llama.cpp's convert_hf_to_gguf.py writes for it (gguf.constants.Keys); a family's quirks are
in its reader (family_keys.py's `FAMILY_KEYS`), its tensor names in
engine.models.registry. The keys themselves are read through keys.py's `GGUFKeys`, rope
scaling through rope.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from engine.loaders.base import FolioLoadError
from engine.loaders.gguf.family_keys import FAMILY_KEYS, OWN_ROPE_FREQS, PARTIAL_ROTARY
from engine.loaders.gguf.keys import GGUFKeys, f32, first
from engine.loaders.gguf.rope import ROPE_FREQS, key_scaling, llama3_scaling
from engine.models import GGUF_ARCHITECTURES, gguf_file_family
from engine.models.spec import head_dim_of


def gguf_config_dict(metadata: Mapping[str, object], tensor_names: set[str],
                     config_tensors: Mapping[str, np.ndarray] | None,
                     where: Path) -> dict[str, object]:
    """A config.json-style dict from GGUF metadata (arrays given as their lengths).

    `config_tensors` holds the values of the file's config tensors (config_tensor_names);
    None when they were not read (the catalog, which wants sizes only): rope scaling that
    lives in tensors is then left out."""
    arch = metadata.get("general.architecture")
    family = gguf_file_family(metadata)
    if family is None:
        raise FolioLoadError(f"{where}: architecture {arch!r} is not supported; Folio runs "
                             f"these GGUF architectures: {', '.join(GGUF_ARCHITECTURES)}")
    keys = GGUFKeys(metadata, str(arch), where, tensor_names)
    key = keys.get

    heads, hidden = int(key("attention.head_count")), int(key("embedding_length"))
    head_dim = int(key("attention.key_length", head_dim_of(None, hidden, heads)))
    vocab = metadata.get(f"{arch}.vocab_size") or metadata.get("tokenizer.ggml.tokens")
    if not vocab:
        raise FolioLoadError(f"{where}: no vocabulary size in the metadata; the file is "
                             "incomplete, download or convert it again")
    if family.model_type not in PARTIAL_ROTARY and int(
            key("rope.dimension_count", head_dim)) != head_dim:
        raise FolioLoadError(f"{where}: partial rotary embeddings are not supported")
    config: dict[str, object] = {
        "model_type": family.model_type, "architectures": [family.architecture],
        "vocab_size": int(vocab),
        # A per-layer array (Gemma 4's) gives its first layer's; the family's reader the rest.
        # Qwen3.5-MoE files (every layer sparse) have no feed_forward_length.
        "hidden_size": hidden, "intermediate_size": first(key(
            "feed_forward_length", keys.optional("expert_feed_forward_length"))),
        "num_hidden_layers": int(key("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": first(key("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(key("context_length")),
        "rms_norm_eps": f32(key("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": f32(key("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    for name in ("bos", "eos", "padding"):
        token = metadata.get(f"tokenizer.ggml.{name}_token_id")
        if token is not None:
            config[f"{name.replace('padding', 'pad')}_token_id"] = int(token)
    scaling = key_scaling(keys)
    if scaling is not None:
        config["rope_scaling"] = scaling
    tensors = config_tensors or {}
    if tensors.get(ROPE_FREQS) is not None and family.model_type not in OWN_ROPE_FREQS:
        config["rope_scaling"] = llama3_scaling(tensors[ROPE_FREQS], config, metadata, where)
    reader = FAMILY_KEYS.get(family.model_type)
    if reader is not None:
        reader(keys, config, config_tensors)
    return config
