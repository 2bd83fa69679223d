"""Products with GGUF-quantized matrices on the CPU, through the native library's ops.

Thin wrappers over `torch.ops.folio_cpu.*` (kernels/cpu/csrc/quant); call them only when
`kernels.cpu.available()`. All tensors are on the CPU. A weight `w` is uint8
[n, row_bytes], row_bytes = k / block_size * block_bytes (the file's own blocks, llama.cpp's
layouts; unit stride along a row, any row stride, so a view into the mapped file works),
and `type_id` its GGMLQuantizationType (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, MXFP4:
csrc/quant/mxfp4.h).

Quantized activations, one row of act_row_bytes(k) bytes, with K256 = 256 * ceil(k / 256)
(zero padding past k, so the kernels only ever see whole groups of 256):

    int8    q[K256]         q_i = clamp(nearbyint(x_i / d_b), -127, 127), ties to even
    float32 d[K256 / 32]    d_b = max |x| over block b / 127 (q = 0 where d_b = 0)
    int16   sum[K256 / 16]  the sum of q over each 16 elements

(little-endian, in that order, each part 32-byte aligned in the row; rows are a multiple
of 64 bytes). A product computes, per 32-element block b, dx_b * (integer dot products of
the weight's unsigned q with the activations' q, times its integer sub-block scales, minus
its integer offsets times `sum`), accumulated in float32.
"""

from __future__ import annotations

import torch

GROUP = 256  # weights per padded group
GROUP_BYTES = 320  # act bytes per group: 256 q + 8 float d + 16 int16 sums
WIDE_CHUNK = 512  # elements per chunk of the 16-bit rows
WIDE_CHUNK_BYTES = 1216  # 512 int16 q + 16 float d, m0, m1


def act_row_bytes(k: int) -> int:
    """Bytes of one quantized activation row of k elements (k a multiple of 32)."""
    return -(-k // GROUP) * GROUP_BYTES


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """float32 [m, k] (k a multiple of 32) -> uint8 [m, act_row_bytes(k)], the layout above.

    Quantize once, multiply by several matrices: every quant_matmul on the result skips
    this step."""
    return torch.ops.folio_cpu.quantize_activations(x)


def quantize_activations_residual(x: torch.Tensor) -> torch.Tensor:
    """float32 [m, k] -> uint8 [2m, act_row_bytes(k)]: row 2i is x_i's 8-bit blocks
    (quantize_activations), row 2i + 1 those of its residual x_i - d*q. A product over the
    pairs (quant_matmul_stack with pairs=True) reads each weight once and sums each pair:
    x @ W.T with about 15 bits of every activation (the residual's step is 1/256 of its
    block's, so a pair's two integer dots combine before any float work)."""
    return torch.ops.folio_cpu.quantize_activations_residual(x)


def quant_matmul_stack(x: torch.Tensor, ws: list[torch.Tensor], type_ids: list[int], k: int,
                       rows: list[torch.Tensor | None], pairs: bool) -> torch.Tensor:
    """x @ [W_1; W_2; ...].T -> float32 [m, sum of n_j]: each matrix as it lies (its own
    block type and optional row order, as in quant_matmul) into its columns, in one call.

    x: float32 [m, k], quantized activations [m, ...], or with `pairs` the [2m, ...] rows
    of quantize_activations_residual; with `pairs` each pair is summed into one output row.
    Float rows are quantized inside: past the ISA's decode sizes (m, or 2m with `pairs`,
    above about ten) to the 16-bit rows of quant_matmul_wide, which `pairs` then leaves
    as they are; below, to 8-bit rows, with `pairs` as quantize_activations_residual does.
    """
    return torch.ops.folio_cpu.quant_matmul_stack(x, ws, type_ids, k, rows, pairs)


def quant_matmul_grouped(x: torch.Tensor, ws: list[torch.Tensor], type_ids: list[int], k: int,
                         rows: list[torch.Tensor | None], per_expert: int,
                         experts: torch.Tensor, route_weights: torch.Tensor | None,
                         pairs: bool) -> torch.Tensor:
    """A mixture of experts' product in one call (csrc/quant/grouped.cpp).

    ws, type_ids, rows: every expert's matrices as quant_matmul_stack takes them, expert e
    the `per_expert` entries from e * per_expert (its matrices' products side by side in
    its n output columns; every expert has the same n). experts: int64 [R], route r's
    expert; x: float32 [m, k] with R a multiple of m, route r reading row r // (R / m) (a
    layer's gate/up: the tokens, each read by its k consecutive routes; its down: one row
    per route). Without route_weights -> float32 [R, n], route r's product; with
    route_weights float32 [T, kk] (T * kk = R) -> [T, n], row t the sum over j of
    route_weights[t, j] times route t * kk + j's product.

    `pairs` as in quant_matmul_stack: an expert with few routes takes the decode GEMV
    (8-bit rows, (x, residual) pairs with `pairs`), all such experts in one parallel
    region; one with more takes quant_matmul_stack over its rows (the tiles)."""
    return torch.ops.folio_cpu.quant_matmul_grouped(x, ws, type_ids, k, rows, per_expert,
                                                    experts, route_weights, pairs)


def quant_matmul(x: torch.Tensor, w: torch.Tensor, type_id: int, k: int,
                 rows: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W.T -> float32 [m, n_out], W the dequantized w.

    x: float32 [m, k] (quantized inside) or quantize_activations' uint8 [m, act_row_bytes(k)].
    rows: optional int64 [n_out]; output column j uses weight row rows[j] (a permutation
    applied while reading, e.g. llama.cpp's Q/K row order). Without it n_out = w.size(0).
    """
    return torch.ops.folio_cpu.quant_matmul(x, w, type_id, k, rows)


def quantize_activations_wide(x: torch.Tensor) -> torch.Tensor:
    """float32 [m, k] (k a multiple of 32) -> uint8 [m, WIDE_CHUNK_BYTES * ceil(k / 512)]:
    the 16-bit rows of the prefill tiles (csrc/quant/wide.h). Per 512-element chunk:

        int16   q[512]    word 16 j + l (two int16) holds elements 2j, 2j + 1 of block l
                          (32 elements); q_i = clamp(nearbyint(x_i / d_b), -16383, 16383)
        float32 d[16]     d_b = max |x| over block b / 16383
        float32 m0[16]    d_b * the sum of q over the first 16 elements of block b
        float32 m1[16]    d_b * the sum of q over all 32
    """
    return torch.ops.folio_cpu.quantize_activations_wide(x)


def quant_matmul_wide(x: torch.Tensor, w: torch.Tensor, type_id: int, k: int,
                      rows: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W.T as quant_matmul, on the wide tiles whatever m: x (float32 [m, k]) rounded
    to 14 bits and a sign per element (quantize_activations_wide), each weight to int16
    with its integer sub-block scale. quant_matmul_stack takes this path for float rows
    past the decode sizes."""
    return torch.ops.folio_cpu.quant_matmul_wide(x, w, type_id, k, rows)


def dequantize_rows(w: torch.Tensor, ids: torch.Tensor, type_id: int, k: int) -> torch.Tensor:
    """Rows `ids` (int64 [t]) of W as float32 [t, k], bit-equal to gguf.quants.dequantize:
    the embedding lookup."""
    return torch.ops.folio_cpu.dequantize_rows(w, ids, type_id, k)
