"""PyTorch paged attention: the CPU backend of the engine and the oracle of the Triton kernels.

Every function here reads the cache only through block tables and slot mappings, exactly as
docs/INTERNALS.md lays out the seam, so a kernel that agrees with these functions agrees
with the engine. Clarity comes first; the concessions to speed (the engine runs on this
backend on CPU) are that single-token (decode) sequences run as one batched SDPA call
instead of a Python loop over sequences, gathers use index_select (or a view, when a
sequence's blocks are consecutive) and yield each KV head's tokens as one matrix, and
TorchBackend plans a step (what depends on the metadata alone) once instead of once per
layer. Any pool layout works (kernels.interface.allocate_kv_cache); TorchBackend asks for the
head-major one, which its attention reads fastest.

Two options of `attention` (kernels.interface.check_attention_options has the exact rules):
a sliding window trims what is read to the window's blocks (blocks wholly before a
query's window are never read, not even through their block-table entry), and a logit
soft-cap, which SDPA lacks, switches to an explicit fp32 softmax (`_explicit_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kernels.interface import AttentionMetadata, check_attention_options, effective_window


def write_kv_ref(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter each token's K/V [num_tokens, nkv, hd] to its slot; slot -1 is skipped."""
    _write_kv(key, value, k_cache, v_cache, _valid_slots(slot_mapping, k_cache.device))


