"""Rotary embeddings against transformers: the plain tables, Phi-4-mini's partial rotary,
and Phi-3's LongRoPE with its per-sequence choice of short or long factors."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from transformers.models.phi3 import modeling_phi3

from engine.layers.rotary import (
    LongRopeEmbedding,
    RotaryEmbedding,
    apply_partial_rotary,
    apply_rotary,
    longrope_attention_factor,
    longrope_inv_freq,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

ORIGINAL = 32


def _phi3_config(**overrides) -> transformers.Phi3Config:
    return transformers.Phi3Config(**{
        "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "rope_theta": 10000.0, **overrides})


def _longrope_config() -> transformers.Phi3Config:
    return _phi3_config(partial_rotary_factor=0.75, original_max_position_embeddings=ORIGINAL,
                        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                         "short_factor": [1.0 + 0.1 * i for i in range(6)],
                                         "long_factor": [1.0 + 4.0 * i for i in range(6)]})


def _ours_longrope(config: transformers.Phi3Config) -> LongRopeEmbedding:
    params = config.rope_parameters
    factor = longrope_attention_factor(512, ORIGINAL)
    return LongRopeEmbedding(12, 512, 10000.0, params["short_factor"], params["long_factor"],
                             ORIGINAL, factor, torch.float32, "cpu")


def _hf_tables(rotary: torch.nn.Module, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' cos, sin [len(positions), rotary_dim] from one forward."""
    x = torch.zeros(1, dtype=torch.float32)
    cos, sin = rotary(x, torch.tensor([positions]))
    return cos[0], sin[0]


def test_plain_tables_equal_transformers_llama_rope():
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4,
                                      max_position_embeddings=128, rope_theta=500000.0)
    hf_cos, hf_sin = _hf_tables(
        transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config), list(range(128)))
    ours = RotaryEmbedding(16, 128, 500000.0, None, torch.float32, "cpu")
    torch.testing.assert_close(ours.cos, hf_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.sin[:, 8:], hf_sin[:, 8:], rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.sin[:, :8], -hf_sin[:, :8], rtol=0, atol=1e-6)


def test_partial_rotary_matches_transformers_phi3():
    # Phi-4-mini's layout: 12 of 16 head dims rotate, paired i with i + 6; 12..15 pass.
    config = _phi3_config(partial_rotary_factor=0.75)
    hf_rotary = modeling_phi3.Phi3RotaryEmbedding(config)
    ours = RotaryEmbedding(12, 512, 10000.0, None, torch.float32, "cpu")
    positions = torch.tensor([0, 3, 17, 200, 511])
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(5, 4, 16, generator=generator)
    k = torch.randn(5, 2, 16, generator=generator)
    cos, sin = _hf_tables(hf_rotary, positions.tolist())
    hf_q, hf_k = modeling_phi3.apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
    ours_cos, ours_sin = ours.lookup(positions)
    assert ours_cos.shape == (5, 1, 12)
    torch.testing.assert_close(apply_partial_rotary(q, ours_cos, ours_sin),
                               hf_q[0].transpose(0, 1), rtol=0, atol=1e-5)
    torch.testing.assert_close(apply_partial_rotary(k, ours_cos, ours_sin),
                               hf_k[0].transpose(0, 1), rtol=0, atol=1e-5)
    assert torch.equal(apply_partial_rotary(q, ours_cos, ours_sin)[..., 12:], q[..., 12:])


def test_partial_rotary_at_full_width_is_apply_rotary():
    ours = RotaryEmbedding(16, 64, 10000.0, None, torch.float32, "cpu")
    cos, sin = ours.lookup(torch.arange(7))
    x = torch.randn(7, 6, 16, generator=torch.Generator().manual_seed(1))
    assert torch.equal(apply_partial_rotary(x, cos, sin), apply_rotary(x, cos, sin))


def test_longrope_factors_and_attention_factor_match_transformers():
    config = _longrope_config()
    short, _ = modeling_phi3.ROPE_INIT_FUNCTIONS["longrope"](config, None)
    long, scale = modeling_phi3.ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=ORIGINAL + 1)
    params = config.rope_parameters
    assert torch.equal(longrope_inv_freq(12, 10000.0, params["short_factor"]), short)
    assert torch.equal(longrope_inv_freq(12, 10000.0, params["long_factor"]), long)
    assert longrope_attention_factor(512, ORIGINAL) == scale
    assert longrope_attention_factor(512, ORIGINAL, factor=4.0) == pytest.approx(
        math.sqrt(1 + math.log(4) / math.log(ORIGINAL)))
    assert longrope_attention_factor(512, ORIGINAL, attention_factor=1.5) == 1.5
    assert longrope_attention_factor(32, ORIGINAL) == 1.0
    with pytest.raises(ValueError, match="needs 6 rescale factors"):
        longrope_inv_freq(12, 10000.0, [1.0] * 8)


def test_longrope_picks_short_or_long_per_sequence_as_transformers_per_forward(
        build_attention_metadata):
    config = _longrope_config()
    hf_rotary = modeling_phi3.Phi3RotaryEmbedding(config)
    ours = _ours_longrope(config)
    # (cached, new): 15 tokens (short); a prefill chunk ending at 40 whose positions 20..31
    # are below the original length (long all the same); a long decode; exactly 32 (short);
    # 33 (long).
    cached, q_lens = [10, 20, 50, 30, 32], [5, 20, 1, 2, 1]
    tables = [list(range(i * 4, i * 4 + 4)) for i in range(5)]
    meta = build_attention_metadata(tables, cached, q_lens, 16)
    positions = torch.cat([torch.arange(c, c + q) for c, q in zip(cached, q_lens, strict=True)])
    cos, sin = ours.lookup(positions, meta)
    rows = meta.query_start_loc.tolist()
    for i, (start, count) in enumerate(zip(cached, q_lens, strict=True)):
        hf_cos, hf_sin = _hf_tables(hf_rotary, list(range(start, start + count)))
        ours_cos, ours_sin = cos[rows[i]:rows[i + 1], 0], sin[rows[i]:rows[i + 1], 0]
        torch.testing.assert_close(ours_cos, hf_cos, rtol=0, atol=1e-6)
        torch.testing.assert_close(ours_sin[:, 6:], hf_sin[:, 6:], rtol=0, atol=1e-6)
        torch.testing.assert_close(ours_sin[:, :6], -hf_sin[:, :6], rtol=0, atol=1e-6)
    # Position 20 of the crossing chunk is rotated by the long factors, unlike position 20
    # of a step that ends within the original length.
    short_meta = build_attention_metadata([tables[1]], [20], [1], 16)
    short_cos, _ = ours.lookup(torch.tensor([20]), short_meta)
    assert not torch.allclose(short_cos[0], cos[rows[1]])


def test_longrope_scales_cos_and_sin_by_the_attention_factor():
    config = _longrope_config()
    ours = _ours_longrope(config)
    factor = longrope_attention_factor(512, ORIGINAL)
    assert factor > 1.0
    torch.testing.assert_close(ours.cos[0], torch.full((12,), factor))  # position 0: cos = 1
    assert ours.cos.shape == (ORIGINAL + 512, 12)
