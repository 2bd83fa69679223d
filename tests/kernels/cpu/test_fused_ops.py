"""The fused native ops against the PyTorch code of the layers they replace: each layer is
run twice, once with the fused path switched off (engine.layers.native.fused_cpu False)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.layers import attention as attention_layer
from engine.layers import mlp as mlp_layer
from engine.layers import norm as norm_layer
from engine.layers.attention import PagedSelfAttention
from engine.layers.mlp import GatedMLP
from engine.layers.norm import GemmaRMSNorm, RMSNorm
from engine.layers.rotary import RotaryEmbedding, apply_partial_rotary
from kernels import AttentionMetadata, allocate_kv_cache
from kernels.cpu import ops
from kernels.cpu.attention import CpuBackend
from kernels.reference.backend import TorchBackend

RTOL = ATOL = 1e-5


@pytest.fixture
def pytorch_path(monkeypatch):
    """Call to switch the layers back to their PyTorch code."""
    def switch_off():
        for module in (norm_layer, mlp_layer, attention_layer):
            monkeypatch.setattr(module, "fused_cpu", lambda *tensors: False)
    return switch_off


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def fill(linears, seed, scale):
    """Random weights loaded as a checkpoint loads them, then packed (StackedLinear)."""
    for i, linear in enumerate(linears):
        linear.slot().copy_(randn(*linear.shape, seed=seed + i) * scale)
        if linear.bias is not None:
            linear.bias.data.copy_(randn(*linear.bias.shape, seed=seed + 50 + i) * scale)
        linear.prepare()


@pytest.mark.parametrize("norm_class", [RMSNorm, GemmaRMSNorm])
def test_norms_and_add_and_norm(pytorch_path, norm_class):
    norm = norm_class(576, 1e-5, torch.float32, "cpu")
    norm.weight.data = randn(576, seed=1)
    x, residual = randn(5, 576, seed=2), randn(5, 576, seed=3)
    heads = randn(5, 9 + 6, 64, seed=4)[:, :9]  # a strided q view, as q_norm gets it
    head_norm = norm_class(64, 1e-6, torch.float32, "cpu")
    head_norm.weight.data = randn(64, seed=5)
    fused = (norm(x), *norm.add_and_norm(x.clone(), residual), head_norm(heads))
    pytorch_path()
    want = (norm(x), *norm.add_and_norm(x.clone(), residual), head_norm(heads))
    for got, expected in zip(fused, want, strict=True):
        torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)


def test_add_rms_norm_sums_into_the_residual_in_place():
    residual, x, weight = randn(3, 64, seed=1), randn(3, 64, seed=2), randn(64, seed=3)
    total = residual + x
    normed = ops().add_rms_norm(residual, x, weight, 1e-6, 0.0)
    torch.testing.assert_close(residual, total, rtol=0, atol=0)
    torch.testing.assert_close(normed, F.rms_norm(total, (64,), weight, 1e-6), rtol=RTOL,
                               atol=ATOL)


@pytest.mark.parametrize("activation", ["silu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("tokens", [1, 37])
def test_gated_mlp(pytorch_path, activation, tokens):
    mlp = GatedMLP(64, 1536, False, torch.float32, "cpu", activation)
    fill((mlp.gate_up_proj, mlp.down_proj), 1, 0.3)
    x = randn(tokens, 64, seed=3) * 3
    fused = mlp(x)
    pytorch_path()
    want = mlp(x)
    # The down projection sums 1,536 products: an ulp of the activation, times the output's
    # scale, is what two exact implementations may differ by.
    torch.testing.assert_close(fused, want, rtol=RTOL, atol=ATOL * float(want.abs().max()))


@pytest.mark.parametrize("transposed", [False, True])
def test_gated_activations_over_the_float_range(transposed):
    gate_up = torch.cat((torch.linspace(-100, 100, 4001), torch.linspace(-3, 3, 4001)))[None]
    if transposed:  # as small_batch_linear returns it: a [T, 2i] view with column stride 2
        gate_up = torch.cat((gate_up, gate_up)).t().contiguous().t()[:1]
    gate, up = gate_up[:, :4001], gate_up[:, 4001:]
    torch.testing.assert_close(ops().silu_mul(gate_up), F.silu(gate) * up, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(ops().gelu_tanh_mul(gate_up),
                               F.gelu(gate, approximate="tanh") * up, rtol=RTOL, atol=ATOL)


def decode_metadata(num_tokens: int, past: int) -> AttentionMetadata:
    """One sequence: `past` cached tokens (blocks 3, 1, 4, ...), num_tokens new ones."""
    seq_len = past + num_tokens
    table = torch.tensor([[3, 1, 4, 0, 2, 5][: -(-seq_len // 16)]], dtype=torch.int32)
    slots = [int(table[0, p // 16]) * 16 + p % 16 for p in range(past, seq_len)]
    return AttentionMetadata(torch.tensor([0, num_tokens], dtype=torch.int32),
                             torch.tensor([seq_len], dtype=torch.int32), table,
                             torch.tensor(slots), num_tokens, seq_len)


@pytest.mark.parametrize("variant", ["llama", "qk_norm", "partial_rotary", "torch_backend",
                                     "float16_pool"])
def test_attention_layer(pytorch_path, variant):
    """Rotary + KV write + attention: the fused layer against its PyTorch code, both over the
    same starting pool; the pools after must agree too. On the native backend the fused
    path must be the one taken, over a float16 pool (its default) as over float32."""
    kwargs = dict(qk_norm_eps=1e-6 if variant == "qk_norm" else None)
    rotary_dim = 48 if variant == "partial_rotary" else 64
    if variant == "partial_rotary":
        kwargs["rotate"] = apply_partial_rotary
    layer = PagedSelfAttention(192, 6, 2, 64, qkv_bias=True, o_bias=False, dtype=torch.float32,
                               device="cpu", **kwargs)
    fill((layer.qkv_proj, layer.o_proj), 10, 0.1)
    for norm in (layer.q_norm, layer.k_norm):
        if norm is not None:
            norm.weight.data.copy_(randn(64, seed=20))
    rotary = RotaryEmbedding(rotary_dim, 128, 10000.0, None, torch.float32, "cpu")
    backend = TorchBackend() if variant == "torch_backend" else CpuBackend()
    fused_writes = []
    if isinstance(backend, CpuBackend):
        native_write = backend.rotary_write_kv
        backend.rotary_write_kv = lambda *args: fused_writes.append(1) or native_write(*args)
    pool_dtype = torch.float16 if variant == "float16_pool" else torch.float32
    # Both paths round their float32 K/V to the pool's halves; a rotated value at a
    # rounding boundary may land one half-ulp apart (a few 1e-4 at these magnitudes).
    tol = 2e-3 if pool_dtype == torch.float16 else RTOL
    start = allocate_kv_cache(1, 6, 16, 2, 64, pool_dtype, "cpu", True)[0]
    start.copy_(randn(*start.shape, seed=3))
    results = []
    for fused in (True, False):
        if not fused:
            pytorch_path()
        pool = start.clone()
        outs = []
        for num_tokens, past in ((20, 30), (1, 50)):
            meta = decode_metadata(num_tokens, past)
            positions = torch.arange(past, past + num_tokens)
            cos, sin = rotary.lookup(positions)
            hidden = randn(num_tokens, 192, seed=past)
            with torch.inference_mode():
                outs.append(layer(hidden, cos, sin, pool[0], pool[1], meta, backend))
        results.append((outs, pool))
        if fused and isinstance(backend, CpuBackend):
            assert len(fused_writes) == 2  # one fused op per forward
    for got, want in zip(results[0][0], results[1][0], strict=True):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=tol, atol=tol)
