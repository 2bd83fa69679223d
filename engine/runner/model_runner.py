"""Runs one scheduled step on the model: KV cache tensors, step inputs, forward.

The scheduler decides in blocks and sequences; this module turns that into tensors:
token ids, positions, a slot for each new token's K/V, block tables and context
lengths (``kernels.AttentionMetadata``). Before the forward it applies the step's
swap and copy-on-write lists to the cache.
"""

from __future__ import annotations

import logging

import torch

from engine.core.scheduler import SchedulerOutput
from engine.runner.kv_cache import KVShape
from kernels import AttentionBackend, AttentionMetadata, allocate_kv_cache

log = logging.getLogger(__name__)

class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        shape: KVShape,
        num_blocks: int,
        num_host_blocks: int,
        backend: AttentionBackend,
        device: torch.device,
    ) -> None:
        self.model = model
        self.shape = shape
        self.backend = backend
        self.device = device
        self.kv_cache = self._allocate(num_blocks, device)
        self.host_cache = None
        if num_host_blocks:
            self.host_cache = self._allocate(num_host_blocks, torch.device("cpu"),
                                             pin_memory=device.type == "cuda")

    def _allocate(self, num_blocks: int, device: torch.device,
                  pin_memory: bool = False) -> torch.Tensor:
        """A pool in the memory order the backend reads best; the host pool matches the
        device pool so that swaps move blocks between like layouts."""
        s = self.shape
        return allocate_kv_cache(s.num_layers, num_blocks, s.block_size, s.num_kv_heads,
                                 s.head_size, s.dtype, device,
                                 head_major=self.backend.head_major_kv, pin_memory=pin_memory)

    @property
    def kv_pool_bytes(self) -> int:
        return self.kv_cache.numel() * self.kv_cache.element_size()

    def apply_block_moves(self, out: SchedulerOutput) -> None:
        """Swap-outs first: the blocks they free may be reused by this step's swap-ins
        and copies."""
        if out.swap_out:
            dev, host = _pairs(out.swap_out)
            self.backend.swap_blocks(self.kv_cache, self.host_cache, dev, host)
        if out.swap_in:
            host, dev = _pairs(out.swap_in)
            self.backend.swap_blocks(self.host_cache, self.kv_cache, host, dev)
        if out.cow_pairs:
            src, dst = _pairs(out.cow_pairs)
            self.backend.copy_blocks(self.kv_cache, src.to(self.device), dst.to(self.device))

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> torch.Tensor | None:
        """Run the step; returns float32 logits for each scheduled sequence whose chunk
        ends at its last token (in ``out.scheduled`` order), or None if there is none."""
        self.apply_block_moves(out)
        if not out.scheduled:
            return None
        input_ids, positions, meta, sample_rows = self.prepare(out)
        hidden = self.model(input_ids, positions, self.kv_cache, meta, self.backend)
        if not sample_rows:
            return None
        return self.model.compute_logits(hidden[sample_rows])

    def prepare(self, out: SchedulerOutput):
        bs = self.shape.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        sample_rows: list[int] = []
        for item in out.scheduled:
            seq = item.seq
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + item.num_new_tokens
            ids += seq.token_ids[start:end]
            positions += range(start, end)
            table = seq.block_table
            slots += [table[p // bs] * bs + p % bs for p in range(start, end)]
            starts.append(starts[-1] + item.num_new_tokens)
            seq_lens.append(end)
            tables.append(table)
            if item.samples:
                sample_rows.append(starts[-1] - 1)
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]
        dev = self.device
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            max_query_len=max(s.num_new_tokens for s in out.scheduled),
            max_seq_len=max(seq_lens),
        )
        input_ids = torch.tensor(ids, dtype=torch.int64, device=dev)
        pos = torch.tensor(positions, dtype=torch.int64, device=dev)
        return input_ids, pos, meta, sample_rows


def _pairs(pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.tensor(pairs, dtype=torch.int64)
    return t[:, 0].contiguous(), t[:, 1].contiguous()
