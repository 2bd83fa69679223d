"""The routing sort of the fused mixture of experts (kernels/triton/fused_moe.py): a step's
routes (token t's j-th choice is route t * k + j) grouped by expert, each expert's run
padded to a whole number of BLOCK_M tiles, so a program of the grouped GEMM takes one tile
and knows its expert from one load.

    routes        ids [T, k], weights [T, k]
    sorted        [padded]: route ids, expert 0's first (in route order: ties between
                  tokens of one expert keep the lower token first), then expert 1's...;
                  each run padded with `num_routes` (no route) to a multiple of block_m
    tile_experts  [max_tiles]: the expert of each block_m tile of `sorted`; `num_experts`
                  for the tiles past the last run (their programs return at once)
    weights       [padded] float32: each sorted position's routing weight, 0 for padding
    inverse       [T * k] int64: route r's position in `sorted` (how the sorted products
                  come back to their tokens)

An expert with no tokens gets no tile. The buffers are as long as the worst case
(`max_tiles`: every expert's run one tile longer than whole tiles of its routes), so their
shapes depend only on T, k, the expert count and block_m: no host sync, no data-dependent
shape. Built from PyTorch ops on the routes' device (a stable sort, a count, prefix sums);
the kernels' work is the GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton


@dataclass(slots=True, frozen=True)
class ExpertRouting:
    sorted: torch.Tensor  # int32 [max_tiles * block_m]
    tile_experts: torch.Tensor  # int32 [max_tiles]
    weights: torch.Tensor  # float32 [max_tiles * block_m]
    inverse: torch.Tensor  # int64 [num_routes]
    block_m: int
    num_experts: int
    top_k: int

    @property
    def num_routes(self) -> int:
        return self.inverse.shape[0]

    @property
    def max_tiles(self) -> int:
        return self.tile_experts.shape[0]


def max_tiles(num_routes: int, num_experts: int, block_m: int) -> int:
    """The most tiles `num_routes` routes can fill: whole tiles of them plus at most one
    partly filled tile per expert that has any."""
    return triton.cdiv(num_routes, block_m) + min(num_experts, num_routes)


def sort_routes(ids: torch.Tensor, weights: torch.Tensor, num_experts: int,
                block_m: int) -> ExpertRouting:
    """ids (integer [T, k], each in [0, num_experts)) and weights ([T, k]) -> the routes
    grouped by expert in block_m tiles. ValueError naming the bad argument."""
    if ids.dim() != 2 or weights.shape != ids.shape:
        raise ValueError(f"ids and weights must both be [T, k], got {list(ids.shape)} and "
                         f"{list(weights.shape)}")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"ids must be an integer tensor, got {ids.dtype}")
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    if block_m < 1 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two, got {block_m}")
    top_k = ids.shape[1]
    num_routes = ids.numel()
    device = ids.device
    tiles = max_tiles(num_routes, num_experts, block_m)
    flat = ids.reshape(-1).to(torch.int64)
    order = torch.argsort(flat, stable=True)  # routes grouped by expert, ties in order
    experts = flat[order]
    # Not bincount: on CUDA it reads the largest id back to size its output, a host sync
    # that would also break a CUDA graph's capture.
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).index_add_(
        0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    run_start = torch.cumsum(counts, 0) - counts  # each expert's first route in `order`
    rank = torch.arange(num_routes, device=device) - run_start[experts]
    position = (padded_end - padded)[experts] + rank  # int64 [num_routes]
    sorted_routes = torch.full((tiles * block_m,), num_routes, dtype=torch.int32,
                               device=device)
    sorted_routes[position] = order.to(torch.int32)
    sorted_weights = torch.zeros(tiles * block_m, dtype=torch.float32, device=device)
    sorted_weights[position] = weights.reshape(-1).float()[order]
    inverse = torch.empty(num_routes, dtype=torch.int64, device=device)
    inverse[order] = position
    # Tile t starts at row t * block_m: its expert is the first whose padded run ends
    # past it; past the last run that is num_experts, which the kernels skip.
    starts = torch.arange(tiles, device=device) * block_m
    tile_experts = torch.searchsorted(padded_end, starts, right=True).to(torch.int32)
    return ExpertRouting(sorted_routes, tile_experts, sorted_weights, inverse, block_m,
                         num_experts, top_k)
