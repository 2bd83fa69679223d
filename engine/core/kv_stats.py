"""A snapshot of the KV block pool, as the VRAM panel shows it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.core.sequence import NO_BLOCK, Sequence

# Block states; they partition the pool.
FREE = "free"  # ref count 0, nothing reusable in it
CACHED = "cached"  # ref count 0, but holds a full block the prefix cache can revive
USED = "used"  # ref count 1
SHARED = "shared"  # ref count > 1 (a common prompt, candidates before they diverge)


@dataclass(slots=True, frozen=True)
class BlockInfo:
    block_id: int
    state: str
    ref_count: int
    owners: tuple[str, ...]  # "request_id:index" of each sequence holding the block


@dataclass(slots=True, frozen=True)
class KVGroupStats:
    """One KV group's pool (engine/core/kv_groups.py): its layers and its blocks."""

    name: str  # "global", "sliding (window 64)"
    num_layers: int
    num_blocks: int
    num_used: int
    num_cached: int  # part of num_free
    num_free: int
    bytes_per_block: int  # of this group's layers only

    @property
    def used_bytes(self) -> int:
        return self.num_used * self.bytes_per_block

    @property
    def pool_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block


@dataclass(slots=True)
class KVStats:
    """Counts: ``num_used`` (ref count >= 1) + ``num_free`` (ref count 0) = ``num_blocks``;
    ``num_shared`` is part of ``num_used`` and ``num_cached`` part of ``num_free``.

    With several KV groups the counts add up every group's blocks, block ids in
    ``blocks`` run on from one group to the next, ``bytes_per_block`` and the headroom
    are the first (global) group's, and ``groups`` has each group's own figures."""

    block_size: int
    num_blocks: int
    bytes_per_block: int
    num_free: int
    num_used: int
    num_cached: int
    num_shared: int
    # Blocks that n sharers would otherwise hold n copies of: sum of (ref_count - 1).
    bytes_saved_by_sharing: int
    allocated_slots: int  # slots in used blocks
    used_slots: int  # slots holding a token (a shared block's tokens count once)
    prefix_hit_tokens: int  # prompt tokens served from the prefix cache, since start
    prefix_query_tokens: int  # prompt tokens looked up, since start
    num_host_blocks: int = 0
    num_host_used: int = 0
    blocks: list[BlockInfo] = field(default_factory=list)
    blocks_per_owner: dict[str, int] = field(default_factory=dict)
    groups: list[KVGroupStats] = field(default_factory=list)  # empty with one group

    @property
    def used_bytes(self) -> int:
        if self.groups:
            return sum(g.used_bytes for g in self.groups)
        return self.num_used * self.bytes_per_block

    @property
    def pool_bytes(self) -> int:
        if self.groups:
            return sum(g.pool_bytes for g in self.groups)
        return self.num_blocks * self.bytes_per_block

    @property
    def waste_fraction(self) -> float:
        """Internal fragmentation: allocated slots that hold no token."""
        if self.allocated_slots == 0:
            return 0.0
        return 1.0 - self.used_slots / self.allocated_slots

    @property
    def hit_rate(self) -> float:
        if self.prefix_query_tokens == 0:
            return 0.0
        return self.prefix_hit_tokens / self.prefix_query_tokens

    def headroom_tokens(self) -> int:
        """Tokens that fit in the free blocks (cached blocks can be evicted); with groups,
        in the first group's, which holds every token (a sliding group only a window)."""
        if self.groups:
            return self.groups[0].num_free * self.block_size
        return self.num_free * self.block_size


def pool_stats(manager, holders: Iterable[Sequence] = (), with_blocks: bool = True) -> KVStats:
    """The snapshot of one BlockManager's pool (``BlockManager.stats``): each block's state
    and owners; ``holders`` label the owners and measure the slots in use."""
    owners: dict[int, list[str]] = {}
    fill: dict[int, int] = {}
    per_owner: dict[str, int] = {}
    bs = manager.block_size
    for seq in holders:
        table = seq.block_tables[manager.group] if manager.group < len(seq.block_tables) else []
        held = [(i, b) for i, b in enumerate(table) if b != NO_BLOCK]
        if not held:
            continue
        per_owner[seq.label] = len(held)
        for i, block_id in held:
            owners.setdefault(block_id, []).append(seq.label)
            tokens = max(0, min(bs, seq.num_tokens - i * bs))
            fill[block_id] = max(fill.get(block_id, 0), tokens)
    num_used = num_shared = num_cached = saved = 0
    infos = []
    for block in manager.blocks:
        if block.ref_count > 1:
            state, num_shared, saved = SHARED, num_shared + 1, saved + block.ref_count - 1
        elif block.ref_count == 1:
            state = USED
        elif block.block_hash is not None:
            state, num_cached = CACHED, num_cached + 1
        else:
            state = FREE
        num_used += block.ref_count > 0
        if with_blocks:
            infos.append(BlockInfo(block.block_id, state, block.ref_count,
                                   tuple(owners.get(block.block_id, ()))))
    return KVStats(
        block_size=bs,
        num_blocks=manager.num_blocks,
        bytes_per_block=manager.bytes_per_block,
        num_free=manager.num_blocks - num_used,
        num_used=num_used,
        num_cached=num_cached,
        num_shared=num_shared,
        bytes_saved_by_sharing=saved * manager.bytes_per_block,
        allocated_slots=num_used * bs,
        used_slots=sum(fill.values()),
        prefix_hit_tokens=manager.prefix_hit_tokens,
        prefix_query_tokens=manager.prefix_query_tokens,
        num_host_blocks=manager.num_host_blocks,
        num_host_used=len(manager.host_refs),
        blocks=infos,
        blocks_per_owner=per_owner,
    )
