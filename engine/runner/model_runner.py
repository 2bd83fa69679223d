"""Runs one scheduled step on the model: KV cache tensors, step inputs, forward.

The scheduler decides in blocks and sequences; this module turns that into tensors:
token ids, positions, a slot for each new token's K/V, block tables and context
lengths (``kernels.AttentionMetadata``). Before the forward it applies the step's
swap and copy-on-write lists to the cache.

With several KV groups (engine/core/kv_groups.py) each group has a pool of its own
layers and its own block tables and slot mapping; positions, query starts and lengths
are shared. The model then gets a (k_cache, v_cache, metadata) per layer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from engine.core.kv_groups import KVGroupSpec, split_moves
from engine.core.scheduler import ScheduledSeq, SchedulerOutput
from engine.runner.cuda_graphs import CudaGraphRunner, backend_is_capturable
from engine.runner.kv_cache import KVShape
from kernels import AttentionBackend, AttentionMetadata, allocate_kv_cache

log = logging.getLogger(__name__)

class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        shape: KVShape,
        num_blocks: int | Sequence[int],
        num_host_blocks: int,
        backend: AttentionBackend,
        device: torch.device,
        groups: Sequence[KVGroupSpec] = (),
        cuda_graphs: bool = False,
        max_model_len: int | None = None,
    ) -> None:
        """``groups`` (empty: one group of every layer) with ``num_blocks`` per group;
        each group has ``num_host_blocks`` host blocks. ``cuda_graphs``: replay decode
        steps as CUDA graphs where the device and backend allow (runner/cuda_graphs.py),
        their block tables as wide as ``max_model_len`` needs."""
        self.model = model
        self.shape = shape
        self.backend = backend
        self.device = device
        self.groups = list(groups) or [KVGroupSpec(tuple(range(shape.num_layers)))]
        counts = [num_blocks] if isinstance(num_blocks, int) else list(num_blocks)
        assert len(counts) == len(self.groups), "a block count per group"
        self.kv_caches = [self._allocate(len(g.layers), n, device)
                          for g, n in zip(self.groups, counts, strict=True)]
        self.kv_cache = self.kv_caches[0]  # the whole pool of a model with one group
        self.host_caches: list[torch.Tensor | None] = [None] * len(self.groups)
        if num_host_blocks:
            self.host_caches = [self._allocate(len(g.layers), num_host_blocks,
                                               torch.device("cpu"),
                                               pin_memory=device.type == "cuda")
                                for g in self.groups]
        self.host_cache = self.host_caches[0]
        # Pool-wide block ids of the scheduler's moves (KVGroups): where each group starts.
        self._device_offsets = [sum(counts[:g]) for g in range(len(counts))]
        self._host_offsets = [g * num_host_blocks for g in range(len(counts))]
        # Per layer: its group and its K and V views in the group's pool.
        self._layer_views: list[tuple[int, torch.Tensor, torch.Tensor]] = [None] * sum(
            len(g.layers) for g in self.groups)  # type: ignore[list-item]
        for g, (group, cache) in enumerate(zip(self.groups, self.kv_caches, strict=True)):
            for i, layer in enumerate(group.layers):
                self._layer_views[layer] = (g, cache[i, 0], cache[i, 1])
        self.graphs: CudaGraphRunner | None = None
        if cuda_graphs and max_model_len and backend_is_capturable(backend, device):
            self.graphs = CudaGraphRunner(self._decode_logits, device, shape.block_size,
                                          -(-max_model_len // shape.block_size))

    def _allocate(self, num_layers: int, num_blocks: int, device: torch.device,
                  pin_memory: bool = False) -> torch.Tensor:
        """A pool in the memory order the backend reads best; the host pool matches the
        device pool so that swaps move blocks between like layouts."""
        s = self.shape
        return allocate_kv_cache(num_layers, num_blocks, s.block_size, s.num_kv_heads,
                                 s.head_size, s.dtype, device,
                                 head_major=self.backend.head_major_kv, pin_memory=pin_memory)

    @property
    def kv_pool_bytes(self) -> int:
        return sum(c.numel() * c.element_size() for c in self.kv_caches)

    def apply_block_moves(self, out: SchedulerOutput) -> None:
        """Swap-outs first: the blocks they free may be reused by this step's swap-ins
        and copies."""
        if len(self.groups) == 1:
            self._move_blocks(0, out.swap_out, out.swap_in, out.cow_pairs)
            return
        dev, host = self._device_offsets, self._host_offsets
        swap_out = split_moves(out.swap_out, dev, host)
        swap_in = split_moves(out.swap_in, host, dev, group_of_first=False)
        cow = split_moves(out.cow_pairs, dev, dev)
        for g in range(len(self.groups)):
            self._move_blocks(g, swap_out[g], swap_in[g], cow[g])

    def _move_blocks(self, g: int, swap_out: list[tuple[int, int]],
                     swap_in: list[tuple[int, int]], cow: list[tuple[int, int]]) -> None:
        kv_cache, host_cache = self.kv_caches[g], self.host_caches[g]
        if swap_out:
            dev, host = _pairs(swap_out)
            self.backend.swap_blocks(kv_cache, host_cache, dev, host)
        if swap_in:
            host, dev = _pairs(swap_in)
            self.backend.swap_blocks(host_cache, kv_cache, host, dev)
        if cow:
            src, dst = _pairs(cow)
            self.backend.copy_blocks(kv_cache, src.to(self.device), dst.to(self.device))

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> torch.Tensor | None:
        """Run the step; returns float32 logits for each scheduled sequence whose chunk
        ends at its last token (in ``out.scheduled`` order), or None if there is none."""
        self.apply_block_moves(out)
        if not out.scheduled:
            return None
        input_ids, positions, metas, sample_rows = self.prepare(out)
        if self.graphs is not None and self.graphs.fits(out, len(metas)):
            logits = self.graphs.run(input_ids, positions, metas[0])
            if logits is not None:
                return logits
        if len(metas) == 1:
            hidden = self.model(input_ids, positions, self.kv_cache, metas[0], self.backend)
        else:
            layers = [(k, v, metas[g]) for g, k, v in self._layer_views]
            hidden = self.model(input_ids, positions, layers, metas[0], self.backend)
        if not sample_rows:
            return None
        return self.model.compute_logits(hidden[sample_rows])

    def _decode_logits(self, input_ids: torch.Tensor, positions: torch.Tensor,
                       meta: AttentionMetadata) -> torch.Tensor:
        """One group's step with every row sampled: what a CUDA graph records."""
        hidden = self.model(input_ids, positions, self.kv_cache, meta, self.backend)
        return self.model.compute_logits(hidden)

    def prepare(self, out: SchedulerOutput):
        """Token ids, positions, one AttentionMetadata per KV group (sharing the query
        starts and lengths) and the rows to sample."""
        ids: list[int] = []
        positions: list[int] = []
        starts = [0]
        seq_lens: list[int] = []
        sample_rows: list[int] = []
        for item in out.scheduled:
            seq = item.seq
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + item.num_new_tokens
            ids += seq.token_ids[start:end]
            positions += range(start, end)
            starts.append(starts[-1] + item.num_new_tokens)
            seq_lens.append(end)
            if item.samples:
                sample_rows.append(starts[-1] - 1)
        dev = self.device
        query_start_loc = torch.tensor(starts, dtype=torch.int32, device=dev)
        lens = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
        max_query_len = max(s.num_new_tokens for s in out.scheduled)
        metas = []
        for g, group in enumerate(self.groups):
            tables, slots = self._tables_and_slots(out.scheduled, g, group.window is not None)
            metas.append(AttentionMetadata(
                query_start_loc=query_start_loc,
                seq_lens=lens,
                block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
                slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
                max_query_len=max_query_len,
                max_seq_len=max(seq_lens),
            ))
        input_ids = torch.tensor(ids, dtype=torch.int64, device=dev)
        pos = torch.tensor(positions, dtype=torch.int64, device=dev)
        return input_ids, pos, metas, sample_rows

    def _tables_and_slots(self, scheduled: list[ScheduledSeq], g: int,
                          sliding: bool) -> tuple[list[list[int]], list[int]]:
        """Group g's block tables, padded with block 0, and the slot of each new token.
        A sliding group's released entries (NO_BLOCK, -1) become block 0 too: the
        kernels never read blocks wholly before a window."""
        bs = self.shape.block_size
        slots: list[int] = []
        tables: list[list[int]] = []
        for item in scheduled:
            seq = item.seq
            table = seq.block_tables[g]
            start = seq.num_computed_tokens
            end = start + item.num_new_tokens
            slots += [table[p // bs] * bs + p % bs for p in range(start, end)]
            tables.append([max(b, 0) for b in table] if sliding else table)
        width = max(len(t) for t in tables)
        return [t + [0] * (width - len(t)) for t in tables], slots


def _pairs(pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.tensor(pairs, dtype=torch.int64)
    return t[:, 0].contiguous(), t[:, 1].contiguous()
