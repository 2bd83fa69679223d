"""BlockPool: the null block is never handed out, the free queue's order, lazy eviction
into the tier below (saves queued, hits placed to be read, cached once read), a chat's
disk hits loaded ahead as cached blocks nothing holds, host block refs."""

from __future__ import annotations

import pytest

from engine.core.block_hashes import hash_block
from engine.core.block_pool import BlockPool, TierHit
from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.sequence import Sequence
from tests.engine.core.admission import allocate


def queue_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_queue]


def test_the_null_block_is_never_handed_out():
    pool = BlockPool(3, 4)
    assert pool.null_id == 3 and pool.null_block.ref_count == 0
    taken = [pool.take().block_id for _ in range(3)]
    assert taken == [0, 1, 2] and pool.num_free_blocks == 0
    with pytest.raises(IndexError):
        pool.take()
    pool.release([2, pool.null_id, 0])  # a null entry releases nothing
    assert queue_ids(pool) == [0, 2] and pool.null_block.ref_count == 0


def test_a_full_pool_of_sequences_never_holds_the_null_block():
    kv = KVCacheManager.build([KVGroupSpec((0,)), KVGroupSpec((1,), 4)], [6, 6], 2,
                              lookahead=4)
    seqs = [Sequence(i, f"r{i}", 0, list(range(i * 10, i * 10 + 5)), 5) for i in range(2)]
    for seq in seqs:
        assert allocate(kv, seq) == 0
    for g, pool in enumerate(kv.pools):
        held = [b for s in seqs for b in kv.block_tables(s)[g]]
        assert pool.null_id not in held and len(set(held)) == len(held)


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


def test_release_orders_the_queue_and_take_evicts_lazily():
    pool = BlockPool(4, 2)
    pool.tier = Shelf()
    a, b, c = pool.take(), pool.take(), pool.take()
    assert pool.register(a, b"ha", (1, 2)) and pool.register(b, b"hb", (3, 4))
    assert not pool.register(c, b"ha", (1, 2))  # the content lives in a already
    pool.release([c.block_id, b.block_id, a.block_id])
    # Unhashed c to the head (reused first), hashed b then a to the tail.
    assert queue_ids(pool) == [2, 3, 1, 0]
    assert pool.lookup(b"ha", (1, 2)) is a and pool.lookup(b"ha", (9, 9)) is None
    pool.touch(b)  # a hit revives b from the middle
    assert queue_ids(pool) == [2, 3, 0] and b.ref_count == 1
    assert [pool.take().block_id for _ in range(2)] == [2, 3]
    assert pool.take_saves() == []
    assert pool.take() is a  # a's prefix leaves memory now: saved first
    assert pool.take_saves() == [(0, b"ha", (1, 2))]
    assert a.block_hash is None and pool.lookup(b"ha", (1, 2)) is None
    with pytest.raises(RuntimeError, match="freed twice"):
        pool.release([c.block_id, c.block_id])


def test_host_blocks_are_ref_counted():
    pool = BlockPool(2, 2, num_host_blocks=2)
    h = pool.take_host()
    pool.hold_host(h)
    assert pool.host_refs == {h: 2}
    pool.release_host(h)
    pool.release_host(h)
    assert pool.host_refs == {} and sorted(pool.host_free) == [0, 1]


@pytest.mark.parametrize(("num_blocks", "num_host_blocks"), [(0, 0), (4, -1)])
def test_bad_sizes_name_the_field(num_blocks, num_host_blocks):
    with pytest.raises(ValueError, match="num_blocks|num_host_blocks"):
        BlockPool(num_blocks, 4, num_host_blocks)


def test_a_tier_hit_is_placed_in_a_free_block_and_cached_once_read():
    pool = BlockPool(3, 2)
    shelf = pool.tier = Shelf()
    shelf.kept = {b"h1": (1, 2)}
    assert pool.tier_hit(b"h0", (0, 0)) is None
    hit = pool.tier_hit(b"h1", (1, 2))
    assert isinstance(hit, TierHit)
    block = pool.place(hit)
    assert (block.block_id, block.ref_count) == (0, 1)
    # Not in the prefix cache until its content is in: nothing else may hit on it.
    assert pool.lookup(b"h1", (1, 2)) is None
    assert pool.take_placed() == [(0, hit)] and pool.take_placed() == []
    pool.register(block, b"h1", (1, 2))  # the read is in
    # A block already on the tier is not saved again when evicted.
    pool.release([block.block_id])
    for _ in range(3):
        pool.take()
    assert pool.take_saves() == []
    assert pool.unsaved_cached() == []


