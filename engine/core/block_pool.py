"""The block pool of one KV group: block ids, ref counts, the free queue, the prefix-cache
map and the host pool for swaps (vLLM's BlockPool, plus the host pool).

Pure bookkeeping (no torch). Which blocks a sequence holds is a manager's business
(`kind_managers.py`); the pool only hands blocks out, takes them back and remembers what a
free block still holds:

    blocks 0 .. num_blocks - 1   allocatable; each free one is in the LRU free queue
    null block (id num_blocks)   an empty table entry (a block released out of a window,
                                 a table's padding); never queued, never owned, never
                                 written, so whatever a kernel reads there is harmless

A full, computed block carries ``block_hash`` (a chain: the parent's hash and its tokens)
and the tokens behind it; freed, it stays in ``cached`` until popped for reuse. So does a
sequence's last, partial block once it leaves (`partial_blocks.py`), under a key of its
own. Both are also indexed by the hash of the block before them (``children``), so that
a prompt sharing only the first tokens of a cached block finds it (`partial_blocks.py`).
The tier below memory (the disk) hears of each cached block popped for reuse through the
``tier`` given at construction (`EvictionHook`; `tier_blocks.py` keeps what it implies),
before the block forgets its content.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from engine.core.free_block_queue import Block, FreeBlockQueue


class EvictionHook(Protocol):
    """Told of each cached block the pool evicts, with its content still named in it."""

    def evicting(self, block: Block) -> None: ...


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, num_host_blocks: int = 0,
                 enable_prefix_caching: bool = True, bytes_per_block: int = 0,
                 tier: EvictionHook | None = None) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if num_host_blocks < 0:
            raise ValueError(f"num_host_blocks must be >= 0, got {num_host_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.bytes_per_block = bytes_per_block
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.null_block = Block(num_blocks)
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[bytes, Block] = {}
        # Cached blocks by the hash before them (b"": a first block), by block id.
        self.children: dict[bytes, dict[int, Block]] = {}
        self.tier = tier
        # Cached partial blocks held for a copy into a new sequence's block, released
        # once the copy pairs are drained (engine/core/partial_blocks.py).
        self.copy_sources: list[int] = []
        # Host pool for swap preemption: host block id -> ref count; no prefix cache there.
        self.num_host_blocks = num_host_blocks
        self.host_free: list[int] = list(range(num_host_blocks - 1, -1, -1))
        self.host_refs: dict[int, int] = {}

    @property
    def null_id(self) -> int:
        return self.null_block.block_id

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    # ------------------------------------------------------------------ device
    def take(self) -> Block:
        """The least recently freed block, ref count 1; a cached prefix in it is evicted
        now (lazily: only when the block is needed)."""
        block = self.free_queue.popleft()
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
                if self.tier is not None:
                    self.tier.evicting(block)
            if block.after is not None:
                siblings = self.children[block.after]
                del siblings[block.block_id]
                if not siblings:
                    del self.children[block.after]
            block.block_hash = None
            block.token_ids = None
            block.after = None
            block.images = ()
        block.ref_count = 1
        return block

    def touch(self, block: Block) -> None:
        """One more holder of ``block`` (a prefix hit revives a free one)."""
        if block.ref_count == 0:
            self.free_queue.remove(block)
        block.ref_count += 1

    def release(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block, in this order. Blocks reaching zero with a
        cached prefix go to the queue's tail (evicted last), the others to its head."""
        null = self.null_block.block_id
        for block_id in block_ids:
            if block_id == null:
                continue
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count < 0:
                raise RuntimeError(f"block {block_id} freed twice")
            if block.ref_count == 0:
                if block.block_hash is None:
                    self.free_queue.appendleft(block)
                else:
                    self.free_queue.append(block)

    # ------------------------------------------------------------ prefix cache
    def lookup(self, block_hash: bytes, token_ids: tuple[int, ...]) -> Block | None:
        """The cached block with this hash and these tokens (checked: a hash is no proof)."""
        block = self.cached.get(block_hash)
        return block if block is not None and block.token_ids == token_ids else None

    def register(self, block: Block, block_hash: bytes, token_ids: tuple[int, ...]) -> bool:
        """Cache a full, computed block; False when the content lives in another block."""
        if block_hash in self.cached:
            return False
        block.block_hash = block_hash
        block.token_ids = token_ids
        self.cached[block_hash] = block
        return True

    def index_child(self, block: Block, parent: bytes | None,
                    images: tuple[tuple[int, int, bytes], ...]) -> None:
        """List a block just registered under the hash before it (None: a first block),
        with the images its tokens hold part of (offsets within the block)."""
        block.after = parent or b""
        block.images = images
        self.children.setdefault(block.after, {})[block.block_id] = block

    def is_partial(self, block: Block) -> bool:
        """A cached block of fewer than block_size tokens (a sequence's last)."""
        return block.token_ids is not None and len(block.token_ids) < self.block_size

    # -------------------------------------------------------------------- host
    def take_host(self) -> int:
        host_id = self.host_free.pop()
        self.host_refs[host_id] = 1
        return host_id

    def hold_host(self, host_id: int) -> None:
        self.host_refs[host_id] += 1

    def release_host(self, host_id: int) -> None:
        self.host_refs[host_id] -= 1
        if self.host_refs[host_id] == 0:
            del self.host_refs[host_id]
            self.host_free.append(host_id)
