"""A mixture of experts' feed-forward on GGUF-quantized expert blocks, fused per matrix:
each routed expert's gate/up and down products for all its tokens at once, the weights
dequantized in registers tile by tile (kernels/triton/quant_dequant.py, every block type
the dense kernels take, MXFP4 included) and never written out.

    x [T, H] --gather by route--> gate/up: [P, 2I] = x[token] @ W1[e].T (+ b1[e])
             --activation (the caller's, on [P, 2I] -> [P, I])-->
             down: [P, H] = w_route * (h @ W2[e].T (+ b2[e]))
             --inverse map, sum over k--> out [T, H]

P is the routing sort's padded length (kernels/triton/moe_routing.py): the intermediate and
the down products are in sorted order, so each tile's rows are contiguous and only x is
gathered. An expert's matrices are one uint8 [E, N, row_bytes] tensor of one block type
(a GGUF file's stacked ``ffn_*_exps``); a stack of several types (gate and up quantized
apart) is a list of parts, each a column range of the product.

One kernel, two inner products (constexpr DOT):
- prefill (more than GEMV_MAX_M tokens): a grouped GEMM. A program owns one BLOCK_M tile
  of one expert's rows and a BLOCK_N slice of its matrix; the dequantized [BLOCK_K,
  BLOCK_N] tile of W^T is tl.dot with the gathered rows (16-bit x: tensor-core inputs).
- decode (a handful of tokens): a GEMV. Tiles are as tall as the batch (an expert takes
  each token at most once), and the [BLOCK_M, BLOCK_N, BLOCK_K] broadcast product is
  reduced on the CUDA cores, as the dense GEMV (quant_matmul.py): each routed expert's
  blocks are read once, whatever its share of the batch, and no other expert's at all.
An expert with no tokens gets no tile, so none of its blocks is read; the programs of the
tiles past the last run (the buffers are sized for the worst case) return at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.quant.formats import QUANT_FORMATS
from kernels.triton.moe_routing import ExpertRouting, sort_routes
from kernels.triton.quant_dequant import check_quantized, tile_product
from kernels.triton.quant_matmul import GEMV_MAX_M, SUPPORTED_DTYPES, gemv_tiles


@dataclass(slots=True, frozen=True)
class ExpertPart:
    """Rows [start, start + n) of every expert's matrix, one block type: `data` is uint8
    [E, n, row_bytes] on the device."""

    type_id: int
    data: torch.Tensor
    start: int

    @property
    def rows(self) -> int:
        return self.data.shape[1]


@dataclass(slots=True, frozen=True)
class ExpertMatrix:
    """Every expert's [n, k] matrix as parts stacked by rows, and its bias (float32
    [E, n]) when it has one. Checked when built (once, at load), so a step checks only
    that the shapes meet; ValueError naming the bad field."""

    parts: tuple[ExpertPart, ...]
    k: int
    bias: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("parts must hold at least one ExpertPart")
        start = 0
        for part in self.parts:
            data = part.data
            if data.dim() != 3 or data.shape[0] != self.parts[0].data.shape[0]:
                raise ValueError(f"parts must be uint8 [E, n, row_bytes] stacks of one E, "
                                 f"got {list(data.shape)}")
            check_quantized(data[0], part.type_id, None, self.k)
            if not data.is_contiguous() or data.data_ptr() % 2:
                raise ValueError("parts must be contiguous at an even address (the "
                                 "kernels' fp16 loads)")
            if part.start != start:
                raise ValueError(f"part starts must follow each other: {part.start} "
                                 f"where {start} was due")
            start += part.rows
        if self.bias is not None and (
                self.bias.dtype != torch.float32 or self.bias.shape != (self.num_experts,
                                                                        start)
                or self.bias.stride(1) != 1):
            raise ValueError(f"bias must be float32 [{self.num_experts}, {start}] with "
                             f"contiguous rows, got {self.bias.dtype} "
                             f"{list(self.bias.shape)}")

    @property
    def n(self) -> int:
        return sum(part.rows for part in self.parts)

    @property
    def num_experts(self) -> int:
        return self.parts[0].data.shape[0]


@triton.jit
def _moe_kernel(
    a_ptr,  # [rows, K] activations: x [T, K] (gathered) or the sorted intermediate [P, K]
    w_ptr,  # uint8 [E, N, row_bytes]: every expert's quantized matrix
    bias_ptr,  # fp32 [E, bias_stride] (HAS_BIAS), already at this part's first column
    scale_ptr,  # fp32 [P]: the sorted routes' weights (HAS_SCALE)
    out_ptr,  # [P, stride_om], already at this part's first column
    sorted_ptr,  # int32 [P]: route ids in expert order, num_routes for padding
    tile_experts_ptr,  # int32 [max_tiles]
    N,
    K,
    row_bytes,
    expert_bytes,  # N * row_bytes: reaches 2**31 for the largest experts, kept int64
    stride_am,
    stride_om,
    bias_stride,
    num_routes,
    NUM_EXPERTS: tl.constexpr,
    GATHER: tl.constexpr,  # a rows are tokens: row = route // TOP_K; else sorted positions
    TOP_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    TYPE_ID: tl.constexpr,
    QBLOCK: tl.constexpr,
    QBYTES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    tile = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(tile_experts_ptr + tile)
    if expert >= NUM_EXPERTS:  # past the last run
        return
    offs_p = tile.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # int64 [BLOCK_M]
    routes = tl.load(sorted_ptr + offs_p)  # int32 [BLOCK_M]
    m_mask = routes < num_routes
    if GATHER:
        a_rows = (routes // TOP_K).to(tl.int64)
    else:
        a_rows = offs_p
    a_base = a_ptr + a_rows[:, None] * stride_am  # ptr [BLOCK_M, 1]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # int32 [BLOCK_N]
    n_mask = offs_n < N
    w_expert = w_ptr + expert.to(tl.int64) * expert_bytes  # uint8 ptr: this expert's rows
    row_off = offs_n.to(tl.int64) * row_bytes  # int64 [BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)  # int32 [BLOCK_K]
        k_mask = kk < K
        a = tl.load(a_base + kk[None, :], mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0)  # [BLOCK_M, BLOCK_K], a's dtype
        acc = tile_product(acc, a, w_expert, row_off, kk, n_mask, k_mask, DOT,
                           DOT_PRECISION, TYPE_ID, QBLOCK, QBYTES)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + expert.to(tl.int64) * bias_stride + offs_n, mask=n_mask,
                       other=0.0)  # fp32 [BLOCK_N]
        acc += bias[None, :]
    if HAS_SCALE:
        acc *= tl.load(scale_ptr + offs_p)[:, None]  # padding rows weigh 0
    out_ptrs = out_ptr + offs_p[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty),
             mask=m_mask[:, None] & n_mask[None, :])


def block_m_for(num_tokens: int, top_k: int, num_experts: int) -> int:
    """The routing tile height: the batch itself (a power of two) on the GEMV path; for the
    GEMM about the rows each expert takes on average, between tl.dot's 16 and 64."""
    if num_tokens <= GEMV_MAX_M:
        return triton.next_power_of_2(max(num_tokens, 1))
    mean = num_tokens * top_k // num_experts
    return min(64, max(16, triton.next_power_of_2(max(mean, 1))))


