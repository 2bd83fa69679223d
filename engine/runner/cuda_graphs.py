"""Decode steps replayed as CUDA graphs.

A decode step launches a few hundred small kernels; at batch 1 on a fast card the CPU
issuing them, not the GPU, sets the pace. A CUDA graph records one step's launches once
and replays them with one call. A graph reads fixed addresses, so each captured batch
size owns nothing but views of one set of static buffers (`StaticInputs`: token ids,
positions, slot mapping, context lengths, query starts and block tables padded to the
widest table a context can have), which every step refills before the replay.

Batches are padded up to the next captured size (`BATCH_SIZES`). A pad row is a
one-token context in block 0 whose K/V write is skipped (slot -1, which every backend's
`write_kv` honours), so it reads a harmless slot and writes nothing. The attention
metadata's `max_seq_len` is frozen at capture too: the graphs take the widest context,
and the decode kernel masks each row at its own length.

A step qualifies (`decode_step_fits`) when every scheduled sequence computes exactly one
token and samples it, the batch fits the largest size, the model has one KV group and
the backend's decode path launches the same kernels whatever the batch holds (Triton
without the shared-prompt cascade, which groups rows on the host). Anything else runs
eagerly, as does everything after a capture fails: one warning, then eager for good.
Each size is captured the first time a step needs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.core.scheduler_output import SchedulerOutput
from kernels import AttentionBackend, AttentionMetadata

log = logging.getLogger(__name__)

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
# Two eager runs before a capture: the first compiles and autotunes the Triton kernels,
# the second settles the allocator so the capture records steady-state allocations.
WARMUP_RUNS = 2

# One decode step: token ids, positions, metadata -> float32 logits of every row.
StepFn = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


def padded_batch_size(num_seqs: int, sizes: tuple[int, ...] = BATCH_SIZES) -> int | None:
    """The smallest captured size holding ``num_seqs`` rows, or None when none does."""
    if num_seqs < 1:
        raise ValueError(f"num_seqs must be >= 1, got {num_seqs}")
    return next((size for size in sizes if size >= num_seqs), None)


def decode_step_fits(out: SchedulerOutput, num_groups: int, max_batch: int) -> bool:
    """Whether this step may replay a graph (see the module doc)."""
    scheduled = out.scheduled
    return (0 < len(scheduled) <= max_batch and num_groups == 1
            and all(item.num_new_tokens == 1 and item.samples for item in scheduled))


def backend_is_capturable(backend: AttentionBackend, device: torch.device) -> bool:
    """The Triton backend on CUDA with the cascade off: its decode launches depend on the
    batch's shapes alone. The other backends read lengths on the host."""
    return (device.type == "cuda" and backend.name == "triton"
            and not getattr(backend, "shared_prefix", False))


