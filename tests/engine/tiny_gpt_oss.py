"""Tiny random gpt-oss models as transformers builds them: 8 experts, 2 per token,
sliding (a window of 8) and full layers alternating, YaRN rope, sinks large enough to
take a real share of the softmax, and a SwiGLU limit low enough that its clamps bite."""

from __future__ import annotations

from typing import Any

import torch
import transformers

from tests.engine.tiny_models import peaked_weights

WINDOW = 8

_FIELDS: dict[str, Any] = dict(
    vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
    num_experts_per_tok=2, sliding_window=WINDOW, max_position_embeddings=512,
    rms_norm_eps=1e-5, swiglu_limit=1.5, bos_token_id=None, eos_token_id=None,
    pad_token_id=None,
    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0, beta_fast=32.0,
                         beta_slow=1.0, truncate=False, original_max_position_embeddings=128),
)
# The byte-level vocabulary of tests/engine/tiny_models.py; rows of whole 32-value blocks
# (MXFP4, Q8_0) for the GGUF files.
BYTE_SIZES: dict[str, Any] = dict(vocab_size=259, bos_token_id=256, eos_token_id=258,
                                  pad_token_id=256, max_position_embeddings=1024)


def gpt_oss_config(**overrides: Any) -> transformers.GptOssConfig:
    config = transformers.GptOssConfig(**{**_FIELDS, **overrides})
    config.architectures = ["GptOssForCausalLM"]
    config._attn_implementation = "eager"
    return config


def gpt_oss_model(seed: int = 0, **overrides: Any) -> transformers.GptOssForCausalLM:
    config = gpt_oss_config(**overrides)
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(config).eval()
    peaked_weights(model, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(2.0 * torch.randn(config.num_attention_heads,
                                                          generator=generator))
    return model


def save_gpt_oss_model(path, seed: int = 0, **overrides: Any) -> transformers.GptOssForCausalLM:
    """A random gpt-oss folder (config, safetensors, the byte-level tokenizer)."""
    from tests.engine.tiny_models import byte_level_tokenizer

    model = gpt_oss_model(seed, **{**BYTE_SIZES, **overrides})
    model.save_pretrained(path)
    byte_level_tokenizer().save_pretrained(path)
    return model
