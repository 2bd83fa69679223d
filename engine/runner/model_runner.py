"""Runs one scheduled step on the model: KV cache tensors, step inputs, forward.

The scheduler decides in blocks and sequences; this module turns that into tensors:
token ids, positions, a slot for each new token's K/V, block tables and context
lengths (``kernels.AttentionMetadata``). Before the forward it applies the step's
swap and copy-on-write lists to the cache.

Each KV group (engine/core/kv_cache_manager.py; a model of one attention kind has one)
has a pool tensor of its own layers, one block longer than its block pool: the last block
is the pool's null block (engine/core/block_pool.py), the entry of an empty or padded
table slot, never written. Each group has its own block tables and slot mapping;
positions, query starts and lengths are shared. The model gets a (k_cache, v_cache,
metadata) per layer.

The disk tier (engine/disk/tier.py) moves blocks through ``block_bytes`` (a cached block
about to be reused, copied out before the step's moves and forward write into it; a
state snapshot too) and ``fill_block`` (a block read from disk, between steps).

A hybrid model's linear-attention layers (a ``linear`` KV group, the last) read and
write the state pool (`state_pool.py`) instead: their group's "blocks" are state slots,
its copy pairs forks and prefix hits resuming from a snapshot, and each of their layers
gets (conv states, recurrent states, `StateMetadata`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from engine.core import mrope
from engine.core.kv_cache_manager import KVGroupSpec
from engine.core.mrope import has_grid
from engine.core.scheduler_output import ScheduledSeq, SchedulerOutput
from engine.core.verify_states import chunk_snapshots
from engine.layers.gated_deltanet import StateMetadata
from engine.runner.cuda_graphs import CudaGraphRunner, backend_is_capturable
from engine.runner.kv_cache import KVShape
from engine.runner.state_pool import StatePool
from kernels import AttentionBackend, AttentionMetadata, allocate_kv_cache
from kernels.key_stage import KeyStage

log = logging.getLogger(__name__)

class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        shape: KVShape,
        kv_groups: Sequence[KVGroupSpec],
        num_blocks: Sequence[int],
        num_host_blocks: int,
        backend: AttentionBackend,
        device: torch.device,
        cuda_graphs: bool = False,
        max_model_len: int | None = None,
        images=None,
        max_num_seqs: int = 64,
    ) -> None:
        """``num_blocks[g]`` allocatable blocks for KV group g (its pool tensor has one
        more, the null block); each group has ``num_host_blocks`` host blocks.
        ``cuda_graphs``: replay decode steps as CUDA graphs where the device and backend
        allow (runner/cuda_graphs.py), their block tables as wide as ``max_model_len``
        needs. ``images``: a vision model's ``engine.vision.inputs.ImageInputs``, whose
        rows replace the image tokens' embeddings in a prefill. An int8 or int4 pool gets a
        `KeyStage` (kernels/key_stage.py) of ``max_num_seqs`` slots, attached to the
        backend: a step leaves at most one block of each of its sequences open."""
        if len(num_blocks) != len(kv_groups):
            raise ValueError("ModelRunner takes a block count per KV group")
        self.model = model
        self.images = images
        self.shape = shape
        self.backend = backend
        self.device = device
        self.kv_groups = list(kv_groups)
        # The null block's id in each group: its last block.
        self.null_ids = list(num_blocks)
        attention = [(g, n) for g, n in zip(self.kv_groups, num_blocks, strict=True)
                     if not g.linear]
        self.kv_caches = [self._allocate(g.layers, n + 1, device) for g, n in attention]
        # Per group pool: the exact keys of its open blocks where the format needs them.
        self.key_stages: list[KeyStage | None] = [
            KeyStage(cache, max_num_seqs) if shape.format.keys_by_block else None
            for cache in self.kv_caches]
        self.attach_key_stages(backend)
        self.host_caches: list[torch.Tensor | None] = [None] * len(attention)
        if num_host_blocks:
            self.host_caches = [self._allocate(g.layers, num_host_blocks,
                                               torch.device("cpu"),
                                               pin_memory=device.type == "cuda")
                                for g, _ in attention]
        # Per layer: its group and its K and V views in the group's pool (a linear
        # layer's conv and recurrent states).
        self._layer_views: list[tuple[int, torch.Tensor, torch.Tensor]] = [None] * sum(
            len(g.layers) for g in self.kv_groups)  # type: ignore[list-item]
        for g, (group, cache) in enumerate(zip(self.kv_groups[:len(attention)], self.kv_caches,
                                               strict=True)):
            for i, layer in enumerate(group.layers):
                self._layer_views[layer] = (g, cache[i, 0], cache[i, 1])
        self.states: StatePool | None = None
        self.state_group: int | None = None
        if len(attention) < len(self.kv_groups):
            g = self.state_group = len(attention)
            group, slots = self.kv_groups[g], num_blocks[g]
            self.states = StatePool(model.deltanet_shape, len(group.layers), slots,
                                    slots if num_host_blocks else 0, model.dtype, device)
            for i, layer in enumerate(group.layers):
                self._layer_views[layer] = (g, *self.states.layer(i))
        # Called with (out, final-norm hidden states [T, hidden]) after each eager forward:
        # an MTP head's proposer (engine/spec/mtp.py) keeps the rows it will read. A step
        # whose hidden states are wanted is never replayed from a CUDA graph.
        self.hidden_sink: Callable[[SchedulerOutput, torch.Tensor], None] | None = None
        self.graphs: CudaGraphRunner | None = None
        # An int8 or int4 pool's key writes are planned on the host from each step's slots
        # (kernels/key_stage.py), which a replayed graph would skip: they run eagerly.
        if (cuda_graphs and max_model_len and backend_is_capturable(backend, device)
                and not shape.format.keys_by_block):
            self.graphs = CudaGraphRunner(self._decode_logits, device, shape.block_size,
                                          -(-max_model_len // shape.block_size))

    def attach_key_stages(self, backend) -> None:
        """Hand ``backend`` this runner's key stages (an int8 or int4 pool's keys are
        written through them): the runner's own backend, or one that runs a step in its
        place."""
        for stage in self.key_stages:
            if stage is not None:
                backend.key_stages.attach(stage)

    def _allocate(self, layers: Sequence[int], num_blocks: int, device: torch.device,
                  pin_memory: bool = False) -> torch.Tensor:
        """A group's pool in the memory order the backend reads best; the host pool
        matches the device pool so that swaps move blocks between like layouts. A
        group's layers share one head shape (a group is one attention kind)."""
        s = self.shape
        heads = {s.heads(layer) for layer in layers}
        if len(heads) != 1:
            raise ValueError(f"the KV layers {list(layers)} of one group have different "
                             f"head shapes {sorted(heads)}")
        [(num_kv_heads, head_size)] = heads
        return allocate_kv_cache(len(layers), num_blocks, s.block_size, num_kv_heads,
                                 head_size, s.dtype, device,
                                 head_major=self.backend.head_major_kv, pin_memory=pin_memory)

    @property
    def kv_pool_bytes(self) -> int:
        return sum(c.numel() * c.element_size() for c in self.kv_caches)

    @property
    def state_pool_bytes(self) -> int:
        """The linear-attention state pool (0 without linear layers)."""
        return 0 if self.states is None else self.states.nbytes

    def apply_block_moves(self, out: SchedulerOutput) -> None:
        """Each group's moves, swap-outs first: the blocks they free may be reused by
        this step's swap-ins and copies."""
        for g in range(len(self.kv_groups)):
            moves = _group(out.swap_out, g), _group(out.swap_in, g), _group(out.cow_pairs, g)
            if g == self.state_group:
                assert self.states is not None
                self.states.move(*moves)
            else:
                self._move_blocks(g, *moves)

    def _block_views(self, g: int, block_id: int) -> list[torch.Tensor]:
        """The tensors of block ``block_id`` of group g across its layers: K/V, or a
        state slot's conv window and recurrent state."""
        if g == self.state_group:
            assert self.states is not None
            return [self.states.conv[:, block_id], self.states.rec[:, block_id]]
        return [self.kv_caches[g][:, :, block_id]]

    def block_payload_bytes(self, g: int) -> int:
        """Bytes of one block of group g across its layers (a disk file's payload)."""
        return sum(t.numel() * t.element_size() for t in self._block_views(g, 0))

    def block_bytes(self, g: int, block_id: int) -> bytes:
        """Block ``block_id`` of group g across its layers, as a disk file's payload."""
        return b"".join(t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
                        for t in self._block_views(g, block_id))

    def fill_block(self, g: int, block_id: int, payload: bytes) -> None:
        """Copy a block read from disk (``block_bytes``' layout) into group g's pool."""
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        offset = 0
        for target in self._block_views(g, block_id):
            size = target.numel() * target.element_size()
            part = data[offset:offset + size].view(target.dtype).view(target.shape)
            target.copy_(part)
            offset += size
        if g < len(self.key_stages) and self.key_stages[g] is not None:
            self.key_stages[g].forget([block_id])

    def _move_blocks(self, g: int, swap_out: list[tuple[int, int]],
                     swap_in: list[tuple[int, int]], cow: list[tuple[int, int]]) -> None:
        kv_cache, host_cache = self.kv_caches[g], self.host_caches[g]
        stage = self.key_stages[g]
        if swap_out:
            dev, host = _pairs(swap_out)
            self.backend.swap_blocks(kv_cache, host_cache, dev, host)
            if stage is not None:
                stage.move(dev.tolist(), host.tolist(), to_host=True)
        if swap_in:
            host, dev = _pairs(swap_in)
            self.backend.swap_blocks(host_cache, kv_cache, host, dev)
            if stage is not None:
                stage.move(host.tolist(), dev.tolist(), to_host=False)
        if cow:
            src, dst = _pairs(cow)
            self.backend.copy_blocks(kv_cache, src.to(self.device), dst.to(self.device))
            if stage is not None:
                stage.copy(src.tolist(), dst.tolist())

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> torch.Tensor | None:
        """Run the step; returns float32 logits for each scheduled sequence whose chunk
        ends at its last token (in ``out.scheduled`` order; a sequence with drafts has a
        row for its last token then one per draft), or None if there is none."""
        self.apply_block_moves(out)
        if not out.scheduled:
            return None
        input_ids, positions, metas, sample_rows = self.prepare(out)
        if self.graphs is not None and self.hidden_sink is None and positions.dim() == 1 \
                and self.graphs.fits(out, len(metas)):
            logits = self.graphs.run(input_ids, positions, metas[0])
            if logits is not None:
                return logits
        layers = [(k, v, metas[g]) for g, k, v in self._layer_views]
        embeds = self.images.rows(out.scheduled) if self.images is not None else None
        extra = {} if embeds is None else {"image_embeds": embeds}
        hidden = self.model(input_ids, positions, layers, metas[0], self.backend, **extra)
        if self.hidden_sink is not None:
            self.hidden_sink(out, hidden)
        if not sample_rows:
            return None
        return self.model.compute_logits(hidden[sample_rows])

    def _decode_logits(self, input_ids: torch.Tensor, positions: torch.Tensor,
                       meta: AttentionMetadata) -> torch.Tensor:
        """One group's step with every row sampled: what a CUDA graph records."""
        layers = [(k, v, meta) for _, k, v in self._layer_views]
        hidden = self.model(input_ids, positions, layers, meta, self.backend)
        return self.model.compute_logits(hidden)

    def prepare(self, out: SchedulerOutput):
        """Token ids, positions, one AttentionMetadata per KV group (sharing the query
        starts and lengths) and the rows to sample."""
        ids: list[int] = []
        positions: list = []  # per sequence: a range, a list or (time, height, width)
        starts = [0]
        seq_lens: list[int] = []
        sample_rows: list[int] = []
        for item in out.scheduled:
            seq = item.seq
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + item.num_new_tokens
            ids += seq.token_ids[start:end]
            if item.num_drafts:
                ids += seq.draft_token_ids[:item.num_drafts]
            # M-RoPE (engine/core/mrope.py): a sequence with gridded images takes shifted
            # positions after an image and 3-D ones on it.
            positions.append(mrope.positions(seq.images, start, end)
                             if seq.images and has_grid(seq.images) else range(start, end))
            starts.append(starts[-1] + item.num_new_tokens)
            seq_lens.append(end)
            # The last token's row, and each draft's (engine/spec verifies them).
            sample_rows += range(starts[-1] - item.num_sampled_rows, starts[-1])
        dev = self.device
        query_start_loc = torch.tensor(starts, dtype=torch.int32, device=dev)
        lens = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
        max_query_len = max(s.num_new_tokens for s in out.scheduled)
        # An image's tokens that attend to each other both ways: their rows' key limits,
        # shared by every group (Gemma 3) or by the sliding-window groups (Gemma 4).
        vision = self.images.vision if self.images is not None else None
        # Only a bidirectional family's spans have runs: the others skip the walk.
        ends = (self.images.key_ends(out.scheduled)
                if vision is not None and vision.bidirectional else None)
        key_ends = None if ends is None else torch.tensor(ends, dtype=torch.int32, device=dev)
        windows_only = vision is not None and vision.bidirectional_in_windows
        metas: list = []
        for g in range(len(self.kv_groups)):
            if g == self.state_group:
                metas.append(self._state_metadata(out.scheduled, starts, g))
                continue
            tables, slots = self._tables_and_slots(out.scheduled, g)
            metas.append(AttentionMetadata(
                query_start_loc=query_start_loc,
                seq_lens=lens,
                block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
                slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
                max_query_len=max_query_len,
                max_seq_len=max(seq_lens),
                key_ends=None if windows_only and self.kv_groups[g].window is None
                else key_ends,
            ))
        input_ids = torch.tensor(ids, dtype=torch.int64, device=dev)
        return input_ids, _position_tensor(positions, dev), metas, sample_rows

    def _state_metadata(self, scheduled: list[ScheduledSeq], starts: list[int],
                        g: int) -> StateMetadata:
        """Each sequence's running state slot, whether its chunk continues it, and the
        states its chunk keeps (`chunk_snapshots`)."""
        bs = self.shape.block_size
        null = self.null_ids[g]
        slots, resumes, snapshots = [], [], []
        for item in scheduled:
            seq = item.seq
            table = item.block_tables[g]
            start = seq.num_computed_tokens
            end = start + item.num_new_tokens
            slots.append(table[0])
            resumes.append(start > 0)
            snapshots.append(chunk_snapshots(table, start, end, bs, null,
                                             item.draft_state_slots))
        return StateMetadata(starts, slots, resumes, snapshots)

    def _tables_and_slots(self, scheduled: list[ScheduledSeq],
                          g: int) -> tuple[list[list[int]], list[int]]:
        """Group g's block tables, padded with its null block, and the slot of each new
        token (never in the null block: tokens are written into blocks the sequence
        holds)."""
        bs = self.shape.block_size
        null = self.null_ids[g]
        slots: list[int] = []
        tables: list[list[int]] = []
        for item in scheduled:
            seq = item.seq
            table = item.block_tables[g]
            start = seq.num_computed_tokens
            end = start + item.num_new_tokens
            slots += [table[p // bs] * bs + p % bs for p in range(start, end)]
            tables.append(table)
        width = max(len(t) for t in tables)
        return [t + [null] * (width - len(t)) for t in tables], slots


def _position_tensor(positions: list, device: torch.device) -> torch.Tensor:
    """A step's positions int64 [T], or [3, T] (time, height, width) when a sequence's
    tokens in it include image tokens of an M-RoPE model."""
    if not any(isinstance(p, tuple) for p in positions):
        return torch.tensor([i for p in positions for i in p], dtype=torch.int64,
                            device=device)
    axes: list[list[int]] = [[], [], []]
    for p in positions:
        for axis, values in zip(axes, p if isinstance(p, tuple) else (p, p, p), strict=True):
            axis += values
    return torch.tensor(axes, dtype=torch.int64, device=device)


def _group(moves: list[list[tuple[int, int]]], g: int) -> list[tuple[int, int]]:
    """Group g's pairs of a step's moves (a step built by hand may list no group)."""
    return moves[g] if g < len(moves) else []


def _pairs(pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.tensor(pairs, dtype=torch.int64)
    return t[:, 0].contiguous(), t[:, 1].contiguous()
