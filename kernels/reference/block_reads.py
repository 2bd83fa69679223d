"""Reading a sequence's blocks out of a paged KV pool for the PyTorch reference: which
physical blocks (`block_ids`: a slice when they are consecutive, so they are read in
place) and their keys or values per KV head (`heads_of_blocks`)."""

from __future__ import annotations

import torch

from kernels.kv_format import SCALE_BYTES, KVFormat, format_of


def block_ids(block_table: torch.Tensor, num_blocks: int,
              device: torch.device) -> torch.Tensor | slice:
    """A sequence's first num_blocks physical blocks: a slice when the ids are consecutive
    (fresh sequences get consecutive blocks from the free queue), so the blocks are read in
    place instead of gathered; otherwise an int64 index tensor."""
    ids = block_table[:num_blocks].tolist()
    if ids == list(range(ids[0], ids[0] + num_blocks)):
        return slice(ids[0], ids[0] + num_blocks)
    return torch.tensor(ids, dtype=torch.int64, device=device)


def heads_of_blocks(cache: torch.Tensor, ids: torch.Tensor | slice,
                    num_tokens: int | None = None, skip: int = 0,
                    dtype: torch.dtype | None = None, keys: bool = False) -> torch.Tensor:
    """`num_tokens` (default: all the rest) tokens of blocks `ids` of a
    [num_blocks, bs, nkv, hd] cache, after the first `skip` of them, per KV head:
    [nkv, num_tokens, hd], in `dtype` where given (a query's, over a pool that stores
    another: a float16 pool under float32 compute). A view for a slice in the pool's own
    dtype; for a head-major pool each head's rows are then one contiguous run
    (kernels.interface.allocate_kv_cache). A quantized pool's rows are decoded
    (kernels/kv_format.py; still rotated, for a rotated format) to `dtype`, float32 when
    None: only the blocks read. ``keys``: the cache holds keys, which an int8 or int4
    pool decodes a whole block at a time."""
    fmt = format_of(cache)
    if keys and fmt.keys_by_block:
        return _decoded_key_blocks(cache, ids, num_tokens, skip, fmt, dtype or torch.float32)
    if isinstance(ids, slice):
        start = ids.start * cache.shape[1] + skip
        stop = ids.stop * cache.shape[1] if num_tokens is None else start + num_tokens
        # [num_blocks * bs, nkv, hd] is a view in either pool layout.
        rows = cache.flatten(0, 1).permute(1, 0, 2)[:, start:stop]
    else:
        rows = cache.permute(2, 0, 1, 3).index_select(1, ids).flatten(1, 2)
        if num_tokens is None:
            rows = rows[:, skip:] if skip else rows
        else:
            rows = rows[:, skip:skip + num_tokens]
    if fmt.quantized:
        return _decoded(rows, fmt, dtype or torch.float32)
    return rows if dtype is None else rows.to(dtype)


def _decoded(rows: torch.Tensor, fmt: KVFormat, dtype: torch.dtype) -> torch.Tensor:
    """rows [..., row] of a quantized pool -> [..., hd] values, as ``fmt.decode``. An
    8-bit row is read in place (its values converted, its scale the only copy): decode
    copies every row to bytes first, which made a long context's decode step several
    times slower than the float16 pool's."""
    if fmt.bits != 8:
        return fmt.decode(rows, dtype)
    hd = fmt.head_size(rows.shape[-1])
    scale = rows[..., hd:hd + SCALE_BYTES].contiguous().view(torch.float16).float()  # [..., 1]
    return (rows[..., :hd].float() * scale).to(dtype)


def _decoded_key_blocks(cache: torch.Tensor, ids: torch.Tensor | slice, num_tokens: int | None,
                        skip: int, fmt: KVFormat, dtype: torch.dtype) -> torch.Tensor:
    """heads_of_blocks of an int8 or int4 key cache: the blocks decoded whole, then the
    tokens taken."""
    blocks = cache[ids] if isinstance(ids, slice) else cache.index_select(0, ids)
    keys = fmt.decode_keys(blocks, dtype).flatten(0, 1).permute(1, 0, 2)  # [nkv, n, hd]
    stop = None if num_tokens is None else skip + num_tokens
    return keys[:, skip:stop]
