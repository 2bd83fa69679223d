"""Tiny random mixture-of-experts models of each family Folio runs (OLMoE, Qwen3-MoE,
Mixtral, gpt-oss), as transformers builds them: 8 experts, 2 per token, weights large
enough that logits are peaked (greedy decoding is then not decided by float noise).

gpt-oss's: sliding (a window of 8) and full layers alternating, YaRN rope, sinks large
enough to take a real share of the softmax, and a SwiGLU limit low enough that its
clamps bite."""

from __future__ import annotations

from typing import Any

import torch
import transformers

from tests.engine.tiny_models import peaked_weights

FAMILIES = ("olmoe", "qwen3_moe", "mixtral")  # engine/models/moe_decoder.py's
GPT_OSS = "gpt_oss"  # engine/models/gpt_oss.py's
ALL_FAMILIES = (*FAMILIES, GPT_OSS)
WINDOW = 8  # gpt-oss's sliding layers'

_COMMON: dict[str, Any] = dict(
    vocab_size=256, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    rms_norm_eps=1e-6, rope_theta=10000.0, bos_token_id=None, eos_token_id=None,
    pad_token_id=None, num_experts_per_tok=2,
)
_FIELDS: dict[str, tuple[str, dict[str, Any]]] = {
    # OLMoE-1B-7B's shape of options: raw top-k probabilities, q/k norms over the whole
    # projections; a clamp low enough to bite.
    "olmoe": ("Olmoe", dict(num_experts=8, norm_topk_prob=False, clip_qkv=2.0)),
    # Qwen3-30B-A3B's: per-head q/k norms, head_dim != hidden / heads, normalised top k;
    # layer 1 dense, as mlp_only_layers makes it.
    "qwen3_moe": ("Qwen3Moe", dict(num_experts=8, moe_intermediate_size=32, head_dim=32,
                                   norm_topk_prob=True, mlp_only_layers=[1])),
    "mixtral": ("Mixtral", dict(num_local_experts=8, sliding_window=None)),
    # Every field its own: none of _COMMON's.
    GPT_OSS: ("GptOss", dict(
        vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
        num_experts_per_tok=2, sliding_window=WINDOW, max_position_embeddings=512,
        rms_norm_eps=1e-5, swiglu_limit=1.5, bos_token_id=None, eos_token_id=None,
        pad_token_id=None,
        rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0,
                             beta_fast=32.0, beta_slow=1.0, truncate=False,
                             original_max_position_embeddings=128))),
}


def moe_config(family: str, **overrides: Any) -> transformers.PretrainedConfig:
    prefix, fields = _FIELDS[family]
    common = {} if family == GPT_OSS else _COMMON
    config = getattr(transformers, f"{prefix}Config")(**{**common, **fields, **overrides})
    config.architectures = [f"{prefix}ForCausalLM"]
    config._attn_implementation = "eager"
    return config


def moe_model(family: str, seed: int = 0, **overrides: Any) -> transformers.PreTrainedModel:
    config = moe_config(family, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, config.architectures[0])(config).eval()
    peaked_weights(model, seed)
    if family == GPT_OSS:
        generator = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.copy_(2.0 * torch.randn(config.num_attention_heads,
                                                              generator=generator))
    return model


# The byte-level vocabulary of tests/engine/tiny_models.py, and rows of whole 32-value
# blocks (Q8_0, MXFP4) for the GGUF files: gpt-oss's 32 already are.
BYTE_SIZES: dict[str, Any] = dict(vocab_size=259, intermediate_size=64, bos_token_id=256,
                                  eos_token_id=258, pad_token_id=256,
                                  max_position_embeddings=1024)


def byte_fields(family: str) -> dict[str, Any]:
    """`family`'s fields for the byte-level vocabulary (BYTE_SIZES; gpt-oss keeps its
    width, Qwen3-MoE gets no dense layer: GGUF files hold none)."""
    if family == GPT_OSS:
        return {k: v for k, v in BYTE_SIZES.items() if k != "intermediate_size"}
    return {**BYTE_SIZES, **({"mlp_only_layers": []} if family == "qwen3_moe" else {})}


def byte_moe_config(family: str, **overrides: Any) -> transformers.PretrainedConfig:
    """`family` with the byte-level tokenizer's vocabulary."""
    return moe_config(family, **{**byte_fields(family), **overrides})


def save_moe_model(path, family: str, seed: int = 0, **overrides: Any):
    """A random `family` folder (config, safetensors, the byte-level tokenizer)."""
    from tests.engine.tiny_models import byte_level_tokenizer

    model = moe_model(family, seed, **{**byte_fields(family), **overrides})
    model.save_pretrained(path)
    byte_level_tokenizer().save_pretrained(path)
    return model
