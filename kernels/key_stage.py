"""The exact keys of an int8 or int4 pool's open blocks, and the key writes made from them.

An int4 pool quantizes each key channel over its block's tokens (kernels/kv_key_channels.py)
and an int8 pool its key rows around the block's channel centers (kernels/kv_key_centers.py),
so a write re-encodes the blocks it touches from all their rows. Re-encoding from the
pool's decoded rows would compound each write's rounding over a block's writes (int4 on
the starter: a teacher-forced KL of 0.23 nats against 0.017 from exact keys,
docs/BENCHMARKS.md), so `KeyStage` keeps, per pool, the rotated keys of each open block
(one written in part) in float16 slots beside the pool: a block's slot holds its rows
until it fills, and is then free. A block whose slot was evicted (more open blocks than
slots: the least recently written goes first) or forgotten starts its next write again
from its decoded rows, which costs some accuracy, never correctness. So the engine tells
the stage of every block whose rows change outside a write (`copy` for copy-on-write,
`move` for swaps, `forget` for disk reads): a slot kept for rows that changed would be
read as theirs.

A step's writes are planned once (`KeyStage.plan`, from the slot mapping every layer
gets) and then carried out per layer (`write_keys`); each backend's `write_kv` writes the
value rows and hands the keys to `KeyStages.write`, which finds the stage that owns the
layer's pool view.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels.kv_format import format_of

__all__ = ["BlockEncoder", "KeyStage", "KeyStages", "KeyWriter", "StagePlan",
           "encode_blocks", "write_keys"]

# From the block's earlier rows (StagePlan.carry): none (its first written row is its
# first), or its decoded pool rows (no slot holds them).
NO_ROWS, POOL_ROWS = -1, -2

# (exact keys [B, bs, nkv, hd] rotated, rows filled [B], k_cache, block ids [B]): the
# blocks' key rows written into k_cache, as the pool format's encode_key_block encodes them.
BlockEncoder = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


def encode_blocks(rows: torch.Tensor, filled: torch.Tensor, k_cache: torch.Tensor,
                  blocks: torch.Tensor) -> None:
    """The PyTorch `BlockEncoder`."""
    encoded = format_of(k_cache).encode_key_block(rows, filled)
    k_cache.view(torch.uint8).index_copy_(0, blocks, encoded)


@dataclass(slots=True)
class StagePlan:
    """One step's key writes, the same for every layer of a pool. Blocks are the step's
    written blocks in order; each one's rows before its first written row come from its
    slot (``from_slot``) or its decoded rows (``from_pool``)."""

    slot_mapping: torch.Tensor  # the step's, kept so that its identity marks the plan
    tokens: torch.Tensor  # int64 [T'] the tokens that have a slot
    blocks: torch.Tensor  # int64 [B]
    filled: torch.Tensor  # int64 [B] rows each block holds after the write
    dest: torch.Tensor  # int64 [T'] each token's row in the step's [B * bs] rows
    # Gathers of the per-block fields below, for a writer that indexes blocks in bulk
    # (PyTorch's): the blocks whose earlier rows a slot holds and those slots, the blocks
    # decoded from the pool, the blocks left open and their slots.
    from_slot: tuple[torch.Tensor, torch.Tensor]  # (block index [n], slot [n])
    from_pool: torch.Tensor  # block index [n]
    keep: tuple[torch.Tensor, torch.Tensor]  # (block index [n], slot [n])
    carry: torch.Tensor  # int64 [B]: the slot of its earlier rows, NO_ROWS or POOL_ROWS
    keep_slot: torch.Tensor  # int64 [B]: the slot its rows go to, -1 once it is full


# (a layer's slots [slots, bs, nkv, hd] float16, key [T, nkv, hd] as the model computed
# it, the layer's k_cache [num_blocks, bs, nkv, row], the step's plan): `write_keys`.
KeyWriter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, StagePlan], None]


def write_keys(exact: torch.Tensor, key: torch.Tensor, k_cache: torch.Tensor,
               plan: StagePlan, encode: BlockEncoder = encode_blocks) -> None:
    """The PyTorch `KeyWriter`: each written block's rows gathered (earlier rows from
    the slots ``exact`` or the pool, the new keys rotated and rounded to float16), the
    blocks encoded by ``encode``, the open ones' rows kept in their slots."""
    fmt = format_of(k_cache)
    num_blocks, bs, nkv, hd = plan.blocks.shape[0], *exact.shape[1:]
    rows = torch.empty(num_blocks, bs, nkv, hd, dtype=torch.float32, device=k_cache.device)
    index, slots = plan.from_slot
    if index.numel():
        rows[index] = exact[slots].float()
    if plan.from_pool.numel():
        blocks = plan.blocks[plan.from_pool]
        rows[plan.from_pool] = fmt.decode_keys(k_cache.index_select(0, blocks))
    # float16 as the slots keep them, so that a block encodes to the same bytes
    # whether its rows came in one write or over many.
    new = fmt.rotate(key.index_select(0, plan.tokens).float()).half().float()
    rows.view(-1, nkv, hd)[plan.dest] = new
    encode(rows, plan.filled, k_cache, plan.blocks)
    index, slots = plan.keep
    if index.numel():
        exact[slots] = rows[index].half()


