"""The KV cache of one attention kind (a KV cache manager over one full-attention
manager and its pool): allocation, fork and copy-on-write, prefix cache, LRU eviction,
swap, stats, with exact block ids, ref counts and free-queue order."""

from __future__ import annotations

import pytest

import engine.core.block_hashes
from engine.core.block_hashes import hash_block
from engine.core.block_pool import BlockPool
from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.kv_stats import CACHED, FREE, SHARED, USED, BlockInfo
from engine.core.sequence import Sequence
from tests.engine.core.admission import allocate, fork


def make_seq(seq_id: int, tokens: list[int], request_id: str = "r", index: int = 0) -> Sequence:
    return Sequence(seq_id, request_id, index, list(tokens), len(tokens))


def one_kind(num_blocks: int, block_size: int, num_host_blocks: int = 0,
             enable_prefix_caching: bool = True, bytes_per_block: int = 0) -> KVCacheManager:
    return KVCacheManager.build([KVGroupSpec((0,))], [num_blocks], block_size,
                                num_host_blocks=num_host_blocks,
                                enable_prefix_caching=enable_prefix_caching,
                                bytes_per_layer_block=bytes_per_block)


def pool(kv: KVCacheManager) -> BlockPool:
    return kv.pools[0]


def compute(bm: KVCacheManager, *seqs: Sequence) -> None:
    """What a step does for ``seqs``: every token now has K/V; full blocks get cached."""
    for seq in seqs:
        seq.num_computed_tokens = seq.num_tokens
        bm.commit_computed(seq)


def refs(bm: KVCacheManager, *block_ids: int) -> list[int]:
    return [pool(bm).blocks[b].ref_count for b in block_ids]


def queue_ids(bm: KVCacheManager) -> list[int]:
    return [b.block_id for b in pool(bm).free_queue]


# ------------------------------------------------------------------- walk-through
def test_walk_through_fork_and_copy_on_write() -> None:
    bm = one_kind(num_blocks=10, block_size=4)
    parent = make_seq(0, [1, 2, 3, 4, 5, 6])
    assert allocate(bm, parent) == 0
    assert bm.block_tables(parent)[0] == [0, 1]
    assert refs(bm, 0, 1) == [1, 1]
    assert pool(bm).num_free_blocks == 8

    child = make_seq(1, parent.token_ids, index=1)
    fork(bm, parent, child)
    assert bm.block_tables(child)[0] == [0, 1]
    assert refs(bm, 0, 1) == [2, 2]
    assert pool(bm).num_free_blocks == 8

    # The prompt's one prefill step computed it for both candidates.
    compute(bm, parent, child)
    assert pool(bm).blocks[0].block_hash == hash_block(None, [1, 2, 3, 4])
    assert pool(bm).blocks[1].block_hash is None  # partial: not cacheable yet

    child.append_token(70)
    assert bm.can_append([child])
    assert bm.append_slots(child)
    assert bm.block_tables(child)[0] == [0, 2]
    assert refs(bm, 0, 1, 2) == [2, 1, 1]
    assert bm.take_cow_pairs() == [[(1, 2)]]
    assert bm.take_cow_pairs() == [[]]
    assert pool(bm).num_free_blocks == 7

    # The parent is now the only owner of block 1: it writes in place.
    parent.append_token(80)
    assert bm.append_slots(parent)
    assert bm.block_tables(parent)[0] == [0, 1]
    assert bm.take_cow_pairs() == [[]]

    bm.free(child)
    bm.free(parent)
    assert pool(bm).num_free_blocks == 10
    assert refs(bm, *range(10)) == [0] * 10
    # The child's partial block 2 ([5, 6]) stays cached; the parent's block 1 holds the
    # same tokens, so it is not cached twice. Unhashed blocks go to the head (reused
    # first), cached ones to the tail.
    assert pool(bm).blocks[2].token_ids == (5, 6)
    assert queue_ids(bm) == [1, 3, 4, 5, 6, 7, 8, 9, 2, 0]
    assert (bm.block_tables(parent)[0], bm.block_tables(child)[0]) == ([], [])


