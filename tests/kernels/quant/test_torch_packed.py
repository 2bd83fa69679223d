"""The CPU layouts of GGUF-quantized matrices (kernels/quant/torch_packed.py,
kernels/quant/matrix.py) against gguf's reference dequantizer followed by an exact
(float64) product, for every block type, with the error bound each layout promises
derived and asserted. They serve a CPU without the native library (kernels/cpu, whose
own tests are tests/kernels/cpu).

Notation: W is the oracle's float32 matrix, x the activations, ref = x @ W.T in float64.
u = 2**-8 is bfloat16's unit roundoff (8 significant bits: round to nearest moves a value
by at most 2**-8 of itself, RMS about 2**-8 / sqrt(3) of it); gamma(K) = K * 2**-24 bounds
a float32 sum of K products relative to the sum of their magnitudes S = |x| @ |W|.T.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kernels.quant.formats import BY_NAME, QuantizedTensor
from kernels.quant.matrix import RawBlocks, for_product
from kernels.quant.torch_packed import (
    INT4_OP_MAX_ROWS,
    INT4_TYPES,
    INT8_OP_MAX_ROWS,
    Int4Packed,
    Int8Rows,
    tile_rows,
    unpack_packed_rows,
)
from tests.kernels.quant_cases import TYPE_NAMES, oracle_weights, random_quantized

CPU = torch.device("cpu")
# These are the layouts of a CPU without the native library (kernels/cpu): for_product
# picks them only there.
pytestmark = pytest.mark.usefixtures("without_native_cpu")
U_BF16 = 2.0 ** -8
INT4_NAMES = [name for name in TYPE_NAMES if BY_NAME[name].type_id in INT4_TYPES]
INT8_NAMES = [name for name in TYPE_NAMES if BY_NAME[name].type_id not in INT4_TYPES]
# 1 (decode), 3, the int8pack op's last batch and the first past it (Int8Rows switches to
# dequantize-then-F.linear), and a prefill-sized 200.
BATCHES = (1, 3, 16, INT8_OP_MAX_ROWS, INT8_OP_MAX_ROWS + 1, 200, INT4_OP_MAX_ROWS)
# Odd N (the int4 layout pads rows to whole 64-row tiles: 33 -> one padded tile, 65 -> a
# full tile and a padded one), and K of a few blocks and of many.
SHAPES = [(33, 3), (65, 16)]  # (N, blocks per row)


def _k(name: str, blocks: int) -> int:
    # 16 blocks of 256 weights would be 4096: K-quants get 1 and 3 blocks instead.
    size = BY_NAME[name].block_size
    return size * (blocks if size == 32 else max(1, blocks // 5))


def _quantized(name: str, n: int, k: int, seed: int) -> tuple[QuantizedTensor, torch.Tensor]:
    fmt, blocks = random_quantized(name, n, k, seed=seed)
    return QuantizedTensor(fmt.type_id, (n, k), torch.from_numpy(blocks)), oracle_weights(
        fmt, blocks)


def _put_f16(blocks: np.ndarray, name: str, offset: int, values: np.ndarray) -> None:
    """Write fp16 `values` [n, blocks per row] into the field at `offset` of every block."""
    fmt = BY_NAME[name]
    view = blocks.reshape(blocks.shape[0], -1, fmt.block_bytes)
    half = values.astype(np.float16)
    assert np.array_equal(half.astype(np.float64), values)  # exact in fp16 too
    view[..., offset:offset + 2] = half.view(np.uint8).reshape(*half.shape, 2)


def _bf16_exact_quantized(name: str, n: int, k: int,
                          seed: int) -> tuple[QuantizedTensor, torch.Tensor]:
    """Random blocks whose every int4pack scale and zero is a bfloat16 value, so that the
    layout's weights are the oracle's exactly.

    int4pack stores per group of 32 a bf16 scale and zero (cpu.py's table). bf16 fp16
    fields alone are enough for Q4_0 (scale d, zero 0) and Q8_0 (16d and d, zeros 0 and 8d),
    not for the derived ones: Q4_1's zero m + 8d and Q4_K's d * sc and 8 d sc - dmin m
    need more than 8 significant bits in general. So:
      Q4_1: d = a 2**-10, m = b 2**-10 with |a| <= 15, |b| <= 127: m + 8d = (b + 8a) 2**-10,
            |b + 8a| <= 247 < 2**8.
      Q4_K: d = {1, 1.5} 2**-e (sign random), dmin = 8d: d sc = {2, 3} sc 2**-(e+1) with
            3 * 63 < 2**8, and the zero 8 d sc - dmin m = 8 d (sc - m), |sc - m| <= 63."""
    fmt, blocks = random_quantized(name, n, k, seed=seed)
    rng = np.random.default_rng(seed + 1000)
    groups = (n, k // fmt.block_size)
    if name in ("Q4_0", "Q8_0"):
        d = torch.randn(groups, generator=torch.Generator().manual_seed(seed))
        _put_f16(blocks, name, 0, d.bfloat16().double().numpy() * 2.0 ** -6)
    elif name == "Q4_1":
        _put_f16(blocks, name, 0, rng.integers(-15, 16, groups) * 2.0 ** -10)
        _put_f16(blocks, name, 2, rng.integers(-127, 128, groups) * 2.0 ** -10)
    else:
        assert name == "Q4_K"
        d = rng.choice([1.0, 1.5, -1.0, -1.5], groups) * 2.0 ** rng.integers(-12, -8, groups)
        _put_f16(blocks, name, 0, d)
        _put_f16(blocks, name, 2, 8 * d)
    return QuantizedTensor(fmt.type_id, (n, k), torch.from_numpy(blocks)), oracle_weights(
        fmt, blocks)


def _x(batch: int, k: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, k, generator=torch.Generator().manual_seed(seed))


def _rel(actual: torch.Tensor, reference: torch.Tensor) -> float:
    return ((actual.double() - reference).norm() / reference.norm()).item()


def _gamma(k: int) -> float:
    # Twice the textbook (K - 1) * 2**-24: blocked / vectorized sums reassociate.
    return 2 * k * 2.0 ** -24


# ------------------------------------------------------------------------------ RawBlocks
@pytest.mark.parametrize("n,blocks", SHAPES)
@pytest.mark.parametrize("name", TYPE_NAMES)
def test_raw_blocks_multiply_the_oracle_weights(name, n, blocks):
    # The file's blocks through gguf's own dequantizer, then a float32 F.linear: only the
    # float32 summation differs from the float64 reference.
    k = _k(name, blocks)
    tensor, weights = _quantized(name, n, k, seed=n + k)
    raw = RawBlocks(tensor)
    assert raw.shape == (n, k) and raw.nbytes == n * BY_NAME[name].row_bytes(k)
    assert torch.equal(raw.rows(None, torch.float32), weights)
    ids = torch.tensor([n - 1, 0, 5, 5])
    assert torch.equal(raw.rows(ids, torch.float32), weights[ids])
    assert torch.equal(raw.rows(ids, torch.bfloat16), weights[ids].bfloat16())
    for batch in BATCHES:
        x = _x(batch, k, seed=batch)
        ref = x.double() @ weights.double().T
        out = raw.matmul(x)
        assert out.shape == (batch, n) and out.dtype == torch.float32
        assert _rel(out, ref) < 1e-3
        slack = _gamma(k) * (x.double().abs() @ weights.double().abs().T)
        assert ((out.double() - ref).abs() <= slack).all(), (name, batch)


@pytest.mark.parametrize("name", TYPE_NAMES)
def test_for_product_picks_the_layout_by_type(name):
    tensor, _ = _quantized(name, 33, _k(name, 1), seed=0)
    expected = Int4Packed if name in INT4_NAMES else Int8Rows
    assert isinstance(for_product(tensor, CPU), expected)


# ---------------------------------------------------------------------------- Int4Packed
@pytest.mark.parametrize("n,blocks", SHAPES)
@pytest.mark.parametrize("name", INT4_NAMES)
def test_int4_with_bf16_scales_rounds_only_the_output(name, n, blocks):
    """Scales and zeros that are bf16 values and bf16 x: the layout's weights are the
    oracle's exactly, x goes into the op unchanged, the op sums in float32 and then rounds
    its output to bf16. So every element is the exact product rounded to bf16, up to the
    float32 summation:
        |out - ref| <= u |ref| + gamma(K) S   (u = 2**-8).
    1e-3 relative cannot hold against ref itself: the output rounding alone is up to
    2**-8 = 3.9e-3 per element and ~1.6e-3 in norm for random values (measured
    1.4e-3..2.7e-3). Against ref rounded to bf16 (what the op's dtype can hold) it does:
    there the only differences are elements whose float32 sum lands across a rounding
    boundary (measured: under 0.2 % of elements, one bf16 step each; 5e-5 in norm)."""
    k = _k(name, blocks)
    tensor, weights = _bf16_exact_quantized(name, n, k, seed=n + k)
    layout = for_product(tensor, CPU)
    assert isinstance(layout, Int4Packed) and layout.halves == (name == "Q8_0")
    assert torch.equal(layout.rows(None, torch.float32), weights)
    for batch in BATCHES:
        x = _x(batch, k, seed=batch).bfloat16().float()
        ref = x.double() @ weights.double().T
        out = layout.matmul(x)
        assert out.shape == (batch, n) and out.dtype == torch.float32
        err = (out.double() - ref).abs()
        slack = _gamma(k) * (x.double().abs() @ weights.double().abs().T)
        assert (err <= U_BF16 * ref.abs() + 2 * slack).all(), (name, batch)
        assert _rel(out, ref) <= U_BF16
        # Each element is the exact product rounded to bf16 (the op's output), or, should
        # a batch size take a float32 path instead, the exact product itself.
        rounded = ref.float().bfloat16().double()
        assert min(_rel(out, rounded), _rel(out, ref)) < 1e-3, (name, batch)
        either = (out.double() == rounded) | (err <= 2 * slack)
        assert either.double().mean() > 0.98, (name, batch)


@pytest.mark.parametrize("n,blocks", SHAPES)
@pytest.mark.parametrize("name", INT4_NAMES)
def test_int4_with_any_fp16_scales_and_float32_x(name, n, blocks):
    """Arbitrary finite fp16 scales, float32 x: three bf16 roundings stack, each within
    u = 2**-8 of what it rounds and ~2**-8/sqrt(3) of it in RMS: x into the op, the
    group scales and zeros (cpu.py: only these move, the 4-bit values are the file's),
    and the output. Independent, they add to ~sqrt(3) * 1.6e-3 = 2.8e-3 in norm (measured
    2.1e-3..3.2e-3 here); 6e-3 leaves room for a short row or a zero rounded against its
    scale (Q4_1/Q4_K zeros are m + 8d and 8 d sc - dmin m, rounded as a whole), while a
    wrong nibble or scale shows as 1e-1 or more."""
    k = _k(name, blocks)
    tensor, weights = _quantized(name, n, k, seed=n + k + 1)
    layout = for_product(tensor, CPU)
    for batch in BATCHES:
        x = _x(batch, k, seed=batch + 7)
        ref = x.double() @ weights.double().T
        out = layout.matmul(x)
        assert out.dtype == torch.float32
        assert _rel(out, ref) < 6e-3, (name, batch)
    # A bf16 x comes back bf16.
    assert layout.matmul(x.bfloat16()).dtype == torch.bfloat16


def test_int4_reads_strided_x():
    tensor, weights = _quantized("Q4_K", 65, 512, seed=3)
    wide = _x(5, 600, seed=1)
    x = wide[:, 50:562]
    assert not x.is_contiguous()
    ref = x.double() @ weights.double().T
    assert _rel(for_product(tensor, CPU).matmul(x), ref) < 6e-3


# Rows in different 64-row tiles, both halves of a tile (a byte holds row j in its low
# nibble and j + 32 in its high one), the tile edges, and the padded last tile of 130 rows.
ROW_IDS = [0, 31, 32, 63, 64, 95, 96, 127, 128, 129, 7, 129, 0]


@pytest.mark.parametrize("name", INT4_NAMES)
def test_int4_rows_read_the_packed_layout(name):
    tensor, weights = _bf16_exact_quantized(name, 130, _k(name, 3), seed=11)
    layout = for_product(tensor, CPU)
    assert layout.packed.shape[0] == 192  # three tiles, the last padded
    ids = torch.tensor(ROW_IDS)
    # Exact weights: the lookup is the oracle's rows bit for bit, in float32 and int32 ids.
    assert torch.equal(layout.rows(ids, torch.float32), weights[ids])
    assert torch.equal(layout.rows(ids.int(), torch.float32), weights[ids])
    assert torch.equal(layout.rows(None, torch.float32), weights)
    assert torch.equal(layout.rows(ids, torch.bfloat16), weights[ids].bfloat16())
    assert layout.rows(torch.tensor([], dtype=torch.int64), torch.float32).shape == (
        0, weights.shape[1])


@pytest.mark.parametrize("name", INT4_NAMES)
def test_int4_rows_with_any_fp16_scales(name):
    """The lookup computes (q - 8) * scale + zero from the bf16 scales and zeros: each
    weight moves by u |scale (q - 8)| + u |zero| at most (Q8_0: two halves, each so).
    |zero| is bounded by the group's range of weights, so in norm the rows stay within
    2u = 7.8e-3 (measured ~2e-3); per element, Q4_0 and Q8_0 (zero 0 or a multiple of the
    rounded scale) are within u of each weight."""
    tensor, weights = _quantized(name, 130, _k(name, 3), seed=12)
    layout = for_product(tensor, CPU)
    ids = torch.tensor(ROW_IDS)
    rows = layout.rows(ids, torch.float32)
    assert torch.equal(rows, layout.rows(None, torch.float32)[ids])
    assert _rel(rows, weights[ids].double()) < 2 * U_BF16
    if name in ("Q4_0", "Q8_0"):
        err = (rows.double() - weights[ids].double()).abs()
        assert (err <= U_BF16 * weights[ids].double().abs() + 1e-12).all()


def test_unpack_packed_rows_inverts_the_op_packing():
    gen = torch.Generator().manual_seed(5)
    for n, k in ((64, 64), (192, 96), (256, 512)):
        q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        assert torch.equal(unpack_packed_rows(packed, torch.arange(n)), q.to(torch.uint8))
        ids = torch.randperm(n, generator=gen)[:37]
        assert torch.equal(unpack_packed_rows(packed, ids), q[ids].to(torch.uint8))
    assert tile_rows() in (16, 32, 64)


@pytest.mark.parametrize("name,limit", [("Q4_1", 1.0), ("Q4_0", 1.12), ("Q4_K", 1.12)])
def test_int4_bytes_against_the_file(name, limit):
    # 4 bits a weight + a bf16 scale and zero per 32: 5 bits, Q4_1's own size; Q4_0 is
    # 4.5 and Q4_K 4.5 bits, so 5 / 4.5 = 1.11x. N = 128: whole tiles, no padding rows.
    tensor, _ = _quantized(name, 128, 512, seed=0)
    layout = for_product(tensor, CPU)
    assert layout.nbytes <= limit * tensor.nbytes
    if name == "Q4_1":
        assert layout.nbytes == tensor.nbytes == 128 * 512 * 5 // 8


# ------------------------------------------------------------------------------ Int8Rows
def _int8_step_bound(weights: torch.Tensor) -> torch.Tensor:
    """The most a weight of each row moves on requantization, float64 [n, 1].

    scale = bf16(rowmax / 127), within u of rowmax / 127. A weight that rounds to q moves
    by at most scale / 2 <= (1 + u) rowmax / 254; one clamped at 127 (when the scale
    rounded down) by rowmax - 127 scale <= u rowmax = rowmax / 256. Both <= (1 + u)
    rowmax / 254."""
    return (1 + U_BF16) * weights.double().abs().amax(dim=1, keepdim=True) / 254


@pytest.mark.parametrize("n,blocks", SHAPES)
@pytest.mark.parametrize("name", INT8_NAMES)
def test_int8_rows_within_half_a_step_of_each_row(name, n, blocks):
    """Per element: with e_j the row's step bound above and S = |x| @ (|W| + e).T,
      batch > INT8_OP_MAX_ROWS (float32 F.linear over the int8 rows times their scale,
      exact in float32):   |out - ref| <= e_j |x|_1 + gamma(K) S
      batch <= that (int8pack: x rounded to bf16, output rounded to bf16):
                           |out - ref| <= e_j |x|_1 + u S + gamma(K) S + u (|ref| + that).
    In norm, the requantization errors are ~uniform in +-scale/2, independent, so
    |out - ref| ~ sqrt(sum_j scale_j**2 / 12 |x|_2**2) (+ u / sqrt(3) |ref| per bf16
    rounding): asserted within twice that estimate."""
    k = _k(name, blocks)
    tensor, weights = _quantized(name, n, k, seed=n + k + 2)
    layout = for_product(tensor, CPU)
    assert isinstance(layout, Int8Rows) and layout.shape == (n, k)
    assert layout.q.dtype == torch.int8 and layout.scale.dtype == torch.bfloat16
    step = _int8_step_bound(weights)  # [n, 1]
    moved = (layout.rows(None, torch.float32).double() - weights.double()).abs()
    assert (moved <= step).all()
    scale = weights.double().abs().amax(dim=1) / 127
    for batch in BATCHES:
        x = _x(batch, k, seed=batch + 3)
        ref = x.double() @ weights.double().T
        out = layout.matmul(x)
        assert out.shape == (batch, n) and out.dtype == torch.float32
        xa = x.double().abs()
        mags = xa @ (weights.double().abs() + step).T
        bound = xa.sum(dim=1, keepdim=True) * step.T + _gamma(k) * mags
        roundings = 0
        if batch <= INT8_OP_MAX_ROWS:
            roundings = 2
            bound = bound + U_BF16 * mags
            bound = bound + U_BF16 * (ref.abs() + bound)
        err = (out.double() - ref).abs()
        assert (err <= bound).all(), (name, batch, (err / bound).max().item())
        requant = (scale.square().sum() / 12 * x.double().square().sum(dim=1)).sum().sqrt()
        estimate = math.sqrt(requant.item() ** 2
                             + roundings * (U_BF16 / math.sqrt(3) * ref.norm().item()) ** 2)
        assert (out.double() - ref).norm().item() <= 2 * estimate, (name, batch)


@pytest.mark.parametrize("name", INT8_NAMES)
def test_int8_rows_lookup(name):
    tensor, weights = _quantized(name, 70, _k(name, 3), seed=13)
    layout = for_product(tensor, CPU)
    ids = torch.tensor([69, 0, 33, 33, 5])
    every = layout.rows(None, torch.float32)
    rows = layout.rows(ids, torch.float32)
    assert torch.equal(rows, every[ids])
    assert ((rows.double() - weights[ids].double()).abs() <= _int8_step_bound(weights)[ids]).all()
    # bf16 rows: the int8 value times the bf16 scale, rounded once more.
    bf = layout.rows(ids, torch.bfloat16)
    assert bf.dtype == torch.bfloat16
    assert ((bf.double() - rows.double()).abs() <= U_BF16 * rows.double().abs()).all()


def test_int8_rows_of_zeros_stay_zero():
    # A row of zero blocks has scale 0: no division by zero, no NaN, a zero output.
    fmt, blocks = random_quantized("Q6_K", 20, 256, seed=4)
    blocks[3] = 0
    weights = oracle_weights(fmt, blocks)
    assert not weights[3].any()
    layout = for_product(QuantizedTensor(fmt.type_id, (20, 256), torch.from_numpy(blocks)), CPU)
    for batch in (1, 40):
        out = layout.matmul(_x(batch, 256, seed=0))
        assert torch.isfinite(out).all() and not out[:, 3].any()
    assert not layout.rows(torch.tensor([3]), torch.float32).any()