def _valid_slots(slot_mapping: torch.Tensor,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The int64 slots to write and, when some tokens are skipped (-1), the rows to keep."""
    slots = slot_mapping.to(device=device, dtype=torch.int64)
    # Padding tokens exist only in some batches; skip the masking otherwise.
    if bool((slots < 0).any()):
        keep = slots >= 0
        return slots[keep], keep
    return slots, None


def _write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor, valid: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    slots, keep = valid
    if keep is not None:
        key, value = key[keep], value[keep]
    num_blocks, block_size, num_kv_heads, head_size = k_cache.shape
    flat_shape = (num_blocks * block_size, num_kv_heads, head_size)
    if key.dtype != k_cache.dtype:
        key, value = key.to(k_cache.dtype), value.to(v_cache.dtype)
    k_cache.view(flat_shape).index_copy_(0, slots, key)
    v_cache.view(flat_shape).index_copy_(0, slots, value)


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
                    num_tokens: int | None = None, skip: int = 0) -> torch.Tensor:
    """`num_tokens` (default: all the rest) tokens of blocks `ids` of a
    [num_blocks, bs, nkv, hd] cache, after the first `skip` of them, per KV head:
    [nkv, num_tokens, hd]. A view for a slice; for a head-major pool each head's rows
    are then one contiguous run (kernels.interface.allocate_kv_cache)."""
    if isinstance(ids, slice):
        start = ids.start * cache.shape[1] + skip
        stop = ids.stop * cache.shape[1] if num_tokens is None else start + num_tokens
        # [num_blocks * bs, nkv, hd] is a view in either pool layout.
        return cache.flatten(0, 1).permute(1, 0, 2)[:, start:stop]
    blocks = cache.permute(2, 0, 1, 3).index_select(1, ids).flatten(1, 2)
    if num_tokens is None:
        return blocks[:, skip:] if skip else blocks
    return blocks[:, skip:skip + num_tokens]


def paged_attention_ref(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttentionMetadata, scale: float,
                        sliding_window: int | None = None,
                        logit_softcap: float | None = None) -> torch.Tensor:
    """Attention of a varlen batch over the paged cache; returns [num_tokens, nq, hd].

    Sequence i's rows query_start_loc[i]:query_start_loc[i+1] are its newest tokens: they
    see every cached position before them and, causally, each other. K/V of the new tokens
    must already be in the cache (write_kv first). sliding_window W: the token at position
    p sees only keys p - W + 1 .. p. logit_softcap c: scores are c * tanh(score / c)
    (after the scale, before the mask).
    """
    _check_heads(query, k_cache)
    check_attention_options(sliding_window, logit_softcap)
    plan = StepPlan.build(meta, k_cache.shape[1], k_cache.device, sliding_window)
    return _attention(query, k_cache, v_cache, plan, scale, logit_softcap)


@dataclass(slots=True)
class DecodePlan:
    """Sequences with one new token each, attended together in one batched call.

    With a sliding window each sequence reads only the blocks from the one holding its
    window's first position: one sequence reads exactly its window (`skip` drops the
    positions before it in that block); a batch reads the same number of blocks per
    sequence (padded with its own last block) and masks what lies outside each window."""

    seq_len: int  # one sequence: the keys read (its context or window); beyond are never read
    mask: torch.Tensor | None  # bool [num_seqs, 1, 1, blocks_per_seq * block_size]; None: 1 seq
    # Every sequence's blocks, flattened, for heads_of_blocks (a slice: one sequence whose
    # blocks are consecutive).
    ids: torch.Tensor | slice
    skip: int = 0  # one sequence: positions of its first block read that are before the window
    # SDPA turns a bool mask into an additive one on every call; layers reuse this one.
    additive: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)

    def mask_for(self, dtype: torch.dtype) -> torch.Tensor | None:
        if self.mask is None:
            return None
        if dtype not in self.additive:
            zeros = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device)
            self.additive[dtype] = zeros.masked_fill(~self.mask, float("-inf"))
        return self.additive[dtype]

    @classmethod
    def build(cls, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int,
              block_size: int, device: torch.device, window: int | None = None) -> DecodePlan:
        max_blocks = -(-max_seq_len // block_size)
        tables = block_tables[:, :max_blocks].to(device=device, dtype=torch.int64)
        window = effective_window(window, max_seq_len)
        if window is not None:
            return cls._windowed(tables, seq_lens, max_seq_len, block_size, device, window)
        num_seqs = tables.shape[0]
        mask = None
        if num_seqs == 1:
            ids = block_ids(tables[0], max_blocks, device)
        else:
            ids = tables.flatten()
            padded_len = max_blocks * block_size
            positions = torch.arange(padded_len, device=device)
            lengths = seq_lens.to(device=device)
            mask = (positions[None, :] < lengths[:, None]).view(num_seqs, 1, 1, padded_len)
        return cls(max_seq_len, mask, ids)

    @classmethod
    def _windowed(cls, tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int,
                  block_size: int, device: torch.device, window: int) -> DecodePlan:
        # The query sits at position seq_len - 1 and sees keys seq_len - W .. seq_len - 1.
        num_seqs = tables.shape[0]
        if num_seqs == 1:
            first_pos = max(0, max_seq_len - window)
            first_block = first_pos // block_size
            ids = block_ids(tables[0, first_block:], -(-max_seq_len // block_size) - first_block,
                            device)
            return cls(max_seq_len - first_pos, None, ids, first_pos - first_block * block_size)
        lengths = seq_lens.to(device=device, dtype=torch.int64)
        first_pos = lengths - window  # may be negative: the whole context is in the window
        num_blocks = (lengths + block_size - 1) // block_size
        first_block = first_pos.clamp(min=0) // block_size
        per_seq = int((num_blocks - first_block).max())
        columns = first_block[:, None] + torch.arange(per_seq, device=device)
        # A sequence with fewer window blocks than the longest pads with its own last
        # block (masked): neither the entries before its window nor the table's padding
        # are read.
        ids = tables.gather(1, torch.minimum(columns, num_blocks[:, None] - 1)).flatten()
        positions = (columns[:, :, None] * block_size
                     + torch.arange(block_size, device=device)).flatten(1)
        mask = (positions >= first_pos[:, None]) & (positions < lengths[:, None])
        return cls(max_seq_len, mask.view(num_seqs, 1, 1, -1), ids)


@dataclass(slots=True)
class ChunkPlan:
    """One sequence with several new tokens (a prefill chunk)."""

    start: int  # its rows in the query
    end: int
    ids: torch.Tensor | slice  # its blocks read (from the first holding a visible key)
    num_keys: int  # keys read: the context, or from the first query's window start on
    mask: torch.Tensor  # bool [q_len, num_keys], from causal_mask or sliding_window_mask
    skip: int = 0  # positions of the first block read that precede every query's window

    @classmethod
    def build(cls, start: int, end: int, block_table: torch.Tensor, seq_len: int,
              block_size: int, device: torch.device, window: int | None) -> ChunkPlan:
        q_len = end - start
        num_blocks = -(-seq_len // block_size)
        window = effective_window(window, seq_len)
        if window is None:
            mask = causal_mask(q_len, seq_len, device)
            assert mask is not None
            return cls(start, end, block_ids(block_table, num_blocks, device), seq_len, mask)
        # The earliest query (position seq_len - q_len) sees back to seq_len - q_len - W + 1.
        first_pos = max(0, seq_len - q_len - window + 1)
        first_block = first_pos // block_size
        ids = block_ids(block_table[first_block:], num_blocks - first_block, device)
        mask = sliding_window_mask(q_len, seq_len, window, first_pos, device)
        return cls(start, end, ids, seq_len - first_pos, mask,
                   first_pos - first_block * block_size)


@dataclass(slots=True)
class StepPlan:
    """How one step's batch splits into batched decode tokens and per-sequence chunks; it
    depends on the metadata alone, so every layer of a step can share it."""

    decode: DecodePlan | None
    decode_rows: torch.Tensor | None  # int64 query rows of the decode tokens; None: all rows
    chunks: list[ChunkPlan]

    @classmethod
    def build(cls, meta: AttentionMetadata, block_size: int, device: torch.device,
              window: int | None = None) -> StepPlan:
        if meta.max_query_len == 1:
            decode = DecodePlan.build(meta.block_tables, meta.seq_lens, meta.max_seq_len,
                                      block_size, device, window)
            return cls(decode, None, [])
        starts = meta.query_start_loc.tolist()
        seq_lens = meta.seq_lens.tolist()
        decode_seqs: list[int] = []
        chunks: list[ChunkPlan] = []
        for i, seq_len in enumerate(seq_lens):
            start, end = starts[i], starts[i + 1]
            if end - start > seq_len:
                raise ValueError(
                    f"sequence {i}: query length {end - start} exceeds its seq_len {seq_len}"
                )
            if end - start == 1:
                decode_seqs.append(i)
            elif end > start:
                chunks.append(ChunkPlan.build(start, end, meta.block_tables[i], seq_len,
                                              block_size, device, window))
        if not decode_seqs:
            return cls(None, None, chunks)
        index = torch.tensor(decode_seqs, device=meta.seq_lens.device)
        decode = DecodePlan.build(
            meta.block_tables.index_select(0, index), meta.seq_lens.index_select(0, index),
            max(seq_lens[i] for i in decode_seqs), block_size, device, window,
        )
        rows = torch.tensor([starts[i] for i in decode_seqs], dtype=torch.int64, device=device)
        return cls(decode, rows, chunks)


def _check_heads(query: torch.Tensor, k_cache: torch.Tensor) -> None:
    if query.dim() != 3:
        raise ValueError(f"query must be [num_tokens, nq, hd], got shape {tuple(query.shape)}")
    num_q_heads, num_kv_heads = query.shape[1], k_cache.shape[2]
    if num_q_heads % num_kv_heads != 0:
        raise ValueError(
            f"query heads ({num_q_heads}) must be a multiple of KV heads ({num_kv_heads})"
        )


def _attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               plan: StepPlan, scale: float, softcap: float | None = None) -> torch.Tensor:
    if plan.decode is not None and plan.decode_rows is None:
        return _decode_attention(query, k_cache, v_cache, plan.decode, scale, softcap)
    out = torch.empty_like(query)
    if plan.decode is not None and plan.decode_rows is not None:
        rows = plan.decode_rows
        out[rows] = _decode_attention(query[rows], k_cache, v_cache, plan.decode, scale,
                                      softcap)
    for chunk in plan.chunks:
        # Batched 4-D inputs: with 3-D ones and enable_gqa, SDPA on CPU takes its unfused
        # math path, 3x slower on a 512-token chunk.
        keys = heads_of_blocks(k_cache, chunk.ids, chunk.num_keys, chunk.skip)[None]
        values = heads_of_blocks(v_cache, chunk.ids, chunk.num_keys, chunk.skip)[None]
        chunk_query = query[None, chunk.start:chunk.end].transpose(1, 2)  # [1, nq, q_len, hd]
        if softcap is None:
            chunk_out = F.scaled_dot_product_attention(
                chunk_query, keys, values, attn_mask=chunk.mask, scale=scale, enable_gqa=True)
        else:
            chunk_out = _explicit_attention(chunk_query, keys, values, chunk.mask[None, None],
                                            scale, softcap)
        out[chunk.start:chunk.end] = chunk_out[0].transpose(0, 1)
    return out


def _decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      plan: DecodePlan, scale: float, softcap: float | None = None
                      ) -> torch.Tensor:
    """One new token per sequence: every sequence's blocks, padded to the longest, in a
    single SDPA over the batch with a length mask."""
    num_seqs, num_q_heads, head_size = query.shape
    if plan.mask is None:  # one sequence: its exact context or window, [1, nkv, seq_len, hd]
        keys = heads_of_blocks(k_cache, plan.ids, plan.seq_len, plan.skip)[None]
        values = heads_of_blocks(v_cache, plan.ids, plan.seq_len, plan.skip)[None]
    else:  # [nkv, B * blocks * bs, hd] -> [B, nkv, blocks * bs, hd]
        num_kv_heads = k_cache.shape[2]
        keys = heads_of_blocks(k_cache, plan.ids).view(num_kv_heads, num_seqs, -1, head_size)
        values = heads_of_blocks(v_cache, plan.ids).view(num_kv_heads, num_seqs, -1, head_size)
        keys, values = keys.transpose(0, 1), values.transpose(0, 1)
    if softcap is None:
        out = F.scaled_dot_product_attention(query.unsqueeze(2), keys, values,
                                             attn_mask=plan.mask_for(query.dtype), scale=scale,
                                             enable_gqa=True)
    else:
        out = _explicit_attention(query.unsqueeze(2), keys, values, plan.mask, scale, softcap)
    return out.view(num_seqs, num_q_heads, head_size)


def _explicit_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                        mask: torch.Tensor | None, scale: float, softcap: float
                        ) -> torch.Tensor:
    """SDPA's contract with a soft-cap, which SDPA lacks: query [B, nq, q_len, hd], keys
    and values [B, nkv, n, hd], mask bool broadcastable to [B, 1, q_len, n] (True = seen)
    or None. As Gemma 2's eager attention: scale, then c * tanh(score / c), then the mask,
    then softmax, all in fp32; returns [B, nq, q_len, hd] in query's dtype."""
    batch, num_q_heads, q_len, head_size = query.shape
    num_kv_heads = keys.shape[1]
    group = num_q_heads // num_kv_heads
    # Query head h uses KV head h // group: heads split as (nkv, group).
    q = query.float().reshape(batch, num_kv_heads, group * q_len, head_size)
    scores = torch.matmul(q, keys.float().transpose(-1, -2)) * scale  # [B, nkv, G*q, n]
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.view(batch, num_kv_heads, group, q_len, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask[:, :, None], float("-inf"))
    probs = scores.softmax(-1).view(batch, num_kv_heads, group * q_len, -1)
    out = torch.matmul(probs, values.float())
    return out.view(batch, num_q_heads, q_len, head_size).to(query.dtype)


