"""torch.ops.folio_cpu.quant_matmul and dequantize_rows (kernels/cpu/quant.py) on random
GGUF blocks of every type (tests/kernels/quant_cases.py: random bytes, fp16 scale fields
uniform in [-0.05, 0.05]).

Notation: W the oracle's float32 weights (gguf.quants.dequantize), x float32 activations,
q_i and dx_b their 8-bit quantization (block b of 32), Y the op's result.

Two checks of each product:

1. Against the float64 product x @ W.T. Rounding x_i to dx_b * q_i moves it by at most
   dx_b / 2 (round to nearest; |x_i| <= 127 dx_b so the clamp never bites, and the
   float32 reciprocal 1 / d_b adds a relative 2^-23 at most), so
       |Y_j - (x @ W.T)_j| <= sum_b (dx_b / 2) sum_{i in b} |W_ji| * (1 + 2^-20) + F_j
   where F_j bounds the float32 arithmetic (below).
2. Against the exact value of the integer arithmetic: Y_j = sum_b dx_b sum_{i in b}
   W*_ji q_i with W* = D s q - M o computed exactly (float64, from gguf's own dequantizer
   run with the fp16 fields set to 1 and 0, which isolates the integer terms). Only float32
   accumulation separates the kernels from it: F_j = max(1e-5, (k/32 + 16) 2^-23) * T_j,
   T_j = sum_i mag_ji |dx_b q_i|, mag a bound on the magnitudes of the separate terms
   D s q and M o (4 (|D| max|s q| + |M| max|o|) over each 16-weight sub-block). A wrong
   integer term moves Y by about one term, hundreds of times F for these k.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.cpu import quant
from kernels.quant.formats import BY_NAME
from tests.kernels.cpu.activation_cases import activations, dequantized_act
from tests.kernels.quant_cases import TYPE_NAMES, check_product, exact_case

ROWS = (1, 2, 3, 7, 8, 9, 10, 11, 12, 13, 16, 64)
LARGE_ROWS = (255, 256, 257, 1000)
LARGE_TYPES = ("Q4_K", "Q6_K", "Q8_0")


def _isas() -> list[str]:
    import kernels.cpu
    if not kernels.cpu.available():
        return ["portable"]
    order = ["portable", "avx2", "avx512", "avx512vnni"]
    return order[:order.index(torch.ops.folio_cpu.best_isa()) + 1]


def _shapes(name: str) -> list[tuple[int, int]]:
    ks = (256, 768) if BY_NAME[name].block_size == 256 else (32, 96, 256, 576, 736)
    return [(n, k) for n in (7, 33) for k in ks]


def _float_bound(k: int, xdq: np.ndarray, mag: np.ndarray) -> np.ndarray:
    return max(1e-5, (k / 32 + 16) * 2.0 ** -23) * (np.abs(xdq) @ mag.T)


def _check(name: str, n: int, k: int, m: int, act_model, seed: int = 0) -> None:
    case = exact_case(name, n, k)
    x = activations(m, k, seed=seed + m)
    act = quant.quantize_activations(x)
    y = quant.quant_matmul(x, torch.from_numpy(case[0]), BY_NAME[name].type_id, k)
    assert y.dtype == torch.float32 and y.shape == (m, n)
    xdq, dx = dequantized_act(act, k, act_model)
    check_product(y.double().numpy(), x.double().numpy(), case, xdq, dx,
                  f"{name} m={m} n={n} k={k}")


@pytest.mark.parametrize("name", TYPE_NAMES)
@pytest.mark.parametrize("m", ROWS)
def test_product(name, m, act_model):
    for n, k in _shapes(name):
        _check(name, n, k, m, act_model)


@pytest.mark.parametrize("name", LARGE_TYPES)
@pytest.mark.parametrize("m", LARGE_ROWS)
def test_product_prefill_rows(name, m, act_model):
    """Several tiles of activation rows, and k past one k-chunk of the tiles (2048): 2304
    ends on a partial chunk, 2080 (32-weight blocks) on a partial group too."""
    shapes = [(33, 256), (7, 768), (5, 2304)]
    if BY_NAME[name].block_size == 32:
        shapes.append((3, 2080))
    for n, k in shapes:
        _check(name, n, k, m, act_model)


@pytest.mark.parametrize("isa", _isas())
@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("m", [2, 8, 10])
def test_decode_rows_long_k(isa, name, m, act_model):
    """Decode rows (gemv) at long k: 8 or more rows of k = 4096 are past what the AVX-512
    gemv keeps in L1, so it walks k in chunks, its accumulators waiting between them;
    4128 (32-weight blocks) ends the last chunk on a partial group."""
    k = 4096 if BY_NAME[name].block_size == 256 else 4128
    try:
        torch.ops.folio_cpu.set_isa(isa)
        _check(name, 9, k, m, act_model)
    finally:
        torch.ops.folio_cpu.set_isa(torch.ops.folio_cpu.best_isa())


@pytest.mark.parametrize("isa", _isas()[1:])
@pytest.mark.parametrize("name", TYPE_NAMES)
def test_isa_paths_match_portable(isa, name, act_model):
    """Each SIMD path against the portable one: both within the float32 bound of the
    exact integer arithmetic, so within twice that of each other."""
    fmt = BY_NAME[name]
    n, k = 33, 768
    blocks, _, _, mag = exact_case(name, n, k)
    w = torch.from_numpy(blocks)
    for m in (1, 4, 5, 8, 9, 12, 13, 70):  # the decode path, and tiles
        act = quant.quantize_activations(activations(m, k, seed=m))
        try:
            torch.ops.folio_cpu.set_isa("portable")
            base = quant.quant_matmul(act, w, fmt.type_id, k).double().numpy()
            torch.ops.folio_cpu.set_isa(isa)
            got = quant.quant_matmul(act, w, fmt.type_id, k).double().numpy()
        finally:
            torch.ops.folio_cpu.set_isa(torch.ops.folio_cpu.best_isa())
        xdq, _ = dequantized_act(act, k, act_model)
        assert (np.abs(got - base) <= 2 * _float_bound(k, xdq, mag) + 1e-30).all(), (isa, m)


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("m", [1, 6, 40])
def test_rows_views_and_quantized_input(name, m):
    """`rows` reads weight rows in the given order (a permutation of them all, read in
    file order and each product put in its column, or any other list of rows), a
    row-strided view of w reads like its copy, and pre-quantized activations give the float
    input's result: all bit-equal."""
    fmt = BY_NAME[name]
    n, k = 33, 512
    blocks, *_ = exact_case(name, n, k)
    w = torch.from_numpy(blocks)
    x = activations(m, k, seed=7)
    y = quant.quant_matmul(x, w, fmt.type_id, k)
    assert torch.equal(quant.quant_matmul(quant.quantize_activations(x), w, fmt.type_id, k), y)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    twice = perm.clone()
    twice[0] = twice[1]  # n rows, one of them twice: not a permutation
    for picked in (perm, twice, torch.cat([perm, perm[:5]])):
        assert torch.equal(quant.quant_matmul(x, w, fmt.type_id, k, rows=picked), y[:, picked])
    wide = torch.cat([w, torch.zeros(n, 40, dtype=torch.uint8)], dim=1)[:, :w.shape[1]]
    assert wide.stride(0) > w.shape[1]
    assert torch.equal(quant.quant_matmul(x, wide, fmt.type_id, k), y)
    assert torch.equal(quant.quant_matmul(x, w[::2], fmt.type_id, k), y[:, ::2])