class KeyStage:
    """Slots of exact keys for one pool whose keys are encoded by block (int8, int4)
    [num_layers, 2, num_blocks, bs, nkv, row]."""

    def __init__(self, pool: torch.Tensor, slots: int) -> None:
        fmt = format_of(pool)
        if not fmt.keys_by_block:
            raise ValueError(f"a {fmt.name} pool keeps its keys as rows: it needs no stage")
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        layers, _, _, self.block_size, nkv, row = pool.shape
        self.head_size = fmt.head_size(row)
        self.pool = pool
        # Never read before written (a slot's rows are written before they are carried),
        # so empty: on the CPU its pages cost memory only once used.
        self.exact = torch.empty(layers, slots, self.block_size, nkv, self.head_size,
                                 dtype=torch.float16, device=pool.device)
        self._slot: dict[int, int] = {}  # open block -> its slot
        self._rows: dict[int, int] = {}  # open block -> rows its slot holds; oldest write first
        self._free = list(range(slots - 1, -1, -1))
        self._plan: StagePlan | None = None

    def held(self) -> dict[int, tuple[int, int]]:
        """Open block -> (its slot, rows held), least recently written first."""
        return {b: (self._slot[b], n) for b, n in self._rows.items()}

    def plan(self, slot_mapping: torch.Tensor) -> StagePlan:
        """The step's plan: made for the first layer that writes with this slot mapping,
        its bookkeeping (slots taken, freed, rows held) done then, and reused by the
        rest."""
        if self._plan is not None and self._plan.slot_mapping is slot_mapping:
            return self._plan
        bs = self.block_size
        tokens, dest, blocks, first, last = [], [], [], [], []
        touched: set[int] = set()
        for t, slot in enumerate(slot_mapping.tolist()):
            if slot < 0:
                continue
            block, offset = divmod(slot, bs)
            if not blocks or blocks[-1] != block or last[-1] != offset - 1:
                if block in touched:
                    raise ValueError(f"slot_mapping writes block {block} in two runs; a "
                                     f"step writes each block's rows in one run, in order")
                touched.add(block)
                blocks.append(block)
                first.append(offset)
                last.append(offset)
            last[-1] = offset
            tokens.append(t)
            dest.append((len(blocks) - 1) * bs + offset)
        carry, keep_slot = [NO_ROWS] * len(blocks), [-1] * len(blocks)
        for i, (block, start, end) in enumerate(zip(blocks, first, last, strict=True)):
            if start > 0:
                # The slot's first rows are this block's while it holds at least those: a
                # rewound sequence (rejected drafts) or a partial block copied for a
                # prompt sharing only its first tokens writes again from inside them.
                held = self._rows.get(block, 0) >= start
                carry[i] = self._slot[block] if held else POOL_ROWS
            if end + 1 < bs:
                keep_slot[i] = self._take(block, touched)
                self._rows.pop(block, None)
                self._rows[block] = end + 1
            else:
                self._release(block)
        device = self.pool.device

        def ids(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        from_slot = [i for i, c in enumerate(carry) if c >= 0]
        kept = [i for i, s in enumerate(keep_slot) if s >= 0]
        self._plan = StagePlan(slot_mapping, ids(tokens), ids(blocks),
                               ids([e + 1 for e in last]), ids(dest),
                               (ids(from_slot), ids([carry[i] for i in from_slot])),
                               ids([i for i, c in enumerate(carry) if c == POOL_ROWS]),
                               (ids(kept), ids([keep_slot[i] for i in kept])),
                               ids(carry), ids(keep_slot))
        return self._plan

    def write_keys(self, layer: int, key: torch.Tensor, k_cache: torch.Tensor,
                   plan: StagePlan, writer: KeyWriter = write_keys) -> None:
        """key [T, nkv, hd] (as the model computed it; rotated in the writing) into layer
        ``layer``'s key rows ``k_cache`` [num_blocks, bs, nkv, row] by ``writer``."""
        if plan.blocks.numel():
            writer(self.exact[layer], key, k_cache, plan)

    def copy(self, src: list[int], dst: list[int]) -> None:
        """Blocks ``dst`` now hold copies of blocks ``src`` (copy-on-write)."""
        for s, d in zip(src, dst, strict=True):
            if s in self._rows:
                slot = self._take(d, {s})
                self.exact[:, slot] = self.exact[:, self._slot[s]]
                self._rows.pop(d, None)
                self._rows[d] = self._rows[s]
            else:
                self._release(d)
        self._plan = None

    def move(self, src: list[int], dst: list[int], to_host: bool) -> None:
        """Blocks ``src`` moved to ``dst`` by a swap: to the host pool (``to_host``) or back
        from it. An open block's slot follows it, so that a sequence swapped out and in
        again writes the bytes it would have written unpreempted."""
        renamed = [(s, _host(d)) if to_host else (_host(s), d) for s, d in zip(src, dst,
                                                                              strict=True)]
        for old, new in renamed:
            self._release(new)
            if old in self._rows:
                self._slot[new] = self._slot.pop(old)
                self._rows[new] = self._rows.pop(old)
        self._plan = None

    def forget(self, blocks: list[int]) -> None:
        """Blocks whose rows changed outside a write (swapped in, read from disk)."""
        for block in blocks:
            self._release(block)
        self._plan = None

    def _take(self, block: int, keep: set[int]) -> int:
        """Block's slot: its own, a free one, or the least recently written block's
        outside ``keep``."""
        slot = self._slot.get(block)
        if slot is not None:
            return slot
        if not self._free:
            victim = next((b for b in self._rows if b not in keep), None)
            if victim is None:
                raise RuntimeError(f"{len(self._slot)} key stage slots cannot hold a step "
                                   f"that leaves more blocks open")
            self._release(victim)
        slot = self._slot[block] = self._free.pop()
        return slot

    def _release(self, block: int) -> None:
        slot = self._slot.pop(block, None)
        self._rows.pop(block, None)
        if slot is not None:
            self._free.append(slot)


def _host(block: int) -> int:
    """A host pool block's key among the device blocks' (which are >= 0)."""
    return -1 - block


class KeyStages:
    """A backend's stages by the key views of their pools' layers: what `write_kv`
    hands the keys of a pool encoded by block to, and the backend's `KeyWriter`."""

    def __init__(self, writer: KeyWriter = write_keys) -> None:
        self._by_view: dict[int, tuple[KeyStage, int]] = {}
        self.writer = writer

    def attach(self, stage: KeyStage) -> None:
        for layer in range(stage.pool.shape[0]):
            self._by_view[stage.pool[layer, 0].data_ptr()] = (stage, layer)

    def find(self, k_cache: torch.Tensor) -> tuple[KeyStage, int]:
        """The stage of a pool's layer key view, and the layer: for a caller that
        writes the keys itself (the native decoder layer, engine/layers/native_layer.py)."""
        entry = self._by_view.get(k_cache.data_ptr())
        if entry is None:
            raise ValueError("an int8 or int4 pool's keys are written through the KeyStage "
                             "of its pool (kernels/key_stage.py): attach one to the "
                             "backend's key_stages")
        return entry

    def write(self, key: torch.Tensor, k_cache: torch.Tensor,
              slot_mapping: torch.Tensor) -> None:
        """A pool's keys encoded by block, through the stage of its pool."""
        stage, layer = self.find(k_cache)
        stage.write_keys(layer, key, k_cache, stage.plan(slot_mapping), self.writer)
