"""The wide (16-bit) prefill tiles: quantize_activations_wide, quant_matmul_wide and the
path quant_matmul_stack takes for float rows past the decode sizes (kernels/cpu/quant.py),
on random GGUF blocks of every type (tests/kernels/quant_cases.py).

Notation as in test_quant_matmul.py, with q_i and dx_b the 16-bit rows: dx_b = amax_b /
16383 over block b (32 elements), q_i = nearbyint(x_i / dx_b). Two checks of each product:

1. Against the float64 product x @ W.T: rounding x_i to dx_b q_i moves it by at most
   dx_b / 2 (the float32 reciprocal adds a relative 2^-23 at most), so
       |Y_j - (x @ W.T)_j| <= sum_b (dx_b / 2) sum_{i in b} |W_ji| (1 + 2^-20) + F_j,
   where dx_b is 127 / 16383 of the 8-bit rows' step: 129 times closer.
2. Against the exact integer arithmetic Y_j = sum_b dx_b sum_{i in b} W*_ji q_i (float64):
   within F_j = max(1e-5, (k / 32 + 16) 2^-23) T_j, T_j = sum_i mag_ji |dx_b q_i|, the
   float32 accumulation (the 8-bit kernels' bound: the same terms, each converted once and
   rounded two or three times). A wrong integer term moves Y by hundreds of F.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.cpu import quant
from kernels.quant.formats import BY_NAME
from tests.kernels.cpu.activation_cases import activations
from tests.kernels.quant_cases import TYPE_NAMES, check_product, exact_case, round_blocks

ROWS = (1, 2, 3, 7, 8, 9, 64)
LARGE_ROWS = (65, 255, 256, 257, 1000)  # 65: a follow-up turn's chunk
LARGE_TYPES = ("Q2_K", "Q4_K", "Q6_K", "Q4_1")


def _shapes(name: str) -> list[tuple[int, int]]:
    # k of one block or super-block, several, and past one 512-element chunk on a tail chunk
    # of 1, 2 or 8 blocks (its own word order, wide.h).
    ks = (256, 768, 1280) if BY_NAME[name].block_size == 256 else (32, 96, 544, 576, 1056)
    return [(n, k) for n in (7, 33) for k in ks]


def _isas() -> list[str]:
    import kernels.cpu
    if not kernels.cpu.available():
        return ["portable"]
    order = ["portable", "avx2", "avx512", "avx512vnni"]
    return order[:order.index(torch.ops.folio_cpu.best_isa()) + 1]


def _activations(m: int, k: int, seed: int) -> torch.Tensor:
    x = activations(m, k, seed)
    x[:, 5] *= 40  # an outlier channel: only its own block's step grows
    return x


def wide_model(x: np.ndarray):
    """float32 [m, k] -> (q int16 [m, k], d, m0, m1 float32 [m, k / 32]): the layout's
    definition in NumPy float32 (d = amax / 16383, q = rint(x * (1 / d)), clamped)."""
    m, k = x.shape
    q, d = round_blocks(x, 16383)
    m0 = (d * q[..., :16].sum(axis=-1)).astype(np.float32)
    m1 = (d * q.sum(axis=-1)).astype(np.float32)
    return q.astype(np.int16).reshape(m, k), d.astype(np.float32), m0, m1


def _word_rows(k: int, c: int) -> int:
    """Word rows of chunk c (wide.h): 16, or the power of two at or above a last chunk's
    block count."""
    blocks = min(16, k // 32 - 16 * c)
    return 1 << (blocks - 1).bit_length()


def parse_wide(rows: np.ndarray, k: int):
    """The op's bytes -> (q, d, m0, m1) as wide_model gives them, and what lies past k."""
    m = rows.shape[0]
    chunks = rows.reshape(m, -1, quant.WIDE_CHUNK_BYTES)
    words = np.ascontiguousarray(chunks[..., :1024]).view(np.int16).reshape(m, -1, 16, 16, 2)
    floats = [np.ascontiguousarray(chunks[..., o:o + 64]).view(np.float32)
              for o in (1024, 1088, 1152)]  # [m, c, 16 lanes]
    q = np.zeros((m, chunks.shape[1] * 512), np.int16)
    scales = [np.zeros((m, chunks.shape[1] * 16), np.float32) for _ in floats]
    rest = []
    for c in range(chunks.shape[1]):
        nb = _word_rows(k, c)
        p = 16 // nb
        # Word (j, l): elements (l % p) 2 nb + 2j, +1 of block l / p; every lane of a block
        # holds its scales.
        for lane in range(16):
            at = 512 * c + 32 * (lane // p) + (lane % p) * 2 * nb
            q[:, at:at + 2 * nb] = words[:, c, :nb, lane].reshape(m, -1)
        for out, f in zip(scales, floats, strict=True):
            out[:, 16 * c:16 * c + 16 // p] = f[:, c, ::p]
            rest.append(f[:, c] - np.repeat(f[:, c, ::p], p, axis=1))
        rest.append(words[:, c, nb:].ravel())
    parsed = (q[:, :k], *(f[:, :k // 32] for f in scales))
    return parsed, np.concatenate([q[:, k:].ravel()] + [r.ravel() for r in rest])


def _check(name: str, n: int, k: int, m: int, seed: int = 0) -> None:
    case = exact_case(name, n, k)
    x = _activations(m, k, seed=seed + m)
    y = quant.quant_matmul_wide(x, torch.from_numpy(case[0]), BY_NAME[name].type_id, k)
    assert y.dtype == torch.float32 and y.shape == (m, n)
    q, d, _, _ = wide_model(x.numpy())
    dx = np.repeat(d.astype(np.float64), 32, axis=1)
    check_product(y.double().numpy(), x.double().numpy(), case, dx * q, dx,
                  f"{name} m={m} n={n} k={k}")


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("k", [32, 96, 160, 512, 544, 576, 1280])
def test_rows_bit_equal_to_numpy_model(isa_path, m, k):
    x = _activations(m, k, seed=k)
    x[0, :32] = 0  # an all-zero block: d = 0, q = 0
    rows = quant.quantize_activations_wide(x)
    assert rows.dtype == torch.uint8
    assert rows.shape == (m, -(-k // quant.WIDE_CHUNK) * quant.WIDE_CHUNK_BYTES)
    got, padding = parse_wide(rows.numpy(), k)
    for part, want in zip(got, wide_model(x.numpy()), strict=True):
        np.testing.assert_array_equal(part, want)
    assert not padding.any()


@pytest.mark.parametrize("name", TYPE_NAMES)
@pytest.mark.parametrize("m", ROWS)
def test_product(name, m):
    for n, k in _shapes(name):
        _check(name, n, k, m)


@pytest.mark.parametrize("name", LARGE_TYPES)
@pytest.mark.parametrize("m", LARGE_ROWS)
def test_product_prefill_rows(name, m):
    """Several tiles of activation rows, and k past one slice of the tiles (2,048): 2304
    ends on a partial chunk, 2080 (32-weight blocks) on a partial group too."""
    shapes = [(33, 256), (5, 2304)] + ([(3, 2080)] if BY_NAME[name].block_size == 32 else [])
    for n, k in shapes:
        _check(name, n, k, m)


@pytest.mark.parametrize("isa", _isas()[1:])
@pytest.mark.parametrize("name", TYPE_NAMES)
def test_isa_paths_match_portable(isa, name):
    """Each SIMD path against the portable one: both within the float32 bound of the exact
    integer arithmetic, so within twice that of each other."""
    n, k = 33, 1280 if BY_NAME[name].block_size == 256 else 1056
    blocks, _, _, mag = exact_case(name, n, k)
    w = torch.from_numpy(blocks)
    for m in (1, 5, 70):
        x = _activations(m, k, seed=m)
        try:
            torch.ops.folio_cpu.set_isa("portable")
            base = quant.quant_matmul_wide(x, w, BY_NAME[name].type_id, k).double().numpy()
            torch.ops.folio_cpu.set_isa(isa)
            got = quant.quant_matmul_wide(x, w, BY_NAME[name].type_id, k).double().numpy()
        finally:
            torch.ops.folio_cpu.set_isa(torch.ops.folio_cpu.best_isa())
        q, d, _, _ = wide_model(x.numpy())
        xdq = np.repeat(d.astype(np.float64), 32, axis=1) * q
        bound = 2 * max(1e-5, (k / 32 + 16) * 2.0 ** -23) * (np.abs(xdq) @ mag.T)
        assert (np.abs(got - base) <= bound + 1e-30).all(), (isa, m)


@pytest.mark.parametrize("m", [17, 40, 300])
def test_the_stack_takes_the_wide_tiles_for_float_prefill_rows(isa_path, m):
    """Float rows past the decode sizes (AVX-512) or from 128 rows (AVX2):
    quant_matmul_stack's result is quant_matmul_wide's per matrix, side by side in its
    columns, with or without pairs (their 15 bits would add nothing), rows orders applied."""
    isa = torch.ops.folio_cpu.isa()
    if isa == "portable" or (isa == "avx2" and m < 128):
        pytest.skip(f"the 8-bit tiles serve {m} rows on the {isa} path")
    k = 512
    mats = [exact_case("Q4_K", 48, k)[0], exact_case("Q6_K", 16, k)[0],
            exact_case("Q8_0", 33, k)[0]]
    types = [BY_NAME[t].type_id for t in ("Q4_K", "Q6_K", "Q8_0")]
    order = torch.randperm(48, generator=torch.Generator().manual_seed(4))
    rows = [order, None, None]
    x = _activations(m, k, seed=m)
    each = torch.cat([quant.quant_matmul_wide(x, torch.from_numpy(b), t, k, r)
                      for b, t, r in zip(mats, types, rows, strict=True)], dim=1)
    for pairs in (True, False):
        out = quant.quant_matmul_stack(x, [torch.from_numpy(b) for b in mats], types, k, rows,
                                       pairs)
        assert torch.equal(out, each), pairs


@pytest.mark.parametrize("m", [65, 300])
def test_the_stack_does_not_depend_on_the_threads(m):
    """However the tiles fall to the threads, a stack's result is the same bits on one
    thread, two or three, as each matrix alone in a stack of one (the same tiles for m
    rows: the wide ones, or the 8-bit ones below AVX2's 128 rows)."""
    k = 1024
    names = ("Q4_K", "Q6_K", "Q8_0")
    mats = [torch.from_numpy(exact_case(name, n, k)[0]) for name, n in zip(names, (96, 40, 33),
                                                                           strict=True)]
    types = [BY_NAME[t].type_id for t in names]
    x = _activations(m, k, seed=m)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(quant.quant_matmul_stack(x, mats, types, k, [None] * 3, False))
    finally:
        torch.set_num_threads(before)
    each = torch.cat([quant.quant_matmul_stack(x, [w], [t], k, [None], False)
                      for w, t in zip(mats, types, strict=True)], dim=1)
    for out in outs:
        assert torch.equal(out, each)


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K"])
def test_rows_and_strided_views(name):
    fmt = BY_NAME[name]
    n, k = 33, 512
    w = torch.from_numpy(exact_case(name, n, k)[0])
    x = _activations(40, k, seed=7)
    y = quant.quant_matmul_wide(x, w, fmt.type_id, k)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    for picked in (perm, torch.cat([perm, perm[:5]])):  # a permutation; plus repeats
        assert torch.equal(quant.quant_matmul_wide(x, w, fmt.type_id, k, rows=picked),
                           y[:, picked])
    padded = torch.cat([w, torch.zeros(n, 40, dtype=torch.uint8)], dim=1)[:, :w.shape[1]]
    assert torch.equal(quant.quant_matmul_wide(x, padded, fmt.type_id, k), y)
    assert torch.equal(quant.quant_matmul_wide(x, w[::2], fmt.type_id, k), y[:, ::2])
    assert torch.equal(quant.quant_matmul_wide(x.t().contiguous().t(), w, fmt.type_id, k), y)


def test_non_finite_activations_propagate():
    w = torch.from_numpy(exact_case("Q4_K", 7, 512)[0])
    x = _activations(40, 512, seed=5)
    clean = quant.quant_matmul_wide(x, w, 12, 512)
    x[0, 3] = float("nan")
    x[39, 300] = float("inf")
    y = quant.quant_matmul_wide(x, w, 12, 512)
    assert y[0].isnan().all() and y[39].isnan().all()
    assert torch.equal(y[1:39], clean[1:39])


@pytest.mark.parametrize("call, name", [
    (lambda w: quant.quant_matmul_wide(torch.zeros(2, 256).double(), w, 12, 256), "x"),
    (lambda w: quant.quant_matmul_wide(torch.zeros(2, 512), w, 12, 256), "x"),
    (lambda w: quant.quant_matmul_wide(torch.zeros(2, 256), w[:, :100], 12, 256), "w"),
    (lambda w: quant.quant_matmul_wide(torch.zeros(2, 256), w, 99, 256), "type_id"),
    (lambda w: quant.quant_matmul_wide(torch.zeros(2, 256), w, 12, 256,
                                       rows=torch.tensor([7])), "rows"),
    (lambda w: quant.quantize_activations_wide(torch.zeros(2, 100)), "x"),
])
def test_bad_arguments_name_the_argument(call, name):
    w = torch.from_numpy(exact_case("Q4_K", 7, 256)[0])
    with pytest.raises(RuntimeError) as info:
        call(w)
    assert str(info.value).split()[0] in (name, f"{name}'s"), info.value
