"""One native call per decoder layer (engine/layers/native_layer.py): the same ops in the
same order as the layer modules, so a model's hidden states and KV pool come out bit for
bit the modules', over prefill chunks, decode tokens and both activation widths; layers
it cannot take keep their modules."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config, Qwen3Config

import kernels.cpu
from engine.layers.linear import WeightSlot
from engine.layers.native_layer import NativeLayers
from engine.layers.weights import set_activation_bits
from engine.models import build_model
from engine.models.base import pool_layers
from kernels import allocate_kv_cache
from kernels.cpu.attention import CpuBackend
from kernels.key_stage import KeyStage
from kernels.kv_format import format_stored_as
from kernels.quant.formats import QuantizedTensor
from kernels.reference.backend import TorchBackend
from tests.kernels.quant_cases import random_quantized

pytestmark = pytest.mark.skipif(not kernels.cpu.available(),
                                reason="the native CPU library is not built")

BLOCK = 16
# llama.cpp's Q4_K_M mix: Q6_K for v and down, Q4_K elsewhere.
TYPES = {"v_proj": "Q6_K", "down_proj": "Q6_K"}
SHAPE = dict(vocab_size=300, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False)


def quantized_model(config, quantize: bool = True):
    """A model of `config` with random weights: its matrices random GGUF blocks."""
    model = build_model(config, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(0)
    weights = []
    for seed, (name, target) in enumerate(model.checkpoint_targets().items()):
        if isinstance(target, WeightSlot) and quantize:
            n, k = target.shape
            kind = next((t for part, t in TYPES.items() if part in name), "Q4_K")
            fmt, blocks = random_quantized(kind, n, k, seed=seed)
            weights.append((name, QuantizedTensor(fmt.type_id, (n, k),
                                                  torch.from_numpy(blocks))))
        else:
            noise = torch.randn(tuple(target.shape), generator=gen) * 0.05
            weights.append((name, noise + 1 if name.endswith("norm.weight") else noise))
    model.load_weights(weights)
    return model


def run_steps(model, build_attention_metadata, native: bool,
              pool_dtype=torch.float16) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Two sequences: a prefill of both (40 and 33 tokens), then a mixed step (the first
    decodes one token, the second prefills 9 more), then a decode of both. Returns each
    step's hidden states and the KV pool (an int8 or int4 pool in blocks of its
    min_block_size, the least its key blocks take)."""
    spec = model.spec
    block = max(BLOCK, format_stored_as(pool_dtype).min_block_size)
    per_seq = 64 // block  # slots for each sequence's 43 tokens
    cache = allocate_kv_cache(spec.num_layers, 2 * per_seq, block, spec.num_kv_heads,
                              spec.head_dim, pool_dtype, "cpu", head_major=True)
    tables = [list(range(per_seq)), list(range(per_seq, 2 * per_seq))]
    model.native_layers = None if native else NativeLayers([])
    backend = CpuBackend()
    if format_stored_as(pool_dtype).keys_by_block:
        backend.key_stages.attach(KeyStage(cache, slots=2))
    gen = torch.Generator().manual_seed(1)
    outs = []
    with torch.inference_mode():
        for cached, new in (((0, 0), (40, 33)), ((40, 33), (1, 9)), ((41, 42), (1, 1))):
            meta = build_attention_metadata(tables, list(cached), list(new), block)
            positions = torch.cat([torch.arange(c, c + n)
                                   for c, n in zip(cached, new, strict=True)])
            ids = torch.randint(0, spec.vocab_size, (sum(new),), generator=gen)
            outs.append(model(ids, positions, pool_layers(cache, meta), meta, backend))
    return outs, cache


# Each attention part the native step takes: q/k norms (Qwen3), q/k/v biases (Qwen2), a
# sliding window shorter than the sequences (Mistral-style).
CONFIGS = {"llama": lambda: LlamaConfig(**SHAPE), "qwen3": lambda: Qwen3Config(**SHAPE),
           "qwen2": lambda: Qwen2Config(**SHAPE),
           "windowed": lambda: LlamaConfig(**SHAPE, sliding_window=24)}


def assert_native_equals_modules(model, build_attention_metadata):
    modules, modules_cache = run_steps(model, build_attention_metadata, native=False)
    native, native_cache = run_steps(model, build_attention_metadata, native=True)
    assert all(step is not None for step in model.native_layers.steps)
    for got, want in zip(native, modules, strict=True):
        assert torch.equal(got, want)
    assert torch.equal(native_cache, modules_cache)


