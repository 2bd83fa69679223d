"""MXFP4 (GGUF type 39) in the native CPU library: the blocks multiplied as stored, each
E2M1 code's doubled value an int8 weight and the halved E8M0 scale its block's D
(kernels/cpu/csrc/quant/mxfp4.h), with the 8-bit activations of the other types (decode
rows through each ISA's gemv, more rows through the 8-bit tiles) and the 16-bit rows of
the wide prefill tiles.

Notation as in test_quant_matmul.py. MXFP4's weights are exact in float32 (a small integer
times a power of two), so W* = W: the float64 bound checks (tests/kernels/quant_cases.py
``check_product``) hold with ``mag`` = 4 max |W| over each 16-weight sub-block. And with
activations whose blocks are integers times one power of two, and weight scales within
a few powers of two of each other, every partial sum of the products is an integer
multiple of the smallest power of two below 2^24 of it: float32 adds it exactly in any
order, so every path equals the NumPy model of the integer arithmetic bit for bit (the
8-bit rows and the wide ones, each on activations its rows hold exactly)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from kernels.cpu import quant
from tests.kernels.cpu.activation_cases import activations, dequantized_act
from tests.kernels.mxfp4_cases import MXFP4, model_weights, random_mxfp4
from tests.kernels.quant_cases import check_product

ROWS = (1, 2, 3, 7, 8, 9, 64, 255, 256, 257)


def _isas() -> list[str]:
    import kernels.cpu
    if not kernels.cpu.available():  # loads the library; the module is skipped without it
        return ["portable"]
    order = ["portable", "avx2", "avx512", "avx512vnni"]
    return order[:order.index(torch.ops.folio_cpu.best_isa()) + 1]


def case(n: int, k: int, seed: int = 0):
    """quant_cases.exact_case's tuple for MXFP4: blocks, W (gguf), W* (exact), mag."""
    blocks = random_mxfp4(n, k, seed)
    w = dequantize(blocks, GGMLQuantizationType.MXFP4)
    exact = model_weights(blocks, k)
    np.testing.assert_array_equal(w.astype(np.float64), exact)  # gguf agrees with the spec
    mag = 4 * np.repeat(np.abs(exact).reshape(n, -1, 16).max(axis=-1), 16, axis=1)
    return blocks, w, exact, mag


