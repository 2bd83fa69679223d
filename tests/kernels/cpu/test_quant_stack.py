"""quantize_activations_residual and quant_matmul_stack (kernels/cpu/quant.py): a layer's
stacked matrices in one call, and activations as (x, residual) 8-bit row pairs.

The pair's error bound. Row 2i holds x's 8-bit blocks (step dx_b), row 2i + 1 those of
r = x - dx_b q (float32, exact up to its rounding) at the fixed step dr_b = dx_b / 256:
|r| <= dx_b / 2 is at most 128 steps, so r is rounded to half a step except where it
passes 127.5 steps and is clipped to 127, within one step. The sum of the two products
is x @ W.T up to that rounding, at most dr_b per element, and the float32 arithmetic:
    |Y_j - (x @ W.T)_j| <= sum_b (dr_b + 2^-24 |x|max_b) sum_{i in b} |W_ji| + F_j
with F_j the float32 accumulation over both products (as in test_quant_matmul.py, twice).
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import quant
from kernels.quant.formats import BY_NAME
from tests.kernels.quant_cases import oracle_weights, random_quantized

K = 512


def _matrix(name: str, n: int, seed: int, k: int = K):
    fmt, blocks = random_quantized(name, n, k, seed=seed)
    return torch.from_numpy(blocks), fmt.type_id, oracle_weights(fmt, blocks)


def _x(m: int, k: int = K, seed: int = 0) -> torch.Tensor:
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
    x[:, 5] *= 40  # an outlier channel, as real activations have: 8 bits alone lose to it
    return x


def _pair_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[m, n] float64: the bound of the module docstring."""
    m, k = x.shape
    blocks = x.double().view(m, k // 32, 32)
    dx = blocks.abs().amax(-1) / 127
    rounding = dx / 256 + 2.0 ** -24 * blocks.abs().amax(-1)  # [m, k/32]
    w_abs = w.double().abs().view(w.shape[0], k // 32, 32).sum(-1)  # [n, k/32]
    terms = (x.double().abs() @ w.double().abs().T)
    return rounding @ w_abs.T + 4 * (k / 32 + 16) * 2.0 ** -23 * terms + 1e-6


def _residual_model(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor):
    """The residual rows' (q int8, d float32, sums int16) by act_residual.cpp's float32
    operations: r = x - d q, nearbyint(r * (256 / d)) clipped to +-127, step d / 256."""
    m, k = x.shape
    step = d.repeat_interleave(32, dim=1)
    r = x - step * q
    inv = torch.where(step != 0, 256 / step, torch.zeros_like(step))
    lo = torch.round(r * inv).clamp(-127, 127)
    sums = lo.view(m, k // 16, 16).sum(-1)
    return lo.to(torch.int8), d * (1 / 256), sums.to(torch.int16)


@pytest.mark.parametrize("k", [512, 576])  # whole groups, and a padded last group
def test_residual_rows_interleave_x_and_what_it_misses(isa_path, k):
    x = _x(3, k=k, seed=1)
    x[1, 64:96] = 0  # an all-zero block: step 0, residual 0
    pairs = quant.quantize_activations_residual(x)
    assert pairs.shape == (6, quant.act_row_bytes(k)) and pairs.dtype == torch.uint8
    # Even rows are the plain 8-bit rows, bit for bit.
    assert torch.equal(pairs[0::2], quant.quantize_activations(x))
    # Odd rows are the residual of each even row at 1/256 of its blocks' steps (zeros in
    # the padding up to kp).
    kp = -(-k // 256) * 256
    q = pairs[0::2, :k].view(torch.int8).float()
    d = pairs[0::2, kp:kp + k // 8].contiguous().view(torch.float32)
    lo, d_lo, sums = _residual_model(x, q, d)
    low = pairs[1::2]
    assert torch.equal(low[:, :k].view(torch.int8), lo)
    assert torch.equal(low[:, kp:kp + k // 8].contiguous().view(torch.float32), d_lo)
    sum_at = kp + kp // 8
    assert torch.equal(low[:, sum_at:sum_at + k // 8].contiguous().view(torch.int16), sums)
    assert (low[:, k:kp] == 0).all() and (low[:, kp + k // 8:sum_at] == 0).all()
    # The residual uses its range: most blocks reach past 100 steps.
    assert (lo.view(3, -1, 32).abs().amax(-1) > 100).float().mean() > 0.9


def test_a_nan_block_keeps_its_nan_in_both_rows(isa_path):
    x = _x(1, seed=2)
    x[0, 40] = float("nan")
    pairs = quant.quantize_activations_residual(x)
    d = pairs[:, K:K + K // 8].contiguous().view(torch.float32)
    assert d[:, 1].isnan().all() and not d[:, [0, 2]].isnan().any()
    assert (pairs[1, 32:64] == 0).all()  # the NaN block's residual q


@pytest.mark.parametrize("m", [1, 2, 5, 9, 40, 300])  # decode rows and the tiles
def test_a_stack_equals_each_matrix_alone_in_its_columns(isa_path, m):
    mats = [_matrix("Q4_K", 48, 1), _matrix("Q6_K", 16, 2), _matrix("Q8_0", 33, 3)]
    order = torch.randperm(48, generator=torch.Generator().manual_seed(4))
    rows = [order, None, None]
    x = _x(m, seed=m)
    for act, pairs in ((quant.quantize_activations(x), False),
                       (quant.quantize_activations_residual(x), True)):
        out = quant.quant_matmul_stack(act, [w for w, _, _ in mats], [t for _, t, _ in mats],
                                       K, rows, pairs)
        each = [quant.quant_matmul_stack(act, [w], [t], K, [r], pairs)
                for (w, t, _), r in zip(mats, rows, strict=True)]
        assert out.shape == (m, 48 + 16 + 33)
        assert torch.equal(out, torch.cat(each, dim=1))
        # The permuted matrix, read in file order, puts each row's product in its column.
        w0, t0, _ = mats[0]
        in_order = quant.quant_matmul_stack(act, [w0], [t0], K, [None], pairs)
        assert torch.equal(out[:, :48], in_order[:, order])


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q2_K", "Q4_K", "Q5_K", "Q6_K",
                                  "Q8_0"])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_fused_pairs_equal_their_two_rows_summed(isa_path, name, m):
    """The decode kernels combine a pair's integer dots (gemv_pairs); the same pairs as
    2m separate rows (quant_matmul) and summed give the same value up to float32
    rounding: each side's float work over both products, F_j twice."""
    w, type_id, weights = _matrix(name, 40, 6, k=1024)
    x = _x(m, k=1024, seed=8)
    act = quant.quantize_activations_residual(x)
    fused = quant.quant_matmul_stack(act, [w], [type_id], 1024, [None], True)
    rows = quant.quant_matmul(act, w, type_id, 1024)
    summed = rows[0::2] + rows[1::2]
    terms = x.double().abs() @ weights.double().abs().T
    bound = 8 * (1024 / 32 + 16) * 2.0 ** -23 * terms + 1e-6
    assert ((fused.double() - summed.double()).abs() <= bound).all()


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_1", "Q8_0", "Q3_K", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("m", [1, 64])
def test_pairs_carry_about_15_bits(isa_path, name, m):
    w, type_id, weights = _matrix(name, 24, 5)
    x = _x(m, seed=7)
    pairs = quant.quant_matmul_stack(quant.quantize_activations_residual(x), [w], [type_id],
                                     K, [None], True)
    single = quant.quant_matmul(x, w, type_id, K)
    ref = x.double() @ weights.double().T
    err = (pairs.double() - ref).abs()
    assert (err <= _pair_bound(x, weights)).all(), (err / _pair_bound(x, weights)).max()
    # And it is the point of the pairs: far closer than 8 bits alone.
    assert err.norm() < (single.double() - ref).abs().norm() / 20


def test_bad_stacks_name_the_argument():
    w, type_id, _ = _matrix("Q4_K", 8, 1)
    act = quant.quantize_activations(_x(3))
    with pytest.raises(RuntimeError, match="ws, type_ids and rows must have one entry"):
        quant.quant_matmul_stack(act, [w, w], [type_id], K, [None, None], False)
    with pytest.raises(RuntimeError, match="ws must hold at least one matrix"):
        quant.quant_matmul_stack(act, [], [], K, [], False)
    with pytest.raises(RuntimeError, match=r"x must hold whole \(x, residual\) pairs"):
        quant.quant_matmul_stack(act, [w], [type_id], K, [None], True)
    with pytest.raises(RuntimeError, match="type_id"):
        quant.quant_matmul_stack(act, [w], [BY_NAME["Q4_0"].type_id + 100], K, [None], False)


def test_the_decode_prefetch_distance_changes_no_result():
    """set_gemv_prefetch (isa.cpp) moves only the kernels' prefetches, never a value; the
    distance is whole cache lines up to 64 KiB."""
    ops = torch.ops.folio_cpu
    mats = [_matrix("Q4_K", 64, 1, k=1024), _matrix("Q6_K", 32, 2, k=1024)]
    act = quant.quantize_activations_residual(_x(2, k=1024, seed=3))
    previous = ops.gemv_prefetch()
    assert previous in (2048, 8192)  # per CPU vendor
    try:
        outs = []
        for distance in (0, 64, 2048, 65536):
            ops.set_gemv_prefetch(distance)
            outs.append(quant.quant_matmul_stack(act, [w for w, _, _ in mats],
                                                 [t for _, t, _ in mats], 1024,
                                                 [None, None], True))
        assert all(torch.equal(outs[0], o) for o in outs[1:])
        for bad in (-64, 100, 65600):
            with pytest.raises(RuntimeError, match="bytes must be a multiple of 64"):
                ops.set_gemv_prefetch(bad)
    finally:
        ops.set_gemv_prefetch(previous)
    assert ops.gemv_prefetch() == previous