@pytest.mark.parametrize("family", CONFIGS)
@pytest.mark.parametrize("bits", [16, 8])
def test_the_native_layers_equal_the_modules_bit_for_bit(build_attention_metadata, bits,
                                                         family):
    model = quantized_model(CONFIGS[family]())
    set_activation_bits(model, bits)
    assert_native_equals_modules(model, build_attention_metadata)


def test_a_soft_cap_and_sinks_reach_the_native_step(build_attention_metadata):
    """Options no dense pre-norm family combines yet, set on the modules: the native step
    reads them as the module's attention call does."""
    model = quantized_model(LlamaConfig(**SHAPE))
    gen = torch.Generator().manual_seed(2)
    for layer in model.layers:
        attn = layer.self_attn
        attn.sinks = torch.randn(attn.num_heads, generator=gen)
        attn.attention_options.update(logit_softcap=5.0, sinks=attn.sinks)
    assert_native_equals_modules(model, build_attention_metadata)
    # And they matter: without them the same model's first step differs.
    with_options, _ = run_steps(model, build_attention_metadata, native=True)
    for layer in model.layers:
        layer.self_attn.attention_options.clear()
    plain, _ = run_steps(model, build_attention_metadata, native=True)
    assert not torch.equal(with_options[0], plain[0])


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.int8, torch.uint8])
def test_float32_and_quantized_pools_take_the_native_layers_too(build_attention_metadata,
                                                                pool_dtype, monkeypatch):
    """float32, int8 and int4 (uint8) pools: K/V quantized by the fused write, read in
    place by the attention, the same in the native step as in the modules. An int4 pool's
    keys are written a block at a time through its key stage (kernels/key_stage.py), by
    the same op in both, between the layer's write and its attention."""
    model = quantized_model(LlamaConfig(**SHAPE))
    modules, modules_cache = run_steps(model, build_attention_metadata, False, pool_dtype)
    ran = []
    run = NativeLayers.run

    def spy(self, *args):
        hidden = run(self, *args)
        ran.append(hidden is not None)
        return hidden

    monkeypatch.setattr(NativeLayers, "run", spy)
    native, native_cache = run_steps(model, build_attention_metadata, True, pool_dtype)
    assert ran == [True] * 3  # every step took the native layers
    assert all(step is not None for step in model.native_layers.steps)
    assert all(torch.equal(a, b) for a, b in zip(native, modules, strict=True))
    assert torch.equal(native_cache.view(torch.uint8), modules_cache.view(torch.uint8))
    assert native_cache.view(torch.uint8).count_nonzero() > native_cache.numel() // 4


def test_layers_it_cannot_take_keep_their_modules(build_attention_metadata):
    # Float weights, an MLP bias: no native step.
    dense = quantized_model(LlamaConfig(**SHAPE), quantize=False)
    mlp_bias = quantized_model(LlamaConfig(**SHAPE, mlp_bias=True))
    for model in (dense, mlp_bias):
        model.native_layers = NativeLayers(model.layers)
        assert model.native_layers.steps == [None] * SHAPE["num_hidden_layers"]
    # Such a model still runs, on its modules, and so does any step off the CPU backend.
    run_steps(mlp_bias, build_attention_metadata, native=True)
    model = quantized_model(LlamaConfig(**SHAPE))
    model.native_layers = NativeLayers(model.layers)
    hidden = torch.zeros(1, SHAPE["hidden_size"])
    assert model.native_layers.run(hidden, hidden, hidden, [], TorchBackend()) is None


def test_a_long_prefill_runs_the_mlp_in_row_chunks_bit_for_bit(build_attention_metadata):
    """Past 256 rows the native step runs its MLP over equal row chunks (so a 512-token
    chunk's gate/up product stays in the C heap instead of a fresh mapping per layer):
    300 rows go as two chunks of 150, the wide tiles' own split, so the hidden states are
    the modules' bit for bit."""
    model = quantized_model(LlamaConfig(**SHAPE))
    spec, tokens = model.spec, 300
    blocks = -(-tokens // BLOCK)
    ids = torch.randint(0, spec.vocab_size, (tokens,), generator=torch.Generator().manual_seed(3))
    outs = []
    for native in (False, True):
        cache = allocate_kv_cache(spec.num_layers, blocks, BLOCK, spec.num_kv_heads,
                                  spec.head_dim, torch.float16, "cpu", head_major=True)
        meta = build_attention_metadata([list(range(blocks))], [0], [tokens], BLOCK)
        model.native_layers = None if native else NativeLayers([])
        with torch.inference_mode():
            outs.append((model(ids, torch.arange(tokens), pool_layers(cache, meta), meta,
                               CpuBackend()), cache))
    assert all(step is not None for step in model.native_layers.steps)
    (want, want_cache), (got, got_cache) = outs
    assert torch.equal(got, want)
    assert torch.equal(got_cache, want_cache)