def finish_reads(kv: KVCacheManager, shelf: Shelf) -> list:
    """Play the engine and its reader: each queued read checked by the shelf."""
    reads = kv.loads.take_new()
    for read in reads:
        kv.finish_read(read.ticket, shelf.load(read.block_hash, read.token_ids) is not None)
    return reads


H1 = hash_block(None, (1, 2))


def _held_pool() -> tuple[KVCacheManager, BlockPool]:
    """Five blocks of two tokens: (1, 2) on the tier below; 0 caches (3, 4) after it and
    1 another prefix, both free (0 at the queue's head); 2, 3 and 4 held by someone else."""
    kv = KVCacheManager.build([KVGroupSpec((0,))], [5], 2)
    pool = kv.pools[0]
    pool.tier = Shelf()
    pool.tier.kept = {H1: (1, 2)}
    blocks = [pool.take() for _ in range(5)]
    pool.register(blocks[0], hash_block(hash_block(None, (1, 2)), (3, 4)), (3, 4))
    pool.register(blocks[1], b"other", (9, 9))
    pool.release([0, 1])
    return kv, pool


def test_preload_leaves_disk_hits_cached_and_held_by_nothing():
    kv, pool = _held_pool()
    seq = Sequence(0, "preload", 0, [1, 2, 3, 4, 5], 5)
    # (1, 2) is on disk, (3, 4) in memory at the queue's head: held before a block is
    # taken, so the load goes into block 1 (its prefix saved first), not over block 0.
    assert kv.preload(seq) == 2
    # Held by the load-ahead until its read is in.
    assert [pool.blocks[i].ref_count for i in range(5)] == [1, 1, 1, 1, 1]
    assert pool.lookup(H1, (1, 2)) is None and pool.preloaded == set()
    [read] = finish_reads(kv, pool.tier)
    assert (read.group, read.block_id, read.block_hash) == (0, 1, H1)
    assert pool.lookup(H1, (1, 2)) is pool.blocks[1]
    assert pool.lookup(hash_block(H1, (3, 4)), (3, 4)) is pool.blocks[0]
    assert [pool.blocks[i].ref_count for i in range(5)] == [0, 0, 1, 1, 1]
    assert pool.preloaded == {1}  # the request that uses it counts it as from disk
    # Freed newest first: the chain's first block is evicted last.
    assert queue_ids(pool) == [0, 1]
    assert pool.take_saves() == [(1, b"other", (9, 9))]
    assert kv.block_tables(seq) == [[]] and seq.num_computed_tokens == 0
    assert (kv.prefix_hit_tokens, kv.prefix_query_tokens, kv.disk_hit_tokens) == (0, 0, 0)


def test_preload_without_room_changes_nothing():
    kv, pool = _held_pool()
    seq = Sequence(0, "preload", 0, [1, 2, 3, 4, 5], 5)
    assert kv.preload(seq, spare_blocks=1) == 0  # 2 free blocks, 2 needed, 1 to spare
    assert queue_ids(pool) == [0, 1] and pool.lookup(H1, (1, 2)) is None
    assert pool.take_saves() == [] and kv.block_tables(seq) == [[]]
    assert pool.preloaded == set() and kv.loads.take_new() == []


def test_a_preloaded_block_counts_as_from_disk_once():
    kv, pool = _held_pool()
    assert kv.preload(Sequence(0, "preload", 0, [1, 2, 3, 4, 5], 5)) == 2
    finish_reads(kv, pool.tier)
    # Opened again: found in memory now, still unused, so still counted.
    assert kv.preload(Sequence(1, "preload", 0, [1, 2, 3, 4, 5], 5)) == 2
    first = Sequence(2, "r", 0, [1, 2, 3, 4, 5], 5)
    pool.release([2])  # room for the request's own block
    assert allocate(kv, first) == 4 and first.num_disk_tokens == 2
    assert pool.preloaded == set() and kv.disk_hit_tokens == 2
    kv.free(first)
    again = Sequence(3, "r", 0, [1, 2, 3, 4, 6], 5)
    assert allocate(kv, again) == 4 and again.num_disk_tokens == 0