def test_append_slots_adds_a_block_when_the_last_is_full() -> None:
    bm = one_kind(num_blocks=4, block_size=4)
    seq = make_seq(0, [1, 2, 3, 4])
    allocate(bm, seq)
    compute(bm, seq)
    seq.append_token(5)
    assert bm.can_append([seq])
    assert bm.append_slots(seq)
    assert bm.block_tables(seq)[0] == [0, 1]
    assert bm.take_cow_pairs() == [[]]
    seq.num_computed_tokens = 5
    seq.append_token(6)
    assert bm.append_slots(seq)  # room left in block 1
    assert bm.block_tables(seq)[0] == [0, 1]
    assert pool(bm).num_free_blocks == 2


def test_append_slots_out_of_blocks_changes_nothing() -> None:
    bm = one_kind(num_blocks=3, block_size=2)
    parent = make_seq(0, [1, 2, 3])
    allocate(bm, parent)
    child = make_seq(1, parent.token_ids, index=1)
    fork(bm, parent, child)
    compute(bm, parent, child)
    filler = make_seq(2, [9])
    allocate(bm, filler)
    assert pool(bm).num_free_blocks == 0
    child.append_token(4)  # needs a copy of the shared block 1
    assert not bm.can_append([child])
    assert not bm.append_slots(child)
    assert bm.block_tables(child)[0] == [0, 1]
    assert refs(bm, 0, 1, 2) == [2, 2, 1]
    assert bm.take_cow_pairs() == [[]]


def test_the_tables_are_the_kv_caches_own_and_go_with_the_blocks() -> None:
    """A sequence's blocks are the manager's state, by seq id (vLLM's req_to_blocks):
    ``block_tables`` hands out its lists, not copies; a failed allocation, a free and a
    swap out leave no entry behind."""
    bm = one_kind(num_blocks=4, block_size=4, num_host_blocks=4)
    manager = bm.managers[0]
    seq = make_seq(7, [1, 2, 3, 4, 5, 6])
    assert allocate(bm, seq) == 0
    assert manager.tables == {7: [0, 1]}
    assert bm.block_tables(seq)[0] is manager.tables[7]
    big = make_seq(8, list(range(20, 40)))
    assert allocate(bm, big) is None and manager.tables == {7: [0, 1]}
    assert bm.swap_out([seq]) == [[(0, 0), (1, 1)]] and manager.tables == {}
    assert bm.swap_in([seq]) == [[(0, 0), (1, 1)]] and manager.tables == {7: [0, 1]}
    bm.free(seq)
    assert manager.tables == {} and bm.block_tables(seq) == [[]]


# ------------------------------------------------------------------ prefix cache
def test_hash_block_is_stable_and_chained() -> None:
    first = hash_block(None, [1, 2, 3, 4])
    assert first.hex() == "76edd7884c9beeb96fc1fc505faa6dd4"
    assert hash_block(first, [5, 6, 7, 8]).hex() == "6c796f670c1976bf7ab878d900355b1d"
    assert hash_block(None, [5, 6, 7, 8]) != hash_block(first, [5, 6, 7, 8])
    assert hash_block(None, [1, 23]) != hash_block(None, [12, 3])


