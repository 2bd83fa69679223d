"""Runs one scheduled step on the model: KV cache tensors, step inputs, forward.

The scheduler decides in blocks and sequences; this module turns that into tensors:
token ids, positions, a slot for each new token's K/V, block tables and context
lengths (``kernels.AttentionMetadata``). Before the forward it applies the step's
swap and copy-on-write lists to the cache.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.core.scheduler import SchedulerOutput
from engine.models.spec import kv_bytes_per_token
from kernels import AttentionBackend, AttentionMetadata, allocate_kv_cache

log = logging.getLogger(__name__)

CPU_DEFAULT_KV_BYTES = 1 << 30  # 1 GiB: ~23k tokens of the starter model in fp32
# With the default CPU budget, a small model needs no more than this many full contexts.
CPU_DEFAULT_MAX_CONTEXTS = 8


@dataclass(slots=True, frozen=True)
class KVShape:
    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int
    dtype: torch.dtype

    @classmethod
    def from_spec(cls, spec, block_size: int, dtype: torch.dtype) -> KVShape:
        """From the model's DecoderSpec, which already resolved the config's head sizes."""
        return cls(spec.num_layers, spec.num_kv_heads, spec.head_dim, block_size, dtype)

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_size,
                                  self.dtype.itemsize)

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size


def num_blocks_for(
    config: EngineConfig, shape: KVShape, device: torch.device, max_model_len: int
) -> int:
    """The KV pool size: an explicit block count, a byte budget, or (CUDA) a share of
    the memory still free once the weights are loaded. The CPU default budget is capped
    at a few full contexts, so a small model does not reserve a gigabyte it never uses."""
    if config.num_gpu_blocks is not None:
        return config.num_gpu_blocks
    budget = config.kv_cache_memory_bytes
    if budget is None and device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        in_use = total - free
        budget = int(total * config.gpu_memory_utilization) - in_use
    capped = budget is None
    if budget is None:
        budget = CPU_DEFAULT_KV_BYTES
    num_blocks = budget // shape.bytes_per_block
    if capped:
        num_blocks = min(num_blocks, -(-CPU_DEFAULT_MAX_CONTEXTS * max_model_len
                                       // shape.block_size))
    if num_blocks < 1:
        raise ValueError(
            f"kv_cache_memory_bytes: {budget} bytes hold no KV block of "
            f"{shape.bytes_per_block} bytes; give the KV cache more memory"
        )
    return int(num_blocks)


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