def causal_mask(q_len: int, seq_len: int, device: torch.device) -> torch.Tensor | None:
    """Bool [q_len, seq_len]: the new tokens are the last q_len positions, so query row j
    (position seq_len - q_len + j) sees keys 0..seq_len - q_len + j. None = no masking."""
    if q_len == 1:
        return None
    query_pos = torch.arange(seq_len - q_len, seq_len, device=device)
    key_pos = torch.arange(seq_len, device=device)
    return key_pos[None, :] <= query_pos[:, None]


def sliding_window_mask(q_len: int, seq_len: int, window: int, first_key: int,
                        device: torch.device) -> torch.Tensor:
    """Bool [q_len, seq_len - first_key] over keys first_key .. seq_len - 1: query row j
    (position p = seq_len - q_len + j) sees key k iff p - window < k <= p. That is
    transformers' masking_utils.sliding_window_causal_mask_function (the overlay
    sliding_window_overlay: kv_idx > q_idx - sliding_window, and causal kv_idx <= q_idx):
    W keys, the query's own included, as flash-attn's window_size=(W - 1, 0)."""
    query_pos = torch.arange(seq_len - q_len, seq_len, device=device)[:, None]
    key_pos = torch.arange(first_key, seq_len, device=device)[None, :]
    return (key_pos <= query_pos) & (key_pos > query_pos - window)