def test_second_turn_reuses_the_first_turns_full_blocks_and_copies_its_partial_one() -> None:
    bm = one_kind(num_blocks=10, block_size=4)
    turn1 = make_seq(0, list(range(100, 114)))  # 14 tokens: 3 full blocks + 2
    assert allocate(bm, turn1) == 0
    compute(bm, turn1)
    first_blocks = bm.block_tables(turn1)[0][:3]
    bm.free(turn1)

    turn2 = make_seq(1, list(range(100, 114)) + [7, 8, 9, 10, 11])  # 19 tokens
    free_before = pool(bm).num_free_blocks
    assert allocate(bm, turn2) == 14
    assert turn2.num_computed_tokens == 14
    assert bm.block_tables(turn2)[0][:3] == first_blocks
    assert len(bm.block_tables(turn2)[0]) == 5
    # Block 3 (tokens 112, 113) is held for its copy into turn2's fourth block.
    assert bm.block_tables(turn2)[0][3] != 3 and refs(bm, 3) == [1]
    assert pool(bm).num_free_blocks == free_before - 6
    assert bm.take_cow_pairs() == [[(3, bm.block_tables(turn2)[0][3])]]
    assert refs(bm, 3) == [0] and pool(bm).blocks[3].token_ids == (112, 113)
    assert pool(bm).num_free_blocks == free_before - 5  # 3 revived from the cache, 2 new
    stats = bm.stats()
    assert (stats.prefix_hit_tokens, stats.prefix_query_tokens) == (14, 14 + 19)


def test_prompt_of_exactly_k_full_blocks_recomputes_only_its_last_token() -> None:
    bm = one_kind(num_blocks=10, block_size=4)
    first = make_seq(0, list(range(12)))
    allocate(bm, first)
    compute(bm, first)
    bm.free(first)
    again = make_seq(1, list(range(12)))
    # The last token is recomputed for its logits, so the third block is not shared:
    # its first three tokens are copied into a new block (engine/core/partial_blocks.py).
    assert allocate(bm, again) == 11
    table = bm.block_tables(again)[0]
    assert table[:2] == [0, 1] and table[2] != 2
    assert bm.take_cow_pairs() == [[(2, table[2])]]


def test_prompts_sharing_a_system_prompt_share_its_blocks() -> None:
    bm = one_kind(num_blocks=10, block_size=4)
    system = [5, 6, 7, 8, 9, 10, 11, 12]
    a = make_seq(0, system + [1, 2, 3], request_id="a")
    b = make_seq(1, system + [4, 4], request_id="b")
    assert allocate(bm, a) == 0
    compute(bm, a)
    assert allocate(bm, b) == 8
    assert bm.block_tables(b)[0][:2] == bm.block_tables(a)[0][:2] == [0, 1]
    assert refs(bm, 0, 1) == [2, 2]
    assert bm.block_tables(b)[0][2] not in bm.block_tables(a)[0]
    stats = bm.stats([a, b])
    assert stats.num_shared == 2
    assert stats.blocks[0].owners == ("a:0", "b:0")


def test_forced_hash_collision_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.core.block_hashes, "hash_block",
                        lambda parent, tokens, extra=b"": b"same")
    bm = one_kind(num_blocks=6, block_size=4)
    a = make_seq(0, [1, 2, 3, 4, 5])
    allocate(bm, a)
    compute(bm, a)
    bm.free(a)
    assert pool(bm).cached[b"same"] is pool(bm).blocks[0]
    assert set(pool(bm).cached.values()) == {pool(bm).blocks[0], pool(bm).blocks[1]}

    other = make_seq(1, [9, 9, 9, 9, 5])  # same hash, other tokens
    assert allocate(bm, other) == 0
    assert 0 not in bm.block_tables(other)[0]
    assert pool(bm).blocks[0].ref_count == 0
    # The check compares tokens, so the genuine match still hits.
    same = make_seq(2, [1, 2, 3, 4, 6])
    assert allocate(bm, same) == 4
    assert bm.block_tables(same)[0][0] == 0


def test_prefix_caching_disabled_never_hits() -> None:
    bm = one_kind(num_blocks=6, block_size=4, enable_prefix_caching=False)
    a = make_seq(0, list(range(9)))
    allocate(bm, a)
    compute(bm, a)
    assert pool(bm).cached == {}
    bm.free(a)
    b = make_seq(1, list(range(9)))
    assert allocate(bm, b) == 0
    assert bm.stats().num_cached == 0