@dataclass(slots=True)
class StaticInputs:
    """The buffers every graph reads, sized for the largest batch; rows past a step's
    batch hold pad rows."""

    input_ids: torch.Tensor  # int64 [max_batch]
    positions: torch.Tensor  # int64 [max_batch]
    slot_mapping: torch.Tensor  # int64 [max_batch]
    seq_lens: torch.Tensor  # int32 [max_batch]
    query_start_loc: torch.Tensor  # int32 [max_batch + 1]: 0, 1, 2, ... (one token a row)
    block_tables: torch.Tensor  # int32 [max_batch, max_blocks]

    @classmethod
    def allocate(cls, max_batch: int, max_blocks: int, device: torch.device) -> StaticInputs:
        if max_batch < 1 or max_blocks < 1:
            raise ValueError(f"max_batch and max_blocks must be >= 1, got {max_batch}, "
                             f"{max_blocks}")
        long, i32 = dict(dtype=torch.int64, device=device), dict(dtype=torch.int32,
                                                                 device=device)
        inputs = cls(torch.zeros(max_batch, **long), torch.zeros(max_batch, **long),
                     torch.zeros(max_batch, **long), torch.zeros(max_batch, **i32),
                     torch.arange(max_batch + 1, **i32),
                     torch.zeros(max_batch, max_blocks, **i32))
        inputs.fill_pad_rows(0)
        return inputs

    @property
    def max_batch(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def max_blocks(self) -> int:
        return int(self.block_tables.shape[1])

    def fill(self, input_ids: torch.Tensor, positions: torch.Tensor,
             meta: AttentionMetadata) -> int:
        """Copy one decode step into the first rows, pad the rest; returns the row count.
        A block table wider than the buffer is a ValueError (the step cannot replay)."""
        n, width = meta.block_tables.shape
        if n > self.max_batch or width > self.max_blocks:
            raise ValueError(f"a decode step of {n} rows x {width} blocks does not fit the "
                             f"static buffers ({self.max_batch} x {self.max_blocks})")
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.block_tables[:n, :width].copy_(meta.block_tables)
        # Columns past this step's width: left from older steps, never read (each row
        # reads only the blocks its length covers), so they are not cleared.
        self.fill_pad_rows(n)
        return n

    def fill_pad_rows(self, first: int) -> None:
        self.input_ids[first:] = 0
        self.positions[first:] = 0
        self.slot_mapping[first:] = -1
        self.seq_lens[first:] = 1
        self.block_tables[first:, 0] = 0

    def views(self, batch: int, block_size: int
              ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Token ids, positions and metadata of the first ``batch`` rows: what a graph of
        that size is captured over (and then reads at every replay)."""
        meta = AttentionMetadata(
            query_start_loc=self.query_start_loc[:batch + 1],
            seq_lens=self.seq_lens[:batch],
            block_tables=self.block_tables[:batch],
            slot_mapping=self.slot_mapping[:batch],
            max_query_len=1,
            max_seq_len=self.max_blocks * block_size,
        )
        return self.input_ids[:batch], self.positions[:batch], meta


class CudaGraphRunner:
    """Captures and replays decode steps of one model on one KV pool."""

    def __init__(self, step: StepFn, device: torch.device, block_size: int,
                 max_blocks: int, sizes: tuple[int, ...] = BATCH_SIZES) -> None:
        self.step = step
        self.device = device
        self.block_size = block_size
        self.sizes = tuple(sorted(sizes))
        self.static = StaticInputs.allocate(self.sizes[-1], max_blocks, device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.failed = False
        self._pool = None  # one memory pool shared by every size's graph

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def fits(self, out: SchedulerOutput, num_groups: int) -> bool:
        return not self.failed and decode_step_fits(out, num_groups, self.max_batch)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            meta: AttentionMetadata) -> torch.Tensor | None:
        """The step's logits [rows, vocab] from a replay, or None to run it eagerly (its
        table is wider than the buffers, or the capture failed)."""
        if meta.block_tables.shape[1] > self.static.max_blocks:
            return None
        rows = self.static.fill(input_ids, positions, meta)
        batch = padded_batch_size(rows, self.sizes)
        if batch not in self.graphs and not self._capture(batch):
            return None
        graph, logits = self.graphs[batch]
        graph.replay()
        return logits[:rows]

    def _capture(self, batch: int) -> bool:
        ids, pos, meta = self.static.views(batch, self.block_size)
        try:
            # Warm-up on a side stream, as torch.cuda.graphs asks; the static buffers hold
            # the real step, so these runs write the K/V the replay writes again.
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    self.step(ids, pos, meta)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                logits = self.step(ids, pos, meta)
        except Exception as exc:  # any failure to capture means eager, never a dead engine
            self.failed = True
            log.warning("CUDA graph capture of a %d-row decode step failed (%s: %s); "
                        "decoding eagerly from now on", batch, type(exc).__name__, exc)
            return False
        self._pool = graph.pool()
        self.graphs[batch] = (graph, logits)
        return True
