"""A snapshot of the KV block pool, as the VRAM panel shows it."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field, replace

from engine.core.sequence import Sequence

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
    group: int = 0  # the KV group whose pool holds it (ids are per group)
    # A holder's image tokens (engine/vision) are among its tokens: its K/V came from the
    # image's embeddings (a cached block no one holds is not known to).
    image: bool = False


@dataclass(slots=True, frozen=True)
class KVGroupStats:
    """One KV group's pool (engine/core/kv_cache_manager.py): its layers and its blocks."""

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


@dataclass(slots=True, frozen=True)
class DiskTierStats:
    """The KV cache's disk tier (engine/disk/store.py) as the memory panel shows it."""

    enabled: bool
    num_blocks: int  # block files this process knows of, every model's
    num_bytes: int
    max_bytes: int
    hit_blocks: int  # blocks loaded since start
    skipped_files: int  # corrupt, foreign or unreadable files skipped since start
    written_blocks: int
    hit_tokens: int = 0  # prompt tokens loaded from disk, since start
    stale_files: int = 0  # a killed writer's temporary files removed at open


@dataclass(slots=True)
class KVStats:
    """Counts: ``num_used`` (ref count >= 1) + ``num_free`` (ref count 0) = ``num_blocks``;
    ``num_shared`` is part of ``num_used`` and ``num_cached`` part of ``num_free``.

    The counts add up every KV group's blocks, each of ``blocks`` names its group (ids
    are per group), ``bytes_per_block`` and the headroom are the first (global) group's,
    and ``groups`` has each group's own figures (one entry for a model of one kind)."""

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
    # Filled by the KV cache manager; a snapshot built by hand without it reads as one group.
    groups: list[KVGroupStats] = field(default_factory=list)
    disk: DiskTierStats | None = None  # None: the disk tier is off
    # Blocks a verify step took for drafts the model then rejected, given back (every
    # group's), since start (engine/spec).
    rolled_back_blocks: int = 0

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
        """Tokens that fit in the free blocks (cached blocks can be evicted) of the first
        group, which holds every token (a sliding group only a window)."""
        free = self.groups[0].num_free if self.groups else self.num_free
        return free * self.block_size


def pool_stats(pool, group: int, holders: Iterable[tuple[Sequence, list[int]]] = (),
               with_blocks: bool = True) -> KVStats:
    """The snapshot of one KV group's `BlockPool`: each block's state and owners;
    ``holders``, each sequence that holds blocks with its table in this group, label the
    owners and measure the slots in use. Its ``groups`` is left to `merge_stats`."""
    owners: dict[int, list[str]] = {}
    fill: dict[int, int] = {}
    images: set[int] = set()
    per_owner: dict[str, int] = {}
    bs = pool.block_size
    null = pool.null_id
    for seq, table in holders:
        held = [(i, b) for i, b in enumerate(table) if b != null]
        if not held:
            continue
        per_owner[seq.label] = len(held)
        for i, block_id in held:
            owners.setdefault(block_id, []).append(seq.label)
            if any(span.start < (i + 1) * bs and span.end > i * bs for span in seq.images):
                images.add(block_id)
            tokens = max(0, min(bs, seq.num_tokens - i * bs))
            fill[block_id] = max(fill.get(block_id, 0), tokens)
    num_used = num_shared = num_cached = saved = 0
    infos = []
    for block in pool.blocks:
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
                                   tuple(owners.get(block.block_id, ())), group,
                                   block.block_id in images))
    return KVStats(
        block_size=bs,
        num_blocks=pool.num_blocks,
        bytes_per_block=pool.bytes_per_block,
        num_free=pool.num_blocks - num_used,
        num_used=num_used,
        num_cached=num_cached,
        num_shared=num_shared,
        bytes_saved_by_sharing=saved * pool.bytes_per_block,
        allocated_slots=num_used * bs,
        used_slots=sum(fill.values()),
        prefix_hit_tokens=0,
        prefix_query_tokens=0,
        num_host_blocks=pool.num_host_blocks,
        num_host_used=len(pool.host_refs),
        blocks=infos,
        blocks_per_owner=per_owner,
    )


def merge_stats(parts: Seq[KVStats], specs: Seq, prefix_hit_tokens: int,
                prefix_query_tokens: int) -> KVStats:
    """Every group's `pool_stats` (``specs``: their KVGroupSpecs) as one snapshot."""
    per_owner: dict[str, int] = {}
    for part in parts:
        for label, count in part.blocks_per_owner.items():
            per_owner[label] = per_owner.get(label, 0) + count
    return replace(
        parts[0],
        num_blocks=sum(p.num_blocks for p in parts),
        num_free=sum(p.num_free for p in parts),
        num_used=sum(p.num_used for p in parts),
        num_cached=sum(p.num_cached for p in parts),
        num_shared=sum(p.num_shared for p in parts),
        bytes_saved_by_sharing=sum(p.bytes_saved_by_sharing for p in parts),
        allocated_slots=sum(p.allocated_slots for p in parts),
        used_slots=sum(p.used_slots for p in parts),
        prefix_hit_tokens=prefix_hit_tokens,
        prefix_query_tokens=prefix_query_tokens,
        num_host_blocks=sum(p.num_host_blocks for p in parts),
        num_host_used=sum(p.num_host_used for p in parts),
        blocks=[b for p in parts for b in p.blocks],
        blocks_per_owner=per_owner,
        groups=[KVGroupStats(spec.name, len(spec.layers), p.num_blocks, p.num_used,
                             p.num_cached, p.num_free, p.bytes_per_block)
                for spec, p in zip(specs, parts, strict=True)],
    )
