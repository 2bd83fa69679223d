"""One KV group's traffic with the tier below memory (the disk): which evicted blocks to
save, which free blocks were taken for blocks found there, which were loaded ahead.

Pure bookkeeping (no torch, no files). The tier itself is a `LowerTier`, which only says
whether it has a block; reading and writing it is engine/disk's. A group's `TierBlocks`
is made with its pool and given to the pool as its eviction hook (`BlockPool`'s
``tier``) and to its manager, which looks up and places hits through it:

- a cached block the pool evicts for reuse is queued to be saved first
  (``take_saves``: the engine copies it out before the step writes into it), unless the
  tier has it already or it is a partial block (the tier keeps full blocks only);
- a prefix block missing in memory but found below (`TierHit`) is placed in a free
  block (``place``: the KV cache manager queues its read, engine/core/disk_loads.py; the
  block is registered once its content is in), kept out of the prefix cache meanwhile;
- a block loaded ahead of a request (a chat opened) and not used yet is ``preloaded``:
  the first request that uses it counts it as loaded from disk.

Without a tier below (``lower`` None) nothing is ever found, placed or saved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from engine.core.free_block_queue import Block

if TYPE_CHECKING:
    from engine.core.block_pool import BlockPool

# (block id, block hash, tokens) of a block to save a tier below before it is reused.
Save = tuple[int, bytes, tuple[int, ...]]


class LowerTier(Protocol):
    """Where full blocks go when they leave memory (one KV group's view of the disk)."""

    def has(self, block_hash: bytes) -> bool: ...


@dataclass(slots=True, eq=False)
class TierHit:
    """A prefix block found a tier below (its file exists; it is checked when read)."""

    block_hash: bytes
    token_ids: tuple[int, ...]


class TierBlocks:
    def __init__(self, lower: LowerTier | None, block_size: int) -> None:
        self.lower = lower
        self.block_size = block_size
        self.pending_saves: list[Save] = []
        self.placed: list[tuple[int, TierHit]] = []  # blocks taken for hits, unread
        # Blocks loaded from below ahead of a request, not yet used by one.
        self.preloaded: set[int] = set()

    # ------------------------------------------------- the pool's eviction hook
    def evicting(self, block: Block) -> None:
        """``block`` leaves the prefix cache to be reused; its hash and tokens are still
        in it."""
        self.preloaded.discard(block.block_id)
        tokens = block.token_ids
        if (self.lower is not None and not self._partial(tokens)
                and not self.lower.has(block.block_hash)):
            self.pending_saves.append((block.block_id, block.block_hash, tokens or ()))

    def _partial(self, tokens: tuple[int, ...] | None) -> bool:
        return tokens is not None and len(tokens) < self.block_size

    # ----------------------------------------------------------------- lookups
    def hit(self, block_hash: bytes, token_ids: tuple[int, ...]) -> TierHit | None:
        if self.lower is None or not self.lower.has(block_hash):
            return None
        return TierHit(block_hash, token_ids)

    def place(self, pool: BlockPool, hit: TierHit) -> Block:
        """A free block of ``pool`` for ``hit``, to be read into (``placed``); not in the
        prefix cache until its content is in, so nothing else can hit on it meanwhile."""
        block = pool.take()
        self.placed.append((block.block_id, hit))
        return block

    def take_placed(self) -> list[tuple[int, TierHit]]:
        placed, self.placed = self.placed, []
        return placed

    # ------------------------------------------------------------------- saves
    def take_saves(self) -> list[Save]:
        saves, self.pending_saves = self.pending_saves, []
        return saves

    def unsaved(self, pool: BlockPool) -> list[Save]:
        """Every cached block of ``pool`` the tier below lacks (saved when the model
        unloads)."""
        lower = self.lower
        if lower is None:
            return []
        return [(b.block_id, h, b.token_ids or ()) for h, b in pool.cached.items()
                if not self._partial(b.token_ids) and not lower.has(h)]