def copy_blocks_ref(kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy-on-write: kv_cache[:, :, dst] = kv_cache[:, :, src] on every layer at once."""
    if src.shape != dst.shape:
        raise ValueError(f"src and dst must have the same shape, got {src.shape}, {dst.shape}")
    if src.numel() == 0:
        return
    src = src.to(device=kv_cache.device, dtype=torch.int64)
    dst = dst.to(device=kv_cache.device, dtype=torch.int64)
    # index_select copies the sources first, so a block that is both a source and a
    # destination in one call is read before it is overwritten.
    kv_cache.index_copy_(2, dst, kv_cache.index_select(2, src))


def swap_blocks_ref(src_cache: torch.Tensor, dst_cache: torch.Tensor, src_ids: torch.Tensor,
                    dst_ids: torch.Tensor) -> None:
    """Move whole blocks between the device pool and the host pool (same layout)."""
    if src_ids.shape != dst_ids.shape:
        raise ValueError(
            f"src_ids and dst_ids must have the same shape, got {src_ids.shape}, {dst_ids.shape}"
        )
    if src_cache.shape[:2] != dst_cache.shape[:2] or src_cache.shape[3:] != dst_cache.shape[3:]:
        raise ValueError(
            "src_cache and dst_cache differ beyond num_blocks: "
            f"{tuple(src_cache.shape)} vs {tuple(dst_cache.shape)}"
        )
    if src_ids.numel() == 0:
        return
    src_ids = src_ids.to(device=src_cache.device, dtype=torch.int64)
    dst_ids = dst_ids.to(device=dst_cache.device, dtype=torch.int64)
    blocks = src_cache.index_select(2, src_ids).to(dst_cache.device)
    dst_cache.index_copy_(2, dst_ids, blocks)


class TorchBackend:
    """The AttentionBackend protocol (kernels/interface.py) on plain PyTorch ops.

    A step calls write_kv and attention once per layer with the same metadata, so what
    depends on the metadata alone (valid slots, the StepPlan) is computed for the first
    layer and reused while the same metadata object comes back: build a new
    AttentionMetadata (and slot_mapping) per step rather than editing one in place.
    """

    name = "torch"
    head_major_kv = True

    def __init__(self) -> None:
        self._slots_key: torch.Tensor | None = None
        self._slots: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self._plan_key: tuple[AttentionMetadata | None, int, torch.device | None] = (
            None, 0, None)
        # One plan per window size: sliding and global layers alternate within a step.
        self._plans: dict[int | None, StepPlan] = {}

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        # Holding the last tensor keeps its id from being reused by a new one.
        if slot_mapping is not self._slots_key or self._slots is None:
            self._slots = _valid_slots(slot_mapping, k_cache.device)
            self._slots_key = slot_mapping
        _write_kv(key, value, k_cache, v_cache, self._slots)

    def attention(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  meta: AttentionMetadata, scale: float, sliding_window: int | None = None,
                  logit_softcap: float | None = None) -> torch.Tensor:
        block_size, device = k_cache.shape[1], k_cache.device
        if self._plan_key[0] is not meta or self._plan_key[1:] != (block_size, device):
            # The first layer of a step: the checks and plans hold for the later layers.
            _check_heads(query, k_cache)
            self._plans = {}
            self._plan_key = (meta, block_size, device)
        plan = self._plans.get(sliding_window)
        if plan is None:
            check_attention_options(sliding_window, None)
            plan = StepPlan.build(meta, block_size, device, sliding_window)
            self._plans[sliding_window] = plan
        if logit_softcap is not None:
            check_attention_options(None, logit_softcap)
        return _attention(query, k_cache, v_cache, plan, scale, logit_softcap)

    def copy_blocks(self, kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        copy_blocks_ref(kv_cache, src, dst)

    def swap_blocks(self, src_cache: torch.Tensor, dst_cache: torch.Tensor,
                    src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
        swap_blocks_ref(src_cache, dst_cache, src_ids, dst_ids)
