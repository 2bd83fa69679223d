"""A step's attention plan for the PyTorch reference: what depends on the metadata alone
(which blocks each sequence reads, its masks, the window's first block), worked out once
per step and kept for every layer (TorchBackend keys it on the AttentionMetadata object
and the window)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernels.interface import AttentionMetadata, effective_window
from kernels.reference.block_reads import block_ids
from kernels.reference.shared_prefix import SharedPrefix


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
    # Several sequences starting with the same blocks (candidates): read those once.
    shared: SharedPrefix | None = None
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
            shared = SharedPrefix.find(tables, lengths, block_size, device)
            return cls(max_seq_len, mask, ids, shared=shared)
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
              block_size: int, device: torch.device, window: int | None,
              key_ends: torch.Tensor | None = None) -> ChunkPlan:
        """``key_ends``: the rows' key limits (AttentionMetadata.key_ends), or None."""
        q_len = end - start
        num_blocks = -(-seq_len // block_size)
        window = effective_window(window, seq_len)
        if window is None:
            mask = (causal_mask(q_len, seq_len, device) if key_ends is None
                    else key_end_mask(q_len, seq_len, key_ends, None, 0, device))
            assert mask is not None
            return cls(start, end, block_ids(block_table, num_blocks, device), seq_len, mask)
        # The earliest query (position seq_len - q_len) sees back to seq_len - q_len - W + 1.
        first_pos = max(0, seq_len - q_len - window + 1)
        first_block = first_pos // block_size
        ids = block_ids(block_table[first_block:], num_blocks - first_block, device)
        mask = (sliding_window_mask(q_len, seq_len, window, first_pos, device)
                if key_ends is None
                else key_end_mask(q_len, seq_len, key_ends, window, first_pos, device))
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
                # A one-token query is causal whatever key_ends says: its position is its
                # sequence's last, so it has no later key to see.
                ends = None if meta.key_ends is None else meta.key_ends[start:end]
                chunks.append(ChunkPlan.build(start, end, meta.block_tables[i], seq_len,
                                              block_size, device, window, ends))
        if not decode_seqs:
            return cls(None, None, chunks)
        index = torch.tensor(decode_seqs, device=meta.seq_lens.device)
        decode = DecodePlan.build(
            meta.block_tables.index_select(0, index), meta.seq_lens.index_select(0, index),
            max(seq_lens[i] for i in decode_seqs), block_size, device, window,
        )
        rows = torch.tensor([starts[i] for i in decode_seqs], dtype=torch.int64, device=device)
        return cls(decode, rows, chunks)


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


def key_end_mask(q_len: int, seq_len: int, key_ends: torch.Tensor, window: int | None,
                 first_key: int, device: torch.device) -> torch.Tensor:
    """Bool [q_len, seq_len - first_key] over keys first_key .. seq_len - 1 with per-row
    key limits (AttentionMetadata.key_ends): query row j (position p) sees key k iff
    k < key_ends[j] and, under a window, k > p - window. That is transformers' Gemma 3
    mask for an image's tokens: sliding_window AND (causal OR same image)."""
    query_pos = torch.arange(seq_len - q_len, seq_len, device=device)[:, None]
    key_pos = torch.arange(first_key, seq_len, device=device)[None, :]
    mask = key_pos < key_ends.to(device=device, dtype=torch.int64)[:, None]
    if window is not None:
        mask &= key_pos > query_pos - window
    return mask
