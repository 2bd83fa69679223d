"""The small-batch matmul path gives F.linear's result."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.layers.linear import SMALL_BATCH, StackedLinear, small_batch_linear


@pytest.mark.parametrize("rows", [1, 2, 5, SMALL_BATCH - 1])
@pytest.mark.parametrize("bias", [False, True])
def test_small_batch_linear_equals_f_linear(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=gen)
    b = torch.randn(96, generator=gen) if bias else None
    x = torch.randn(rows, 64, generator=gen)
    out = small_batch_linear(x, weight, b)
    assert out.shape == (rows, 96)
    torch.testing.assert_close(out, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


def test_stacked_linear_takes_the_small_batch_path_only_for_small_fp32_batches(monkeypatch):
    layer = StackedLinear(8, (4, 4), bias=False, dtype=torch.float32, device="cpu")
    layer.weight.data.normal_()
    calls = []
    monkeypatch.setattr("engine.layers.linear.small_batch_linear",
                        lambda *a: calls.append(a[0].shape[0]) or F.linear(*a))
    layer(torch.randn(3, 8))
    layer(torch.randn(SMALL_BATCH, 8))
    assert calls == [3]
