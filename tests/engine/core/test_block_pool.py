"""BlockPool: the null block is never handed out, the free queue's order, lazy eviction
(told to the tier below, which queues a save), host block refs."""

from __future__ import annotations

import pytest

from engine.core.block_pool import BlockPool
from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.sequence import Sequence
from engine.core.tier_blocks import TierBlocks
from tests.engine.core.admission import allocate
from tests.engine.core.test_tier_blocks import Shelf


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


def test_release_orders_the_queue_and_take_evicts_lazily():
    tier = TierBlocks(Shelf(), 2)
    pool = BlockPool(4, 2, tier=tier)
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
    assert tier.take_saves() == []
    assert pool.take() is a  # a's prefix leaves memory now: saved first
    assert tier.take_saves() == [(0, b"ha", (1, 2))]
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