def exact_activations(m: int, k: int, seed: int, qmax: int = 127, small: int = 127,
                      step: float = 2.0 ** -6) -> torch.Tensor:
    """Blocks of integers in [-small, small], each holding a +-qmax, times `step`: rows of
    qmax levels (127: the 8-bit rows, 16383: the wide ones) hold them exactly (d = step,
    q = the integers)."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-small, small + 1, size=(m, k // 32, 32))
    q[..., 0] = rng.choice([-qmax, qmax], size=(m, k // 32))
    return torch.from_numpy((q.reshape(m, k) * step).astype(np.float32))


def with_isa(isa: str, call):
    try:
        torch.ops.folio_cpu.set_isa(isa)
        return call()
    finally:
        torch.ops.folio_cpu.set_isa(torch.ops.folio_cpu.best_isa())


@pytest.mark.parametrize("m", ROWS)
def test_product_within_the_bounds(m, act_model):
    for n, k in ((7, 32), (33, 96), (33, 768), (5, 2080)):
        blocks, w, exact, mag = c = case(n, k, seed=n + k)
        x = activations(m, k, seed=m)
        y = quant.quant_matmul(x, torch.from_numpy(blocks), MXFP4, k)
        assert y.dtype == torch.float32 and y.shape == (m, n)
        xdq, dx = dequantized_act(quant.quantize_activations(x), k, act_model)
        check_product(y.double().numpy(), x.double().numpy(), c, xdq, dx,
                      f"MXFP4 m={m} n={n} k={k}")


@pytest.mark.parametrize("isa", _isas())
@pytest.mark.parametrize("m", ROWS)
def test_every_path_equals_the_integer_model_exactly(isa, m):
    n, k = 9, 768
    blocks = random_mxfp4(n, k, seed=m, exponents=(124, 128))
    x = exact_activations(m, k, seed=m)
    expected = x.double().numpy() @ model_weights(blocks, k).T
    w = torch.from_numpy(blocks)
    y = with_isa(isa, lambda: quant.quant_matmul(x, w, MXFP4, k))
    np.testing.assert_array_equal(y.double().numpy(), expected)
    # The wide rows: one scale per row and small integers beside each block's 16383 keep
    # the sums below 2^24 of their step.
    blocks = random_mxfp4(n, k, seed=m, exponents=(124, 125))
    x = exact_activations(m, k, seed=m, qmax=16383, small=100, step=2.0 ** -12)
    expected = x.double().numpy() @ model_weights(blocks, k).T
    w = torch.from_numpy(blocks)
    wide = with_isa(isa, lambda: quant.quant_matmul_wide(x, w, MXFP4, k))
    np.testing.assert_array_equal(wide.double().numpy(), expected)


@pytest.mark.parametrize("isa", _isas()[1:])
def test_isa_paths_match_portable(isa, act_model):
    n, k = 33, 768
    blocks, _, _, mag = case(n, k)
    w = torch.from_numpy(blocks)
    for m in (1, 4, 5, 8, 9, 12, 13, 70):
        act = quant.quantize_activations(activations(m, k, seed=m))
        base = with_isa("portable", lambda act=act: quant.quant_matmul(act, w, MXFP4, k))
        got = with_isa(isa, lambda act=act: quant.quant_matmul(act, w, MXFP4, k))
        xdq, _ = dequantized_act(act, k, act_model)
        bound = 2 * max(1e-5, (k / 32 + 16) * 2.0 ** -23) * (np.abs(xdq) @ mag.T)
        assert (np.abs((got.double() - base.double()).numpy()) <= bound + 1e-30).all(), (isa, m)


@pytest.mark.parametrize("m", (1, 9, 200))
def test_wide_and_stacked_products(m):
    """The 16-bit rows (quant_matmul_wide whatever m, and quant_matmul_stack's float rows
    past the decode sizes, 200 here): 129 times finer steps than the 8-bit rows'."""
    n, k = 17, 576
    blocks, w, exact, mag = case(n, k, seed=3)
    x = activations(m, k, seed=m)
    x64 = x.double().numpy()
    step = np.repeat(np.abs(x64).reshape(m, -1, 32).max(axis=-1) / 16383, 32, axis=1)
    bound = 0.5 * (1 + 2.0 ** -20) * (step @ np.abs(exact).T) + 2 * max(
        1e-5, (k / 32 + 16) * 2.0 ** -23) * (np.abs(x64) @ mag.T)
    t = torch.from_numpy(blocks)
    products = [quant.quant_matmul_wide(x, t, MXFP4, k)]
    if m > 16:  # past every ISA's decode rows (kGemvRows)
        products.append(quant.quant_matmul_stack(x, [t, t[:5]], [MXFP4, MXFP4], k,
                                                 [None, None], False)[:, :n])
    for y in products:
        assert (np.abs(y.double().numpy() - x64 @ exact.T) <= bound).all(), m


def test_dequantize_rows_bit_equal_to_gguf():
    blocks, w, *_ = case(9, 96)
    ids = torch.tensor([3, 0, 8, 3])
    got = quant.dequantize_rows(torch.from_numpy(blocks), ids, MXFP4, 96)
    np.testing.assert_array_equal(got.numpy().view(np.uint32), w[ids.numpy()].view(np.uint32))


def test_a_k_off_the_block_size_is_refused_naming_it():
    w = torch.zeros(2, 17, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="^k "):
        quant.quant_matmul(torch.zeros(1, 48), w, MXFP4, 48)
