"""The fused MoE kernels (kernels/triton/fused_moe.py, interpreted on CPU) against a
per-route loop over gguf's dequantized experts, for every block type they take (MXFP4
included): the GEMV path at decode sizes, the grouped GEMM at prefill sizes (odd token
counts), biases, gate and up of two block types, experts no token picked."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.quant.formats import BY_NAME
from kernels.triton.fused_moe import ExpertMatrix, ExpertPart, block_m_for, fused_moe
from kernels.triton.quant_matmul import GEMV_MAX_M
from tests.kernels.quant_cases import TRITON_TYPE_NAMES, oracle_weights, random_quantized

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
EXPERTS = 6
# float32: the kernels differ from the loop only in summation order (~1e-7 of the
# outputs' norm); a wrong expert, route, weight or mask shows as 1e-2 or more.
RTOL = 1e-5


def stacked(name: str, n: int, k: int, seed: int, start: int = 0):
    """(ExpertPart over EXPERTS random matrices [n, k] of type `name`, float32 [E, n, k])."""
    blocks, weights = [], []
    for e in range(EXPERTS):
        fmt, data = random_quantized(name, n, k, seed=seed + e)
        blocks.append(torch.from_numpy(data))
        weights.append(oracle_weights(fmt, data))
    part = ExpertPart(BY_NAME[name].type_id, torch.stack(blocks).to(DEVICE), start)
    return part, torch.stack(weights)


def silu_mul(h: torch.Tensor) -> torch.Tensor:
    half = h.shape[-1] // 2
    return F.silu(h[..., :half]) * h[..., half:]


def reference(x, ids, weights, w1, b1, w2, b2):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = silu_mul(x[t] @ w1[e].T + b1[e]) @ w2[e].T + b2[e]
            out[t] += weights[t, j] * h
    return out


def case(gate: str, up: str | None = None, tokens: int = 5, top_k: int = 2,
         bias: bool = False, seed: int = 0):
    block = max(BY_NAME[gate].block_size, BY_NAME[up or gate].block_size)
    # One 256-weight super-block a row keeps the interpreted K-quant cases quick.
    hidden, inter = (2 * block if block == 32 else block), block
    if up is None:
        part, w1 = stacked(gate, 2 * inter, hidden, seed)
        parts = (part,)
    else:
        g, wg = stacked(gate, inter, hidden, seed)
        u, wu = stacked(up, inter, hidden, seed + 50, start=inter)
        parts, w1 = (g, u), torch.cat([wg, wu], dim=1)
    down_part, w2 = stacked(gate, hidden, inter, seed + 100)
    gen = torch.Generator().manual_seed(seed)
    b1 = torch.randn(EXPERTS, 2 * inter, generator=gen) if bias else torch.zeros(1, 2 * inter)
    b2 = torch.randn(EXPERTS, hidden, generator=gen) if bias else torch.zeros(1, hidden)
    gate_up = ExpertMatrix(parts, hidden, b1.to(DEVICE) if bias else None)
    down = ExpertMatrix((down_part,), inter, b2.to(DEVICE) if bias else None)
    x = torch.randn(tokens, hidden, generator=gen)
    # Expert EXPERTS - 1 never wins: a tile-less expert beside the routed ones.
    scores = torch.rand(tokens, EXPERTS - 1, generator=gen)
    weights, ids = torch.topk(torch.softmax(scores, -1), top_k, dim=-1)
    expected = reference(x, ids, weights, w1, b1.expand(EXPERTS, -1),
                         w2, b2.expand(EXPERTS, -1))
    got = fused_moe(x.to(DEVICE), ids.to(DEVICE), weights.to(DEVICE), gate_up, down,
                    silu_mul)
    return got.cpu(), expected


def assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape and got.dtype == torch.float32
    assert ((got - expected).norm() / expected.norm()).item() < RTOL


# Every type on the GEMV (2 tokens) and the GEMM (13); the interpreted K-quants, whose
# rows hold 256 weights, on the GEMV with one expert a token, and Q4_K (the common expert
# type) on the GEMM too. quant_matmul's tests take every type through both tile shapes.
TYPE_CASES = [(name, tokens, 2) for name in TRITON_TYPE_NAMES
              if BY_NAME[name].block_size == 32 for tokens in (2, 13)] + [
    (name, 2, 1) for name in TRITON_TYPE_NAMES if BY_NAME[name].block_size == 256] + [
    ("Q4_K", 13, 2)]


@pytest.mark.parametrize("name,tokens,top_k", TYPE_CASES,
                         ids=[f"{n}-t{t}-k{k}" for n, t, k in TYPE_CASES])
def test_every_block_type_decode_and_prefill(name, tokens, top_k):
    assert_close(*case(name, tokens=tokens, top_k=top_k, seed=tokens))


@pytest.mark.parametrize("tokens", [1, 2, 5, GEMV_MAX_M])
@pytest.mark.parametrize("name", ["Q4_0", "MXFP4"])
def test_decode_batches(name, tokens):
    assert block_m_for(tokens, 4, EXPERTS) <= GEMV_MAX_M  # the GEMV path
    assert_close(*case(name, tokens=tokens, top_k=4, seed=tokens))


@pytest.mark.parametrize("tokens,top_k", [(9, 1), (33, 2), (40, 5)])
def test_prefill_sizes(tokens, top_k):
    assert block_m_for(tokens, top_k, EXPERTS) >= 16  # the grouped GEMM
    assert_close(*case("Q8_0", tokens=tokens, top_k=top_k, seed=tokens))


@pytest.mark.parametrize("tokens", [2, 17])
def test_biases_and_gate_up_of_two_types(tokens):
    assert_close(*case("Q5_0", "Q4_1", tokens=tokens, bias=True, seed=tokens))


def test_a_bad_stack_is_refused_when_built():
    part, _ = stacked("Q4_0", 64, 64, 0)
    with pytest.raises(ValueError, match="qweight"):
        ExpertMatrix((part,), 96)  # rows of 64 weights called 96
    with pytest.raises(ValueError, match="parts must be uint8"):
        ExpertMatrix((ExpertPart(part.type_id, part.data[0], 0),), 64)
    with pytest.raises(ValueError, match="part starts"):
        ExpertMatrix((part, ExpertPart(part.type_id, part.data, 32)), 64)
    with pytest.raises(ValueError, match="bias must be float32"):
        ExpertMatrix((part,), 64, torch.zeros(EXPERTS, 63, device=DEVICE))
    with pytest.raises(ValueError, match="at least one"):
        ExpertMatrix((), 64)


def test_no_tokens():
    part, _ = stacked("Q4_0", 64, 64, 0)
    down, _ = stacked("Q4_0", 64, 32, 1)
    out = fused_moe(torch.empty(0, 64, device=DEVICE),
                    torch.empty(0, 2, dtype=torch.int64, device=DEVICE),
                    torch.empty(0, 2, device=DEVICE), ExpertMatrix((part,), 64),
                    ExpertMatrix((down,), 32), silu_mul)
    assert out.shape == (0, 64)


def down_of(rows: int) -> ExpertMatrix:
    return ExpertMatrix((stacked("Q4_0", rows, 32, 2)[0],), 32)


def test_bad_shapes_are_named():
    part, _ = stacked("Q4_0", 64, 64, 0)
    down, _ = stacked("Q4_0", 64, 32, 1)
    gate_up, down = ExpertMatrix((part,), 64), ExpertMatrix((down,), 32)
    ids = torch.zeros(2, 1, dtype=torch.int64, device=DEVICE)
    weights = torch.ones(2, 1, device=DEVICE)
    with pytest.raises(ValueError, match="x must"):
        fused_moe(torch.zeros(2, 64, dtype=torch.float64, device=DEVICE), ids, weights,
                  gate_up, down, silu_mul)
    with pytest.raises(ValueError, match="gate_up takes rows of 64"):
        fused_moe(torch.zeros(2, 32, device=DEVICE), ids, weights, gate_up, down, silu_mul)
    with pytest.raises(ValueError, match="down must"):
        fused_moe(torch.zeros(2, 64, device=DEVICE), ids, weights, gate_up, gate_up,
                  silu_mul)
    with pytest.raises(ValueError, match="down must"):
        fused_moe(torch.zeros(2, 64, device=DEVICE), ids, weights, gate_up, down_of(16),
                  silu_mul)