def test_duplicate_content_keeps_the_first_cached_block() -> None:
    bm = one_kind(num_blocks=6, block_size=2)
    a, b = make_seq(0, [1, 2, 3]), make_seq(1, [1, 2, 3])
    allocate(bm, a)
    allocate(bm, b)  # before a is computed: no hit, its own blocks
    assert bm.block_tables(b)[0] == [2, 3]
    compute(bm, a, b)
    assert pool(bm).cached[hash_block(None, [1, 2])] is pool(bm).blocks[0]
    assert pool(bm).blocks[2].block_hash is None


# ---------------------------------------------------------------------------- LRU
def test_eviction_takes_least_recently_freed_and_chain_tail_first() -> None:
    bm = one_kind(num_blocks=8, block_size=2)
    a = make_seq(0, [1, 2, 3, 4, 5, 6, 7])  # blocks 0 1 2 full, 3 partial: all cached
    allocate(bm, a)
    compute(bm, a)
    bm.free(a)
    assert queue_ids(bm) == [4, 5, 6, 7, 3, 2, 1, 0]

    b = make_seq(1, [8, 9, 10, 11, 12])  # takes 4 5 6 (6 partial): all cached
    allocate(bm, b)
    compute(bm, b)
    bm.free(b)
    assert queue_ids(bm) == [7, 3, 2, 1, 0, 6, 5, 4]

    c = make_seq(2, [20, 21, 22, 23, 24])
    allocate(bm, c)
    # a's chain goes before b's (freed earlier), and its tail (the partial 3, then 2)
    # before its head.
    assert bm.block_tables(c)[0] == [7, 3, 2]
    d = make_seq(3, [30, 31, 32])
    allocate(bm, d)
    assert bm.block_tables(d)[0] == [1, 0]
    blocks = pool(bm).blocks
    assert all(blocks[i].block_hash is None for i in (3, 2, 1, 0))
    assert set(pool(bm).cached.values()) == {blocks[4], blocks[5], blocks[6]}
    assert queue_ids(bm) == [6, 5, 4]


def test_hit_on_a_free_cached_block_revives_it_from_the_middle() -> None:
    bm = one_kind(num_blocks=8, block_size=2)
    a = make_seq(0, [1, 2, 3, 4, 5, 6, 7])
    allocate(bm, a)
    compute(bm, a)
    bm.free(a)
    b = make_seq(1, [8, 9, 10, 11, 12])
    allocate(bm, b)
    compute(bm, b)
    bm.free(b)
    assert queue_ids(bm) == [7, 3, 2, 1, 0, 6, 5, 4]

    again = make_seq(2, [1, 2, 3, 4, 99])
    assert allocate(bm, again) == 4
    assert bm.block_tables(again)[0] == [0, 1, 7]
    assert refs(bm, 0, 1, 7) == [1, 1, 1]
    assert queue_ids(bm) == [3, 2, 6, 5, 4]
    assert len(pool(bm).free_queue) == pool(bm).num_free_blocks == 5
    assert not pool(bm).free_queue.contains(pool(bm).blocks[0])
    bm.free(again)  # nothing computed past the hit: no partial block to keep
    assert queue_ids(bm) == [7, 3, 2, 6, 5, 4, 1, 0]


