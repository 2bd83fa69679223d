"""The fused MoE's routing sort (kernels/triton/moe_routing.py) against a NumPy model of it:
routes grouped by expert in route order (ties between tokens of one expert keep the lower
token first), each expert's run padded to whole tiles, no tile for an expert without
tokens, the tiles past the end marked, the inverse map and the sorted weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.triton.moe_routing import max_tiles, sort_routes


def numpy_sort(ids: np.ndarray, weights: np.ndarray, num_experts: int, block_m: int):
    """(sorted, tile_experts, weights, inverse) as the module documents them, by loops."""
    flat = ids.reshape(-1)
    routes = flat.size
    tiles = max_tiles(routes, num_experts, block_m)
    sorted_routes, tile_experts = [], []
    for e in range(num_experts):
        mine = [r for r in range(routes) if flat[r] == e]
        if not mine:
            continue
        padded = -(-len(mine) // block_m) * block_m
        sorted_routes += mine + [routes] * (padded - len(mine))
        tile_experts += [e] * (padded // block_m)
    sorted_routes += [routes] * (tiles * block_m - len(sorted_routes))
    tile_experts += [num_experts] * (tiles - len(tile_experts))
    inverse = np.empty(routes, dtype=np.int64)
    out_weights = np.zeros(tiles * block_m, dtype=np.float32)
    for p, r in enumerate(sorted_routes):
        if r < routes:
            inverse[r] = p
            out_weights[p] = weights.reshape(-1)[r]
    return np.array(sorted_routes), np.array(tile_experts), out_weights, inverse


def check(ids: torch.Tensor, num_experts: int, block_m: int) -> None:
    weights = torch.rand(ids.shape, generator=torch.Generator().manual_seed(ids.numel()))
    got = sort_routes(ids, weights, num_experts, block_m)
    expected = numpy_sort(ids.numpy(), weights.numpy(), num_experts, block_m)
    assert got.sorted.dtype == torch.int32 and got.tile_experts.dtype == torch.int32
    np.testing.assert_array_equal(got.sorted.numpy(), expected[0])
    np.testing.assert_array_equal(got.tile_experts.numpy(), expected[1])
    np.testing.assert_array_equal(got.weights.numpy(), expected[2])
    np.testing.assert_array_equal(got.inverse.numpy(), expected[3])
    assert got.num_routes == ids.numel() and got.top_k == ids.shape[1]


def distinct_top_k(tokens: int, k: int, num_experts: int, seed: int) -> torch.Tensor:
    scores = torch.rand(tokens, num_experts, generator=torch.Generator().manual_seed(seed))
    return torch.topk(scores, k, dim=-1).indices


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("tokens,block_m", [(1, 1), (5, 8), (8, 8), (33, 16), (200, 64)])
def test_matches_the_numpy_model(k, tokens, block_m):
    check(distinct_top_k(tokens, k, 16, seed=k * tokens), 16, block_m)


def test_ties_keep_route_order_and_idle_experts_get_no_tile():
    # Every token picks experts 5 and 2 (in that order), so experts 0, 1, 3, 4 and 6, 7
    # have none: the grouped routes must keep the tokens' order within each expert.
    ids = torch.tensor([[5, 2]] * 7)
    check(ids, 8, 4)
    got = sort_routes(ids, torch.ones(7, 2), 8, 4)
    assert got.tile_experts.tolist()[:4] == [2, 2, 5, 5]
    assert set(got.tile_experts.tolist()[4:]) == {8}
    assert got.sorted[:8].tolist() == [1, 3, 5, 7, 9, 11, 13, 14]


def test_one_expert_takes_every_route():
    check(torch.zeros(9, 1, dtype=torch.int64), 4, 4)


def test_bad_arguments_are_named():
    ids = torch.zeros(3, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="ids and weights"):
        sort_routes(ids, torch.ones(3, 3), 4, 4)
    with pytest.raises(ValueError, match="ids must"):
        sort_routes(ids.float(), torch.ones(3, 2), 4, 4)
    with pytest.raises(ValueError, match="num_experts"):
        sort_routes(ids, torch.ones(3, 2), 0, 4)
    with pytest.raises(ValueError, match="block_m"):
        sort_routes(ids, torch.ones(3, 2), 4, 3)
