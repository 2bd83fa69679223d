"""Gated DeltaNet against transformers' Qwen3.5 implementation (float32): the chunked
prefill, the recurrent decode, a prompt split into chunks at arbitrary points, and the
causal conv1d and gated RMSNorm inside them."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3_5TextConfig
from transformers.models.qwen3_5 import modeling_qwen3_5 as ref

from engine.layers.delta_rule import (
    chunked_prefill,
    conv_prefill,
    conv_step,
    prepare_qk,
    recurrent_step,
)
from engine.layers.gated_deltanet import DeltaNetShape, GatedDeltaNet, StateMetadata
from engine.models.base import copy_checkpoint

TOL = dict(atol=2e-5, rtol=1e-4)


def tiny_config() -> Qwen3_5TextConfig:
    return Qwen3_5TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=4)


class _Holder(torch.nn.Module):
    """copy_checkpoint's view of one layer: its targets under their HF names."""

    def __init__(self, layer: GatedDeltaNet) -> None:
        super().__init__()
        self.layer = layer
        self.spec = type("S", (), {"architecture": "test", "num_layers": 1,
                                   "tie_word_embeddings": False})()

    def checkpoint_targets(self):
        return self.layer.checkpoint_targets("linear_attn.")


def layer_pair(seed: int = 0):
    torch.manual_seed(seed)
    config = tiny_config()
    theirs = ref.Qwen3_5GatedDeltaNet(config, 0).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.3)
        theirs.A_log.uniform_(-1, 1)
    shape = DeltaNetShape(config.hidden_size, config.linear_num_key_heads,
                          config.linear_num_value_heads, config.linear_key_head_dim,
                          config.linear_value_head_dim, config.linear_conv_kernel_dim,
                          config.rms_norm_eps)
    ours = GatedDeltaNet(shape, torch.float32, "cpu")
    copy_checkpoint(_Holder(ours), ((f"linear_attn.{n}", t.detach())
                                    for n, t in theirs.named_parameters()))
    return theirs, ours, shape


def pool(shape: DeltaNetShape, slots: int = 3):
    conv = torch.zeros(slots, shape.conv_dim, shape.conv_width - 1)
    rec = torch.zeros(slots, shape.num_v_heads, shape.head_k_dim, shape.head_v_dim)
    return conv, rec


def run_chunks(ours, shape, x: torch.Tensor, cuts: list[int], slot: int = 1) -> torch.Tensor:
    conv, rec = pool(shape)
    outs, start = [], 0
    for end in [*cuts, x.shape[0]]:
        meta = StateMetadata([0, end - start], [slot], [start > 0])
        outs.append(ours(x[start:end], conv, rec, meta))
        start = end
    return torch.cat(outs)


@pytest.mark.parametrize("num_tokens", [1, 5, 64, 150])
def test_chunked_prefill_equals_transformers(num_tokens):
    theirs, ours, shape = layer_pair()
    x = torch.randn(1, num_tokens, shape.hidden_size)
    with torch.no_grad():
        expected = theirs(x)[0]
    got = run_chunks(ours, shape, x[0], [])
    torch.testing.assert_close(got, expected, **TOL)


@pytest.mark.parametrize("cuts", [[1], [3, 4, 70], [64, 128], [2, 3, 5, 8, 13, 99]])
def test_prompt_split_anywhere_equals_one_run(cuts):
    theirs, ours, shape = layer_pair(1)
    x = torch.randn(1, 140, shape.hidden_size)
    with torch.no_grad():
        expected = theirs(x)[0]
    torch.testing.assert_close(run_chunks(ours, shape, x[0], cuts), expected, **TOL)


def test_decode_steps_equal_transformers():
    """A 9-token prompt then tokens one at a time: every decode row takes the recurrent
    step (two sequences in one batch, at different slots)."""
    theirs, ours, shape = layer_pair(2)
    xs = [torch.randn(1, 14, shape.hidden_size) for _ in range(2)]
    with torch.no_grad():
        expected = [theirs(x)[0] for x in xs]
    conv, rec = pool(shape)
    slots = [2, 0]
    prompts = torch.cat([x[0, :9] for x in xs])
    got = [[o] for o in ours(prompts, conv, rec,
                             StateMetadata([0, 9, 18], slots, [False, False])).split(9)]
    for t in range(9, 14):
        step = torch.cat([x[0, t:t + 1] for x in xs])
        out = ours(step, conv, rec, StateMetadata([0, 1, 2], slots, [True, True]))
        for i in range(2):
            got[i].append(out[i:i + 1])
    for i in range(2):
        torch.testing.assert_close(torch.cat(got[i]), expected[i], **TOL)


def test_delta_rule_paths_equal_the_references_with_initial_state():
    torch.manual_seed(3)
    t, hk, hv, dk, dv = 37, 2, 4, 8, 6
    q, k = torch.randn(1, t, hk, dk), torch.randn(1, t, hk, dk)
    v = torch.randn(1, t, hv, dv)
    g = -torch.rand(1, t, hv)
    beta = torch.rand(1, t, hv)
    state = torch.randn(1, hv, dk, dv)
    ref_out, ref_state = ref.torch_chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=state, output_final_state=True,
        use_qk_l2norm_in_kernel=True)
    pq, pk = prepare_qk(q[0], k[0], hv)
    out, final = chunked_prefill(pq, pk, v[0], g[0], beta[0], state[0], chunk=16)
    torch.testing.assert_close(out, ref_out[0], **TOL)
    torch.testing.assert_close(final, ref_state[0], **TOL)
    rec_out, rec_state = ref.torch_recurrent_gated_delta_rule(
        q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], initial_state=state,
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    out, final = recurrent_step(pq[:1], pk[:1], v[0, :1], g[0, :1], beta[0, :1], state)
    torch.testing.assert_close(out, rec_out[:, 0], **TOL)
    torch.testing.assert_close(final, rec_state, **TOL)


def test_gated_norm_and_conv_equal_transformers():
    theirs, ours, shape = layer_pair(4)
    x, z = torch.randn(7, shape.head_v_dim), torch.randn(7, shape.head_v_dim)
    with torch.no_grad():
        torch.testing.assert_close(ours.norm(x, z), theirs.norm(x, z), **TOL)
        mixed = torch.randn(1, shape.conv_dim, 11)
        expected = ref.causal_conv1d_fn(mixed, theirs.conv1d.weight.squeeze(1), None, "silu")
    out, state = conv_prefill(mixed[0, :, :6].T, ours.conv_weight, None)
    steps = [out]
    for t in range(6, 11):
        o, state = conv_step(mixed[0, :, t][None], ours.conv_weight, state[None])
        state = state[0]
        steps.append(o)
    torch.testing.assert_close(torch.cat(steps).T, expected[0], **TOL)
