"""quant_matmul_grouped (kernels/cpu/quant.py): a mixture of experts' routes in one call.

Two oracles. Exact: each expert's routes come out bit-equal to quant_matmul_stack over
that expert's rows alone (the same kernels, chosen by the same row count), so grouping
changes nothing. Float: every route within the pairs' rounding of gguf's dequantized
matrix times its row. Route layouts cover an empty expert, one and a few routes (the
GEMV), more than the GEMV takes (the tiles), and one expert taking every route.
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import quant
from tests.kernels.quant_cases import oracle_weights, random_quantized

K = 512
EXPERTS = 4
SIZES = (32, 16)  # each expert a stack of two matrices, as gate/up
TYPES = ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "MXFP4"]
# Expert ids per route: expert 0 empty, 1 one route, 2 five (ten pair rows, AVX-512's
# GEMV limit), 3 eleven (past every ISA's GEMV: the tiles); and every route on one expert.
LAYOUTS = {"mixed": [1] + [2] * 5 + [3] * 11, "one expert": [2] * 24}


def _experts(name: str, seed: int = 0):
    """[(blocks, type_id, float W)] per matrix, expert-major: EXPERTS * len(SIZES)."""
    mats = []
    for e in range(EXPERTS):
        for j, n in enumerate(SIZES):
            fmt, blocks = random_quantized(name, n, K, seed=seed + 10 * e + j)
            mats.append((torch.from_numpy(blocks), fmt.type_id, oracle_weights(fmt, blocks)))
    return mats


def _x(m: int, seed: int = 0) -> torch.Tensor:
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(seed))
    x[:, 5] *= 40  # an outlier channel, as real activations have
    return x


def _routes(layout: str, seed: int = 0) -> torch.Tensor:
    ids = torch.tensor(LAYOUTS[layout], dtype=torch.int64)
    return ids[torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))]


def _grouped(x, mats, experts, weights=None, pairs=True, rows=None):
    rows = rows or [None] * len(mats)
    return quant.quant_matmul_grouped(x, [w for w, _, _ in mats], [t for _, t, _ in mats],
                                      K, rows, len(SIZES), experts, weights, pairs)


@pytest.mark.parametrize("pairs", [True, False])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_expert_equals_the_stack_over_its_rows(isa_path, layout, pairs):
    mats = _experts("Q4_K")
    experts = _routes(layout)
    x = _x(len(experts))
    order = torch.randperm(SIZES[0], generator=torch.Generator().manual_seed(1))
    rows = [order if j == 0 else None for _ in range(EXPERTS) for j in range(len(SIZES))]
    y = _grouped(x, mats, experts, pairs=pairs, rows=rows)
    assert y.shape == (len(experts), sum(SIZES))
    for e in range(EXPERTS):
        mine = (experts == e).nonzero()[:, 0]
        own = mats[e * len(SIZES):(e + 1) * len(SIZES)]
        alone = quant.quant_matmul_stack(x[mine], [w for w, _, _ in own],
                                         [t for _, t, _ in own], K,
                                         rows[e * len(SIZES):(e + 1) * len(SIZES)], pairs)
        assert torch.equal(y[mine], alone), f"expert {e} ({len(mine)} routes)"


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_route_is_its_row_times_its_dequantized_expert(name, layout):
    mats = _experts(name, seed=3)
    experts = _routes(layout, seed=4)
    x = _x(len(experts), seed=5)
    y = _grouped(x, mats, experts)
    for r, e in enumerate(experts.tolist()):
        w = torch.cat([wf for _, _, wf in mats[e * len(SIZES):(e + 1) * len(SIZES)]])
        expected = x[r].double() @ w.double().T
        err = (y[r].double() - expected).norm() / expected.norm()
        assert err < 2e-3, f"route {r} (expert {e}): relative error {err:.2e}"


def test_a_token_read_by_k_routes_and_the_weighted_sum_of_its_routes():
    # A decode token's layer: one row of x read by its k routes (gate/up), then k rows
    # of the activation, one per route, summed with the routing weights (down).
    mats = _experts("Q6_K", seed=6)
    tokens, top_k = 3, 2
    experts = torch.tensor([3, 1, 1, 2, 0, 3])
    x = _x(tokens, seed=7)
    fanned = _grouped(x, mats, experts)
    assert torch.equal(fanned, _grouped(x.repeat_interleave(top_k, 0), mats, experts))
    weights = torch.rand(tokens, top_k, generator=torch.Generator().manual_seed(8))
    summed = _grouped(x.repeat_interleave(top_k, 0), mats, experts, weights)
    expected = (weights.unsqueeze(1) @ fanned.view(tokens, top_k, -1)).squeeze(1)
    torch.testing.assert_close(summed, expected, atol=1e-4, rtol=1e-5)


def test_no_routes_give_an_empty_product():
    mats = _experts("Q8_0")
    y = _grouped(torch.zeros(0, K), mats, torch.zeros(0, dtype=torch.int64))
    assert y.shape == (0, sum(SIZES))


@pytest.mark.parametrize(("change", "message"), [
    ({"experts": torch.tensor([0, EXPERTS])}, "experts\\[1\\]"),
    ({"experts": torch.tensor([0, 1, 2])}, "whole number of routes"),
    ({"weights": torch.ones(3, 1)}, "route_weights"),
    ({"per_expert": 3}, "per_expert"),
])
def test_bad_arguments_are_refused_by_name(change, message):
    mats = _experts("Q4_0")
    args = {"experts": torch.tensor([0, 1]), "weights": None, "per_expert": len(SIZES)}
    args.update(change)
    with pytest.raises(RuntimeError, match=message):
        quant.quant_matmul_grouped(_x(2), [w for w, _, _ in mats], [t for _, t, _ in mats],
                                   K, [None] * len(mats), args["per_expert"], args["experts"],
                                   args["weights"], True)