@pytest.mark.parametrize("name", TYPE_NAMES)
def test_dequantize_rows_bit_equal(name):
    fmt = BY_NAME[name]
    for n, k in [(9, 256), (5, 768)] + ([(6, 96)] if fmt.block_size == 32 else []):
        blocks, w, *_ = exact_case(name, n, k)
        ids = torch.tensor([3, 0, n - 1, 3, 1], dtype=torch.int64)
        got = quant.dequantize_rows(torch.from_numpy(blocks), ids, fmt.type_id, k)
        np.testing.assert_array_equal(got.numpy().view(np.uint32), w[ids.numpy()].view(np.uint32))
        strided = torch.from_numpy(blocks)[::2]
        got = quant.dequantize_rows(strided, torch.tensor([1, 0]), fmt.type_id, k)
        np.testing.assert_array_equal(got.numpy().view(np.uint32), w[::2][[1, 0]].view(np.uint32))


def _bad_calls():
    fmt = BY_NAME["Q4_K"]
    blocks, *_ = exact_case("Q4_K", 7, 256)
    w = torch.from_numpy(blocks)
    x = torch.zeros(2, 256)
    t = fmt.type_id
    return [
        (lambda: quant.quant_matmul(x.double(), w, t, 256), "x"),
        (lambda: quant.quant_matmul(torch.zeros(2, 512), w, t, 256), "x"),
        (lambda: quant.quant_matmul(torch.zeros(2, 100, dtype=torch.uint8), w, t, 256), "x"),
        (lambda: quant.quant_matmul(x, w.view(torch.int8), t, 256), "w"),
        (lambda: quant.quant_matmul(x, w[:, :100], t, 256), "w"),
        (lambda: quant.quant_matmul(x, w, 99, 256), "type_id"),
        (lambda: quant.quant_matmul(torch.zeros(2, 96), w, t, 96), "k"),
        (lambda: quant.quant_matmul(x, w, t, 256, rows=torch.tensor([0, 7])), "rows"),
        (lambda: quant.quant_matmul(x, w, t, 256, rows=torch.tensor([-1])), "rows"),
        (lambda: quant.quant_matmul(x, w, t, 256, rows=torch.tensor([0], dtype=torch.int32)),
         "rows"),
        (lambda: quant.dequantize_rows(w, torch.tensor([7]), t, 256), "ids"),
        (lambda: quant.dequantize_rows(w, torch.tensor([0.0]), t, 256), "ids"),
        (lambda: quant.dequantize_rows(w, torch.tensor([0]), 1, 256), "type_id"),
        (lambda: quant.dequantize_rows(w, torch.tensor([0]), t, 300), "k"),
    ]


@pytest.mark.parametrize("index", range(len(_bad_calls())))
def test_bad_arguments(index):
    call, name = _bad_calls()[index]
    with pytest.raises((RuntimeError, ValueError)) as info:
        call()
    assert str(info.value).startswith(f"{name} "), info.value


@pytest.mark.parametrize("m", [1, 40])
def test_non_finite_activations_propagate(m):
    """A NaN or infinite activation makes its row's products NaN (its block's scale is NaN)
    rather than a silently wrong number; the other rows are untouched."""
    blocks, *_ = exact_case("Q4_K", 7, 512)
    w = torch.from_numpy(blocks)
    x = activations(m, 512, seed=5)
    clean = quant.quant_matmul(x, w, 12, 512)
    x[0, 3] = float("nan")
    if m > 1:
        x[m - 1, 300] = float("inf")
    y = quant.quant_matmul(x, w, 12, 512)
    assert y[0].isnan().all() and y[m - 1].isnan().all()
    assert torch.equal(y[1:m - 1], clean[1:m - 1])
