"""StackedLinear: the packed (oneDNN) and small-batch matmul paths give F.linear's result."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.layers import onednn
from engine.layers.linear import StackedLinear
from engine.layers.weights import SMALL_BATCH, small_batch_linear


@pytest.mark.parametrize("rows", [1, 2, 5, SMALL_BATCH - 1])
@pytest.mark.parametrize("bias", [False, True])
def test_small_batch_linear_equals_f_linear(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=gen)
    b = torch.randn(96, generator=gen) if bias else None
    x = torch.randn(rows, 64, generator=gen)
    out = small_batch_linear(x, weight)
    out = out if b is None else out + b
    assert out.shape == (rows, 96)
    torch.testing.assert_close(out, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


def test_stacked_linear_takes_the_small_batch_path_only_for_small_fp32_batches(monkeypatch):
    layer = StackedLinear(8, (4, 4), bias=False, dtype=torch.float32, device="cpu")
    layer.block(0, "weight").normal_()
    layer.block(1, "weight").normal_()
    calls = []
    monkeypatch.setattr("engine.layers.weights.small_batch_linear",
                        lambda *a: calls.append(a[0].shape[0]) or F.linear(*a))
    layer(torch.randn(3, 8))
    layer(torch.randn(SMALL_BATCH, 8))
    assert calls == [3]


def _loaded_layer(bias: bool,
                  seed: int = 0) -> tuple[StackedLinear, torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    layer = StackedLinear(64, (32, 64), bias=bias, dtype=torch.float32, device="cpu")
    weight = torch.randn(96, 64, generator=gen)
    b = torch.randn(96, generator=gen) if bias else None
    layer.block(0, "weight").copy_(weight[:32])
    layer.block(1, "weight").copy_(weight[32:])
    if b is not None:
        layer.block(0, "bias").copy_(b[:32])
        layer.block(1, "bias").copy_(b[32:])
    layer.prepare()
    return layer, weight, b


@pytest.mark.skipif(not onednn.available(), reason="this PyTorch build has no oneDNN")
@pytest.mark.parametrize("rows", [0, 1, 2, 4, 64, 200])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_layer_equals_f_linear_and_holds_one_copy(rows, bias):
    layer, weight, b = _loaded_layer(bias, seed=rows)
    assert layer.weight.numel() == 0 and layer.derived_bytes == weight.numel() * 4
    assert torch.equal(layer.dense_weight(), weight)
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(1))
    out = layer(x)
    assert out.shape == (rows, 96) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)
    # A strided input (a transposed view) gives the same result.
    torch.testing.assert_close(layer(x.t().contiguous().t()), out)


@pytest.mark.skipif(not onednn.available(), reason="this PyTorch build has no oneDNN")
def test_a_packed_layer_can_be_loaded_again():
    layer, weight, _ = _loaded_layer(bias=False)
    # block() brings the plain matrix back; the new values are packed by the next prepare.
    assert torch.equal(layer.block(1, "weight"), weight[32:])
    layer.block(1, "weight").mul_(2)
    layer.prepare()
    x = torch.randn(3, 64)
    expected = F.linear(x, torch.cat([weight[:32], 2 * weight[32:]]))
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_without_onednn_the_plain_matrix_stays(monkeypatch):
    monkeypatch.setattr(onednn, "available", lambda: False)
    layer, weight, b = _loaded_layer(bias=True)
    assert torch.equal(layer.weight, weight) and layer.derived_bytes == 0
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer(x), F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


def test_packing_applies_to_float32_on_cpu_only():
    assert onednn.pack(torch.randn(4, 8, dtype=torch.bfloat16)) is None
    assert onednn.pack(torch.randn(4, 8, device="meta")) is None
