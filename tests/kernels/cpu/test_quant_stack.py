"""quantize_activations_residual and quant_matmul_stack (kernels/cpu/quant.py): a layer's
stacked matrices in one call, and activations as (x, residual) 8-bit row pairs.

The pair's error bound. Row 2i holds x's 8-bit blocks (step dx_b), row 2i + 1 those of
r = x - dx_b q (float32, exact up to its rounding), with step dr_b <= dx_b / 254 (|r| <=
dx_b / 2 in each block, so its own block maximum over 127 is at most dx_b / 254). The
sum of the two products is x @ W.T up to r's rounding, dr_b / 2 per element, and the
float32 arithmetic:
    |Y_j - (x @ W.T)_j| <= sum_b (dr_b / 2 + 2^-24 |x|max_b) sum_{i in b} |W_ji| + F_j
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
    rounding = dx / 254 / 2 + 2.0 ** -24 * blocks.abs().amax(-1)  # [m, k/32]
    w_abs = w.double().abs().view(w.shape[0], k // 32, 32).sum(-1)  # [n, k/32]
    terms = (x.double().abs() @ w.double().abs().T)
    return rounding @ w_abs.T + 4 * (k / 32 + 16) * 2.0 ** -23 * terms + 1e-6


def test_residual_rows_interleave_x_and_what_it_misses():
    x = _x(3, seed=1)
    pairs = quant.quantize_activations_residual(x)
    assert pairs.shape == (6, quant.act_row_bytes(K)) and pairs.dtype == torch.uint8
    # Even rows are the plain 8-bit rows, bit for bit.
    assert torch.equal(pairs[0::2], quant.quantize_activations(x))
    # Odd rows are the 8-bit rows of the residual of each even row.
    q = pairs[0::2, :K].view(torch.int8).float()
    d = pairs[0::2, K:K + K // 8].contiguous().view(torch.float32)
    residual = x - q * d.repeat_interleave(32, dim=1)
    assert torch.equal(pairs[1::2], quant.quantize_activations(residual))


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
        each = [quant.quant_matmul(act, w, t, K, r) for (w, t, _), r in zip(mats, rows,
                                                                             strict=True)]
        if pairs:
            each = [y[0::2] + y[1::2] for y in each]
        assert out.shape == (m, 48 + 16 + 33)
        assert torch.equal(out, torch.cat(each, dim=1))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_1", "Q8_0", "Q3_K", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("m", [1, 64])
def test_pairs_carry_about_15_bits(name, m):
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
