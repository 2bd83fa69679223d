"""TierBlocks, one group's traffic with the tier below: hits placed in free blocks to be
read, cached once read, evicted blocks saved unless the tier has them; a chat's disk hits
loaded ahead as cached blocks nothing holds."""

from __future__ import annotations

from engine.core.block_hashes import hash_block
from engine.core.block_pool import BlockPool
from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.sequence import Sequence
from engine.core.tier_blocks import TierBlocks, TierHit
from tests.engine.core.admission import allocate


def queue_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_queue]


class Shelf:
    """A tier below: hash -> tokens; ``bad`` hashes fail their check."""

    def __init__(self) -> None:
        self.kept: dict[bytes, tuple[int, ...]] = {}
        self.bad: set[bytes] = set()

    def has(self, block_hash: bytes) -> bool:
        return block_hash in self.kept

    def load(self, block_hash: bytes, token_ids: tuple[int, ...]) -> bytes | None:
        ok = block_hash not in self.bad and self.kept.get(block_hash) == token_ids
        return repr(token_ids).encode() if ok else None


def test_a_tier_hit_is_placed_in_a_free_block_and_cached_once_read():
    shelf = Shelf()
    shelf.kept = {b"h1": (1, 2)}
    tier = TierBlocks(shelf, 2)
    pool = BlockPool(3, 2, tier=tier)
    assert tier.hit(b"h0", (0, 0)) is None
    hit = tier.hit(b"h1", (1, 2))
    assert isinstance(hit, TierHit)
    block = tier.place(pool, hit)
    assert (block.block_id, block.ref_count) == (0, 1)
    # Not in the prefix cache until its content is in: nothing else may hit on it.
    assert pool.lookup(b"h1", (1, 2)) is None
    assert tier.take_placed() == [(0, hit)] and tier.take_placed() == []
    pool.register(block, b"h1", (1, 2))  # the read is in
    # A block already on the tier is not saved again when evicted.
    pool.release([block.block_id])
    for _ in range(3):
        pool.take()
    assert tier.take_saves() == []
    assert tier.unsaved(pool) == []


def finish_reads(kv: KVCacheManager, shelf: Shelf) -> list:
    """Play the engine and its reader: each queued read checked by the shelf."""
    reads = kv.loads.take_new()
    for read in reads:
        kv.finish_read(read.ticket, shelf.load(read.block_hash, read.token_ids) is not None)
    return reads


H1 = hash_block(None, (1, 2))


def _held_pool() -> tuple[KVCacheManager, BlockPool, TierBlocks, Shelf]:
    """Five blocks of two tokens: (1, 2) on the tier below; 0 caches (3, 4) after it and
    1 another prefix, both free (0 at the queue's head); 2, 3 and 4 held by someone else."""
    shelf = Shelf()
    shelf.kept = {H1: (1, 2)}
    kv = KVCacheManager.build([KVGroupSpec((0,))], [5], 2, lower_tiers=[shelf])
    pool = kv.pools[0]
    blocks = [pool.take() for _ in range(5)]
    pool.register(blocks[0], hash_block(hash_block(None, (1, 2)), (3, 4)), (3, 4))
    pool.register(blocks[1], b"other", (9, 9))
    pool.release([0, 1])
    return kv, pool, kv.tiers[0], shelf


def test_preload_leaves_disk_hits_cached_and_held_by_nothing():
    kv, pool, tier, shelf = _held_pool()
    seq = Sequence(0, "preload", 0, [1, 2, 3, 4, 5], 5)
    # (1, 2) is on disk, (3, 4) in memory at the queue's head: held before a block is
    # taken, so the load goes into block 1 (its prefix saved first), not over block 0.
    assert kv.preload(seq) == 2
    # Held by the load-ahead until its read is in.
    assert [pool.blocks[i].ref_count for i in range(5)] == [1, 1, 1, 1, 1]
    assert pool.lookup(H1, (1, 2)) is None and tier.preloaded == set()
    [read] = finish_reads(kv, shelf)
    assert (read.group, read.block_id, read.block_hash) == (0, 1, H1)
    assert pool.lookup(H1, (1, 2)) is pool.blocks[1]
    assert pool.lookup(hash_block(H1, (3, 4)), (3, 4)) is pool.blocks[0]
    assert [pool.blocks[i].ref_count for i in range(5)] == [0, 0, 1, 1, 1]
    assert tier.preloaded == {1}  # the request that uses it counts it as from disk
    # Freed newest first: the chain's first block is evicted last.
    assert queue_ids(pool) == [0, 1]
    assert tier.take_saves() == [(1, b"other", (9, 9))]
    assert kv.block_tables(seq) == [[]] and seq.num_computed_tokens == 0
    assert (kv.prefix_hit_tokens, kv.prefix_query_tokens, kv.disk_hit_tokens) == (0, 0, 0)


def test_preload_without_room_changes_nothing():
    kv, pool, tier, shelf = _held_pool()
    seq = Sequence(0, "preload", 0, [1, 2, 3, 4, 5], 5)
    assert kv.preload(seq, spare_blocks=1) == 0  # 2 free blocks, 2 needed, 1 to spare
    assert queue_ids(pool) == [0, 1] and pool.lookup(H1, (1, 2)) is None
    assert tier.take_saves() == [] and kv.block_tables(seq) == [[]]
    assert tier.preloaded == set() and kv.loads.take_new() == []


def test_a_preloaded_block_counts_as_from_disk_once():
    kv, pool, tier, shelf = _held_pool()
    assert kv.preload(Sequence(0, "preload", 0, [1, 2, 3, 4, 5], 5)) == 2
    finish_reads(kv, shelf)
    # Opened again: found in memory now, still unused, so still counted.
    assert kv.preload(Sequence(1, "preload", 0, [1, 2, 3, 4, 5], 5)) == 2
    first = Sequence(2, "r", 0, [1, 2, 3, 4, 5], 5)
    pool.release([2])  # room for the request's own block
    assert allocate(kv, first) == 4 and first.num_disk_tokens == 2
    assert tier.preloaded == set() and kv.disk_hit_tokens == 2
    kv.free(first)
    again = Sequence(3, "r", 0, [1, 2, 3, 4, 6], 5)
    assert allocate(kv, again) == 4 and again.num_disk_tokens == 0


def test_the_pool_tells_its_hook_of_each_eviction_before_the_block_forgets():
    seen = []

    class Hook:
        def evicting(self, block) -> None:
            seen.append((block.block_id, block.block_hash, block.token_ids))

    pool = BlockPool(2, 2, tier=Hook())
    a, b = pool.take(), pool.take()
    pool.register(a, b"ha", (1, 2))
    pool.release([a.block_id, b.block_id])
    assert [pool.take().block_id for _ in range(2)] == [1, 0] and seen == [(0, b"ha", (1, 2))]


def test_without_a_tier_below_nothing_is_found_or_saved():
    kv = KVCacheManager.build([KVGroupSpec((0,))], [3], 2)
    pool, tier = kv.pools[0], kv.tiers[0]
    assert pool.tier is None and tier.hit(H1, (1, 2)) is None
    block = pool.take()
    pool.register(block, H1, (1, 2))
    pool.release([block.block_id])
    assert tier.unsaved(pool) == [] and kv.take_saves() == [[]]