def grouped_matmul(a: torch.Tensor, matrix: ExpertMatrix, routing: ExpertRouting,
                   out: torch.Tensor, *, gather: bool, scale: bool) -> torch.Tensor:
    """out[p] = (a[row p] @ W[e_p].T + b[e_p]) (* the route's weight when `scale`) for each
    sorted position p of a route, e_p its expert; a's row p is its token's (`gather`) or p
    itself. out is [P, matrix.n]; padding rows are left as they were."""
    decode = routing.block_m <= GEMV_MAX_M
    if decode:
        _, block_n, block_k = gemv_tiles(routing.block_m, matrix.k)
    else:
        block_n, block_k = 64, 64
    precision = "ieee" if a.dtype == torch.float32 else "tf32"
    dummy = routing.weights  # a float32 pointer the kernel never reads
    for part in matrix.parts:
        fmt = QUANT_FORMATS[part.type_id]
        n = part.rows
        row_bytes = part.data.shape[2]
        bias = dummy if matrix.bias is None else matrix.bias[:, part.start:]
        grid = (routing.max_tiles, triton.cdiv(n, block_n))
        _moe_kernel[grid](
            a, part.data, bias, routing.weights, out[:, part.start:], routing.sorted,
            routing.tile_experts, n, matrix.k, row_bytes, n * row_bytes, a.stride(0),
            out.stride(0), 0 if matrix.bias is None else matrix.bias.stride(0),
            routing.num_routes, NUM_EXPERTS=routing.num_experts, GATHER=gather,
            TOP_K=routing.top_k, HAS_BIAS=matrix.bias is not None, HAS_SCALE=scale,
            DOT=not decode, DOT_PRECISION=precision, TYPE_ID=part.type_id,
            QBLOCK=fmt.block_size, QBYTES=fmt.block_bytes, BLOCK_M=routing.block_m,
            BLOCK_N=block_n, BLOCK_K=block_k)
    return out


def fused_moe(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
              gate_up: ExpertMatrix, down: ExpertMatrix,
              activation: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """sum over j of weights[t, j] * expert_{ids[t, j]}(x[t]) for each token t: x [T, H]
    (float32, bfloat16 or float16), ids / weights [T, k]; gate_up [E, 2I, H] and down
    [E, H, I] quantized; `activation` maps [P, 2I] (gate then up) to [P, I] in x's dtype.
    Returns [T, H] in x's dtype, accumulated in float32."""
    if x.dim() != 2 or x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"x must be 2-D in one of {SUPPORTED_DTYPES}, got {x.dtype} "
                         f"{list(x.shape)}")
    hidden = x.shape[1]
    if gate_up.k != hidden:
        raise ValueError(f"gate_up takes rows of {gate_up.k}, not {hidden}")
    if (down.n, down.k, down.num_experts) != (hidden, gate_up.n // 2, gate_up.num_experts):
        raise ValueError(f"down must be [{gate_up.num_experts}, {hidden}, "
                         f"{gate_up.n // 2}], got [{down.num_experts}, {down.n}, {down.k}]")
    if x.stride(1) != 1:
        x = x.contiguous()
    tokens, top_k = ids.shape
    if tokens == 0:
        return torch.zeros_like(x)
    routing = sort_routes(ids, weights, gate_up.num_experts,
                          block_m_for(tokens, top_k, gate_up.num_experts))
    padded = routing.sorted.shape[0]
    h = torch.empty((padded, gate_up.n), dtype=x.dtype, device=x.device)
    grouped_matmul(x, gate_up, routing, h, gather=True, scale=False)
    h = activation(h)
    if h.stride(1) != 1:
        h = h.contiguous()
    y = torch.empty((padded, hidden), dtype=torch.float32, device=x.device)
    grouped_matmul(h, down, routing, y, gather=False, scale=True)
    return y[routing.inverse].view(tokens, top_k, hidden).sum(1).to(x.dtype)
