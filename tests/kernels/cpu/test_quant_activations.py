"""torch.ops.folio_cpu.quantize_activations (kernels/cpu/quant.py) against its NumPy model:
q, d and the int16 sums bit-equal, in the documented byte layout, on every ISA path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.cpu import quant

OPS = torch.ops.folio_cpu if hasattr(torch.ops, "folio_cpu") else None

def _isas() -> list[str]:
    import kernels.cpu
    if not kernels.cpu.available():
        return ["portable"]
    order = ["portable", "avx2", "avx512", "avx512vnni"]
    return order[:order.index(torch.ops.folio_cpu.best_isa()) + 1]

@pytest.fixture(params=_isas())
def isa(request):
    """Run the test on one ISA path, restoring the best one after."""
    torch.ops.folio_cpu.set_isa(request.param)
    try:
        yield request.param
    finally:
        torch.ops.folio_cpu.set_isa(torch.ops.folio_cpu.best_isa())

def _inputs(m: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen) * 4
    if m > 1:
        x[1, :32] = 0  # d = 0: q = 0
    if k >= 64:
        # Ties: amax 127 makes d = 1 exactly, so 2.5 -> 2, 3.5 -> 4, -2.5 -> -2.
        x[0, 32:64] = torch.tensor([127.0, 2.5, 3.5, -2.5, -3.5, 0.5, -0.5, 1.5] * 4)
    return x

@pytest.mark.parametrize("m,k", [(1, 32), (3, 96), (7, 256), (5, 768), (64, 2048)])
def test_bit_equal_to_numpy_model(isa, act_model, m, k):
    quantize_model, parse_act = act_model
    x = _inputs(m, k, seed=k + m)
    act = quant.quantize_activations(x)
    assert act.dtype == torch.uint8 and act.shape == (m, quant.act_row_bytes(k))
    q, d, sums = parse_act(act.numpy(), k)
    q_ref, d_ref, sums_ref = quantize_model(x.numpy())
    np.testing.assert_array_equal(q[:, :k], q_ref)
    np.testing.assert_array_equal(d[:, :k // 32].view(np.uint32), d_ref.view(np.uint32))
    np.testing.assert_array_equal(sums[:, :k // 16], sums_ref)
    # Padding to whole groups of 256 is zeros.
    assert not q[:, k:].any() and not d[:, k // 32:].any() and not sums[:, k // 16:].any()
    if k >= 64:
        np.testing.assert_array_equal(q[0, 32:40], [127, 2, 4, -2, -4, 0, 0, 2])
    if m > 1:
        assert d[1, 0] == 0 and not q[1, :32].any()

def test_layout_sizes():
    assert [quant.act_row_bytes(k) for k in (32, 256, 288, 2048)] == [320, 320, 640, 2560]

def test_row_strided_input(act_model):
    """Rows with unit stride but a row stride past k (a column slice of a wider tensor),
    and a transposed (non-unit-stride) input, quantize as their contiguous copies."""
    x = _inputs(6, 512, seed=3)
    wide = torch.cat([x, torch.randn(6, 64)], dim=1)[:, :512]
    assert wide.stride(0) == 576
    expected = quant.quantize_activations(x)
    assert torch.equal(quant.quantize_activations(wide), expected)
    assert torch.equal(quant.quantize_activations(x.t().contiguous().t()), expected)

@pytest.mark.parametrize("bad,word", [
    (torch.zeros(2, 64, dtype=torch.float64), "float32"),
    (torch.zeros(64), "2-D"),
    (torch.zeros(2, 48), "multiple of 32"),
])
def test_bad_arguments(bad, word):
    with pytest.raises((RuntimeError, ValueError), match="x") as info:
        quant.quantize_activations(bad)
    assert word in str(info.value)
