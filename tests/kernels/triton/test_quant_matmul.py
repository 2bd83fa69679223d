"""quant_matmul (Triton GEMV and GEMM over GGUF-quantized weights, interpreted on CPU)
against gguf's reference dequantizer followed by a float32 matmul, for every block type."""

from __future__ import annotations

import pytest
import torch

from kernels import bench
from kernels.quant.formats import BY_NAME
from kernels.triton.quant_matmul import GEMV_MAX_M, choose_num_splits, quant_matmul
from tests.kernels.quant_cases import TRITON_TYPE_NAMES, oracle_weights, random_quantized

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# float32 x: the kernels differ from the oracle only in summation order (~1e-7); a wrong
# nibble, scale or mask shows as 1e-2 or more.
FP32_RTOL = 1e-3
# bfloat16 x: the dequantized tile (GEMM) and the output are rounded to 8-bit mantissas,
# each up to 2**-8 relative (the interpreter truncates), ~4e-3 in the worst case.
BF16_RTOL = 1e-2

# (M, N, blocks per row, forced K splits): every type runs all of them. M covers one
# decode token, a small batch, the GEMV's largest M and the GEMM (16, 200); K one block,
# 2-3 blocks and 1024 / 512 weights (the latter split three ways or by the default).
CASES = [
    (1, 7, 1, None),
    (3, 33, 3, None),
    (GEMV_MAX_M, 7, 2, 2),
    (16, 7, 2, None),
    (200, 33, 1, None),
    (1, 33, "big", 3),
    (5, 7, "big", None),
]


def _case(name: str, m: int, n: int, blocks, seed: int = 0, dtype=torch.float32):
    block = BY_NAME[name].block_size
    k = (1024 if block == 32 else 512) if blocks == "big" else blocks * block
    fmt, qweight = random_quantized(name, n, k, seed=seed)
    x = torch.randn((m, k), generator=torch.Generator().manual_seed(seed)).to(dtype)
    return fmt, torch.from_numpy(qweight).to(DEVICE), x.to(DEVICE), oracle_weights(fmt, qweight)


def _rel_err(actual: torch.Tensor, reference: torch.Tensor) -> float:
    return ((actual.float().cpu() - reference).norm() / reference.norm()).item()


@pytest.mark.parametrize("m,n,blocks,splits", CASES, ids=[f"m{c[0]}-n{c[1]}-b{c[2]}-s{c[3]}"
                                                          for c in CASES])
@pytest.mark.parametrize("name", TRITON_TYPE_NAMES)
def test_matches_oracle(name, m, n, blocks, splits):
    fmt, qweight, x, weights = _case(name, m, n, blocks, seed=m + n)
    k = weights.shape[1]
    out = quant_matmul(x, qweight, fmt.type_id, n, k, num_splits=splits)
    assert out.shape == (m, n) and out.dtype == torch.float32
    assert _rel_err(out.T, weights @ x.cpu().T) < FP32_RTOL


@pytest.mark.parametrize("m", [3, 20])
def test_bfloat16_x(m):
    if m > GEMV_MAX_M and DEVICE.type == "cpu":
        pytest.skip("the interpreter's numpy has no bfloat16 matmul")
    fmt, qweight, x, weights = _case("Q4_K", m, 33, 2, seed=5, dtype=torch.bfloat16)
    out = quant_matmul(x, qweight, fmt.type_id, 33, 512)
    assert out.dtype == torch.bfloat16
    assert _rel_err(out, x.float().cpu() @ weights.T) < BF16_RTOL


def test_float16_x_through_the_dot():
    # The GEMM feeds tl.dot the tile cast to float16 (tensor-core inputs): 11-bit
    # mantissas, ~2**-11 relative per rounding.
    fmt, qweight, x, weights = _case("Q6_K", 20, 7, 2, seed=6, dtype=torch.float16)
    out = quant_matmul(x, qweight, fmt.type_id, 7, 512)
    assert out.dtype == torch.float16
    assert _rel_err(out, x.float().cpu() @ weights.T) < 2e-3


@pytest.mark.parametrize("m", [2, 40])
def test_strided_x_rows(m):
    # x as a column slice of a wider activation: rows stride past K.
    fmt, qweight, x, weights = _case("Q8_0", m, 7, 2, seed=7)
    wide = torch.cat([x, torch.full_like(x, float("nan"))], dim=1)
    out = quant_matmul(wide[:, :64], qweight, fmt.type_id, 7, 64)
    assert _rel_err(out, x.cpu() @ weights.T) < FP32_RTOL


def test_split_k_sums_to_the_single_split():
    fmt, qweight, x, _ = _case("Q5_K", 2, 7, "big", seed=8)
    one = quant_matmul(x, qweight, fmt.type_id, 7, 512, num_splits=1)
    # 5 splits asked of 4 K tiles: no split may be left empty or counted twice.
    many = quant_matmul(x, qweight, fmt.type_id, 7, 512, num_splits=5)
    torch.testing.assert_close(many, one, rtol=1e-5, atol=1e-5)


def test_split_policy():
    assert choose_num_splits(7, 14336, 64, 128, torch.device("cpu")) == 1
    if DEVICE.type == "cuda":  # few row tiles on many SMs: split, never below 512 weights
        assert 1 < choose_num_splits(1024, 4096, 64, 128, DEVICE) <= 4096 // 512


def test_empty_batch():
    fmt, qweight, _, _ = _case("Q4_0", 1, 7, 1)
    out = quant_matmul(torch.empty((0, 32), device=DEVICE), qweight, fmt.type_id, 7, 32)
    assert out.shape == (0, 7)


def test_bad_inputs_name_the_argument():
    fmt, qweight, x, _ = _case("Q4_1", 3, 7, 2)
    tid = fmt.type_id
    with pytest.raises(ValueError, match="type_id"):
        quant_matmul(x, qweight, 1, 7, 64)  # F16 is not a block type
    with pytest.raises(ValueError, match="k "):
        quant_matmul(x, qweight, tid, 7, 48)
    with pytest.raises(ValueError, match="qweight"):
        quant_matmul(x, qweight, tid, 8, 64)  # N rows disagree
    with pytest.raises(ValueError, match="qweight"):
        quant_matmul(x, qweight[:, :-2], tid, 7, 64)  # row bytes disagree
    with pytest.raises(ValueError, match="qweight"):
        quant_matmul(x, qweight.view(torch.int8), tid, 7, 64)
    with pytest.raises(ValueError, match="x "):
        quant_matmul(x[0], qweight, tid, 7, 64)
    with pytest.raises(ValueError, match="x "):
        quant_matmul(x[:, :32], qweight, tid, 7, 64)
    with pytest.raises(ValueError, match="x "):
        quant_matmul(x.to(torch.float64), qweight, tid, 7, 64)
    with pytest.raises(ValueError, match="num_splits"):
        quant_matmul(x, qweight, tid, 7, 64, num_splits=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU message path")
def test_bench_says_it_needs_cuda(capsys):
    assert bench.bench_quant_matmul(("Q4_K", "Q6_K")) == 2
    assert bench.main(["--quant", "Q4_K"]) == 2
    assert capsys.readouterr().err.count("needs a CUDA GPU") == 2
    with pytest.raises(ValueError, match="Q9_K"):
        bench.bench_quant_matmul(("Q9_K",))
    with pytest.raises(SystemExit):
        bench.parse_args(["--quant", "Q4_K,Q9_K"])
    assert bench.parse_args(["--shapes", "", "--quant", ""]).quant_types == ()
