"""Gated DeltaNet's token mixers: the Triton one (interpreted here, compiled on CUDA) leaves
the same outputs, running states and snapshots as the PyTorch one on a step mixing decode
rows and prompt chunks, and the layer over it equals transformers'; each device gets its
mixer once, at build time."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.layers.gated_deltanet import GatedDeltaNet, StateMetadata
from engine.layers.token_mixers import MixerInputs, TorchMixer, TritonMixer, token_mixer_for
from tests.engine.layers.test_gated_deltanet import TOL, layer_pair
from tests.kernels.paged_cases import DEVICE


def _random_pool(shape, slots: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    conv = torch.randn(slots, shape.conv_dim, shape.conv_width - 1, generator=gen)
    rec = torch.randn(slots, shape.num_v_heads, shape.head_k_dim, shape.head_v_dim,
                      generator=gen)
    return conv.to(DEVICE), rec.to(DEVICE)


@pytest.mark.parametrize("tiled", [False, True])
def test_triton_mixer_equals_torch_on_a_mixed_step(tiled):
    """Row order: a decode row (snapshot after it), a fresh 20-token prompt (snapshot at
    16), a second decode row, a 70-token chunk resuming its slot (snapshots at 10, 42)."""
    _, layer, shape = layer_pair(4)
    shape = dataclasses.replace(shape, v_heads_tiled=tiled)  # True: a GGUF file's order
    meta = StateMetadata([0, 1, 21, 22, 92], [1, 0, 7, 2], [True, False, True, True],
                         [[(1, 4)], [(16, 3)], [], [(10, 5), (42, 6)]])
    gen = torch.Generator().manual_seed(5)
    mixed = torch.randn(92, shape.conv_dim, generator=gen).to(DEVICE)
    g = (-0.5 * torch.rand(92, shape.num_v_heads, generator=gen)).to(DEVICE)
    beta = torch.rand(92, shape.num_v_heads, generator=gen).to(DEVICE)
    weight = layer.conv_weight.data.to(DEVICE)
    results = []
    for mixer in (TorchMixer(), TritonMixer()):
        conv, rec = _random_pool(shape, 8, seed=6)
        results.append((mixer(shape, MixerInputs(mixed, g, beta, weight, conv, rec, meta)),
                        conv, rec))
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, **TOL)
    # Built by the first layer of the step, reused by the rest (and by the second mixer).
    assert set(meta.derived) == {"decode_rows", "chunk_layout"}


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="the layer is built on the CPU, where Triton is interpreted")
def test_layer_on_triton_equals_transformers_prefill_then_decode():
    theirs, ours, shape = layer_pair(7)
    ours.mixer = TritonMixer()
    x = torch.randn(1, 22, shape.hidden_size, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        expected = theirs(x)[0]
    conv, rec = _random_pool(shape, 2, seed=9)
    got = [ours(x[0, :20], conv, rec, StateMetadata([0, 20], [1], [False]))]
    for t in (20, 21):
        got.append(ours(x[0, t:t + 1], conv, rec, StateMetadata([0, 1], [1], [True])))
    torch.testing.assert_close(torch.cat(got), expected, **TOL)


def test_each_device_gets_its_mixer_once():
    assert isinstance(token_mixer_for("cpu"), TorchMixer)
    _, ours, shape = layer_pair(0)
    assert isinstance(ours.mixer, TorchMixer)  # built on the CPU
    layer = GatedDeltaNet(shape, torch.float32, "cpu", mixer=TritonMixer())
    assert layer.mixer.name == "triton"
    if torch.cuda.is_available():
        assert isinstance(token_mixer_for("cuda"), TritonMixer)