def test_allocate_returns_none_and_changes_nothing_when_full() -> None:
    bm = one_kind(num_blocks=5, block_size=4)
    cached = make_seq(0, [1, 2, 3, 4, 5])
    allocate(bm, cached)
    compute(bm, cached)
    bm.free(cached)  # block 0 cached, block 1 free
    holder = make_seq(1, list(range(50, 59)))  # 3 blocks
    allocate(bm, holder)
    assert pool(bm).num_free_blocks == 2
    before = (queue_ids(bm), refs(bm, *range(5)), dict(pool(bm).cached), bm.prefix_hit_tokens,
              bm.prefix_query_tokens)

    # Would revive block 0 and need 2 new blocks: 3 > 2 free.
    big = make_seq(2, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert allocate(bm, big) is None
    assert (bm.block_tables(big)[0], big.num_computed_tokens) == ([], 0)
    after = (queue_ids(bm), refs(bm, *range(5)), dict(pool(bm).cached), bm.prefix_hit_tokens,
             bm.prefix_query_tokens)
    assert after == before

    # Reusing the cached partial block 1 ([5]) would hold it too: 3 > 2 free, so the
    # hit does without it.
    fits = make_seq(3, [1, 2, 3, 4, 5, 6, 7, 8])
    assert allocate(bm, fits) == 4
    assert pool(bm).num_free_blocks == 0
    assert bm.take_cow_pairs() == [[]]


# ------------------------------------------------------------------------- stats
def test_kv_stats_in_a_small_scenario() -> None:
    bm = one_kind(num_blocks=8, block_size=4, bytes_per_block=100)
    gone = make_seq(9, [9, 9, 9, 9], request_id="gone")  # leaves block 0 cached
    allocate(bm, gone)
    compute(bm, gone)
    bm.free(gone)
    assert queue_ids(bm) == [1, 2, 3, 4, 5, 6, 7, 0]

    parent = make_seq(0, [1, 2, 3, 4, 5, 6], request_id="p")  # blocks 1, 2
    assert allocate(bm, parent) == 0
    child = make_seq(1, parent.token_ids, request_id="p", index=1)
    fork(bm, parent, child)
    compute(bm, parent, child)
    child.append_token(7)
    bm.append_slots(child)  # copies block 2 into block 3
    parent.append_token(8)
    bm.append_slots(parent)
    other = make_seq(2, [9, 9, 9, 9, 1, 1, 1, 1, 2], request_id="o")
    assert allocate(bm, other) == 4  # revives block 0, adds blocks 4 and 5
    assert bm.block_tables(other)[0] == [0, 4, 5]

    s = bm.stats([parent, child, other])
    assert (s.block_size, s.num_blocks, s.bytes_per_block) == (4, 8, 100)
    assert (s.num_free, s.num_used, s.num_cached, s.num_shared) == (2, 6, 0, 1)
    assert s.bytes_saved_by_sharing == 100
    assert s.allocated_slots == 24
    # block 0: 4, 1: 4 (shared, once), 2: 3, 3: 3, 4: 4, 5: 1
    assert s.used_slots == 19
    assert s.waste_fraction == pytest.approx(5 / 24)
    assert (s.prefix_hit_tokens, s.prefix_query_tokens) == (4, 4 + 6 + 9)
    assert s.hit_rate == pytest.approx(4 / 19)
    assert (s.used_bytes, s.pool_bytes, s.headroom_tokens()) == (600, 800, 8)
    assert s.blocks == [
        BlockInfo(0, USED, 1, ("o:0",)),
        BlockInfo(1, SHARED, 2, ("p:0", "p:1")),
        BlockInfo(2, USED, 1, ("p:0",)),
        BlockInfo(3, USED, 1, ("p:1",)),
        BlockInfo(4, USED, 1, ("o:0",)),
        BlockInfo(5, USED, 1, ("o:0",)),
        BlockInfo(6, FREE, 0, ()),
        BlockInfo(7, FREE, 0, ()),
    ]
    assert s.blocks_per_owner == {"p:0": 2, "p:1": 2, "o:0": 3}

    compute(bm, other)  # block 4 becomes full and cached; block 0 already is
    bm.free(other)  # and the partial block 5 ([2]) stays cached
    s = bm.stats([parent, child, other], with_blocks=False)
    assert (s.num_free, s.num_used, s.num_cached, s.num_shared) == (5, 3, 3, 1)
    assert s.blocks == []
    assert s.blocks_per_owner == {"p:0": 2, "p:1": 2}
    assert bm.stats().blocks[4] == BlockInfo(4, CACHED, 0, ())


def test_empty_stats() -> None:
    s = one_kind(num_blocks=3, block_size=16).stats()
    assert (s.num_free, s.num_used, s.allocated_slots, s.used_slots) == (3, 0, 0, 0)
    assert (s.waste_fraction, s.hit_rate) == (0.0, 0.0)


def test_bad_pool_size() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        one_kind(num_blocks=0, block_size=16)


# -------------------------------------------------------------------------- swap
def _three_candidates(bm: KVCacheManager) -> list[Sequence]:
    parent = make_seq(0, [1, 2, 3, 4, 5, 6])
    allocate(bm, parent)
    seqs = [parent]
    for index in (1, 2):
        child = make_seq(index, parent.token_ids, index=index)
        fork(bm, parent, child)
        seqs.append(child)
    compute(bm, *seqs)
    for seq, token in zip(seqs, (70, 71, 72), strict=True):
        seq.append_token(token)
        assert bm.append_slots(seq)
    return seqs


def test_swap_out_and_in_share_host_blocks_and_restore_ref_counts() -> None:
    bm = one_kind(num_blocks=8, block_size=4, num_host_blocks=6)
    seqs = _three_candidates(bm)
    assert [bm.block_tables(s)[0] for s in seqs] == [[0, 2], [0, 3], [0, 1]]
    assert bm.take_cow_pairs() == [[(1, 2), (1, 3)]]
    assert refs(bm, 0, 1, 2, 3) == [3, 1, 1, 1]

    assert bm.can_swap_out(seqs)
    assert bm.swap_out(seqs) == [[(0, 0), (2, 1), (3, 2), (1, 3)]]
    assert bm.managers[0].host_tables == {0: [0, 1], 1: [0, 2], 2: [0, 3]}
    assert pool(bm).host_refs == {0: 3, 1: 1, 2: 1, 3: 1}
    assert pool(bm).num_free_blocks == 8
    assert [bm.block_tables(s)[0] for s in seqs] == [[], [], []]
    assert [s.num_computed_tokens for s in seqs] == [6, 6, 6]
    assert bm.stats().num_host_used == 4
    assert queue_ids(bm) == [1, 3, 2, 4, 5, 6, 7, 0]

    assert bm.can_swap_in(seqs)
    assert bm.swap_in(seqs) == [[(0, 1), (1, 3), (2, 2), (3, 4)]]
    assert [bm.block_tables(s)[0] for s in seqs] == [[1, 3], [1, 2], [1, 4]]
    assert refs(bm, 1, 2, 3, 4) == [3, 1, 1, 1]
    assert [s.num_computed_tokens for s in seqs] == [6, 6, 6]
    assert pool(bm).host_refs == {} and bm.managers[0].host_tables == {}
    assert sorted(pool(bm).host_free) == list(range(6))
    assert pool(bm).num_free_blocks == 4


def test_swap_capacity_checks() -> None:
    bm = one_kind(num_blocks=8, block_size=4, num_host_blocks=3)
    seqs = _three_candidates(bm)
    assert not bm.can_swap_out(seqs)  # 4 distinct blocks, 3 host blocks
    assert bm.can_swap_out(seqs[:2])  # 3 distinct blocks
    bm.swap_out(seqs[:2])
    assert refs(bm, 0, 1) == [1, 1]  # the third candidate still holds its blocks
    filler = make_seq(9, list(range(20, 44)))  # 6 blocks: the rest of the pool
    allocate(bm, filler)
    assert pool(bm).num_free_blocks == 0
    assert not bm.can_swap_in(seqs[:2])
    bm.free(filler)
    assert bm.can_swap_in(seqs[:2])


def test_free_host_releases_a_swapped_sequence() -> None:
    bm = one_kind(num_blocks=8, block_size=4, num_host_blocks=6)
    seqs = _three_candidates(bm)
    bm.swap_out(seqs)
    bm.free_host(seqs[0])
    assert pool(bm).host_refs == {0: 2, 2: 1, 3: 1}
    for seq in seqs[1:]:
        bm.free_host(seq)
    assert pool(bm).host_refs == {} and sorted(pool(bm).host_free) == list(range(6))
    bm.free_host(seqs[0])  # nothing left: a no-op
    assert len(pool(bm).host_free) == 6
