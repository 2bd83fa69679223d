"""The first tokens of a cached block copied into a next prompt's block
(engine/core/partial_blocks.py): a leaving sequence's partial last block, and a full
block a prompt parts from inside; exact block ids, ref counts and free-queue order; the
index by parent, images, candidates, swaps, the tier below, several KV groups, and never
with linear state."""

from __future__ import annotations

from engine.core.block_hashes import hash_block
from engine.core.block_pool import BlockPool
from engine.core.kind_managers import FullAttentionManager, SlidingWindowManager
from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.linear_state_manager import LinearStateManager
from engine.core.partial_blocks import find_partial, partial_hash
from engine.core.sequence import Sequence
from tests.engine.core.admission import allocate, fork


def make_seq(seq_id: int, tokens: list[int], index: int = 0) -> Sequence:
    return Sequence(seq_id, "r", index, list(tokens), len(tokens))


def one_kind(num_blocks: int = 8, block_size: int = 4, **kw) -> KVCacheManager:
    return KVCacheManager.build([KVGroupSpec((0,))], [num_blocks], block_size, **kw)


def finish(kv: KVCacheManager, seq: Sequence, computed: int) -> None:
    """A reply that ends: ``computed`` tokens have K/V (the last sampled one never)."""
    seq.num_computed_tokens = computed
    kv.commit_computed(seq)
    kv.free(seq)


def queue(kv: KVCacheManager, g: int = 0) -> list[int]:
    return [b.block_id for b in kv.pools[g].free_queue]


def test_partial_keys_are_apart_from_full_block_hashes() -> None:
    assert partial_hash(None, [1, 2, 3, 4]) != hash_block(None, [1, 2, 3, 4])
    assert partial_hash(None, [1, 2]) == partial_hash(None, (1, 2))
    first = hash_block(None, [1, 2, 3, 4])
    assert partial_hash(first, [5]) != partial_hash(None, [5])


def test_the_run_found_never_holds_the_prompts_last_token() -> None:
    kv = one_kind()
    seq = make_seq(0, [1, 2, 3, 4, 5, 6, 7, 8])
    allocate(kv, seq)
    finish(kv, seq, 8)  # blocks 0 and 1 full and cached, block 1 under block 0's hash
    pool = kv.pools[0]
    assert pool.children == {b"": {0: pool.blocks[0]},
                              pool.blocks[0].block_hash: {1: pool.blocks[1]}}
    again = make_seq(1, [1, 2, 3, 4, 5, 6, 7])
    again.block_hashes = [pool.blocks[0].block_hash]
    # 5, 6, 7 are in block 1, but 7 is the prompt's last: 5 and 6 only.
    assert find_partial(kv.pools, again, 4) == (2, [pool.blocks[1]])


def test_a_next_turn_gets_the_partial_block_copied_and_skips_its_tokens() -> None:
    kv = one_kind()
    pool = kv.pools[0]
    turn1 = make_seq(0, [1, 2, 3, 4, 5, 6, 7])
    assert allocate(kv, turn1) == 0
    assert kv.block_tables(turn1)[0] == [0, 1]
    turn1.append_token(8)  # the reply's last token: sampled, never computed
    finish(kv, turn1, 7)
    # Block 1 holds 5, 6, 7 and stays cached at the queue's tail, released before the
    # full block 0 (a chain's tail is evicted first).
    assert pool.blocks[1].token_ids == (5, 6, 7)
    assert pool.cached[partial_hash(pool.blocks[0].block_hash, [5, 6, 7])] is pool.blocks[1]
    assert queue(kv) == [2, 3, 4, 5, 6, 7, 1, 0]

    turn2 = make_seq(1, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert allocate(kv, turn2) == 7
    assert turn2.num_computed_tokens == 7
    # Block 0 is shared again, block 2 is new and gets block 1's K/V; block 1 is held
    # until the copy is drained, then goes back, still cached, to the tail.
    assert kv.block_tables(turn2)[0] == [0, 2, 3]
    assert [b.ref_count for b in pool.blocks[:4]] == [1, 1, 1, 1]
    assert queue(kv) == [4, 5, 6, 7]
    assert kv.take_cow_pairs() == [[(1, 2)]]
    assert pool.blocks[1].ref_count == 0 and pool.blocks[1].token_ids == (5, 6, 7)
    assert queue(kv) == [4, 5, 6, 7, 1]
    assert (kv.prefix_hit_tokens, kv.prefix_query_tokens) == (7, 7 + 10)
    # Its tokens from 7 on are written into block 2, which no cache entry names.
    assert pool.blocks[2].block_hash is None


def test_a_prompt_that_parts_inside_a_cached_block_gets_the_shared_tokens_copied() -> None:
    kv = one_kind()
    pool = kv.pools[0]
    seq = make_seq(0, [1, 2, 3, 4, 5, 6, 7])
    allocate(kv, seq)
    finish(kv, seq, 7)  # block 1 keeps 5, 6, 7 (partial)
    other = make_seq(1, [1, 2, 3, 4, 5, 9, 9])  # 5 matches, then it differs
    assert allocate(kv, other) == 5
    assert kv.block_tables(other)[0] == [0, 2]
    assert kv.take_cow_pairs() == [[(1, 2)]]
    other.num_computed_tokens = 7
    other.append_token(3)
    kv.commit_computed(other)
    kv.free(other)  # block 2 now keeps 5, 9, 9: two children of block 0
    assert list(pool.children[pool.blocks[0].block_hash]) == [1, 2]
    # A full block is found by its first tokens too: a new prompt with block 0, then 5, 9.
    full = make_seq(2, [1, 2, 3, 4, 5, 9, 9, 9, 8, 8])
    assert allocate(kv, full) == 7  # 5, 9, 9 copied from block 2
    assert kv.take_cow_pairs() == [[(2, 3)]]
    finish(kv, full, 10)  # its block 3 is full (5, 9, 9, 9) and cached after block 0
    assert pool.blocks[3].token_ids == (5, 9, 9, 9)
    parted = make_seq(3, [1, 2, 3, 4, 5, 9, 9, 9, 1])
    assert allocate(kv, parted) == 8  # block 3 whole
    assert kv.take_cow_pairs() == [[]]
    parted2 = make_seq(4, [1, 2, 3, 4, 5, 9, 9, 1, 1])
    # 5, 9, 9 from the first listed of the longest (block 2 and block 3 both hold them).
    assert allocate(kv, parted2) == 7
    assert kv.take_cow_pairs() == [[(2, kv.block_tables(parted2)[0][1])]]
    # Exactly the cached tokens and nothing after: the last one is recomputed instead.
    same = make_seq(5, [1, 2, 3, 4, 5, 6, 7])
    assert allocate(kv, same) == 6


def test_an_evicted_block_leaves_the_index() -> None:
    kv = one_kind(num_blocks=3)
    pool = kv.pools[0]
    seq = make_seq(0, [1, 2, 3, 4, 5, 6])
    allocate(kv, seq)
    finish(kv, seq, 6)
    assert set(pool.children) == {b"", pool.blocks[0].block_hash}
    hog = make_seq(1, list(range(20, 31)))  # three blocks: every cached one evicted
    allocate(kv, hog)
    assert pool.children == {} and pool.cached == {}
    assert all(b.after is None and b.images == () for b in pool.blocks)


def test_a_partial_block_another_candidate_still_holds_is_not_kept() -> None:
    kv = one_kind(num_blocks=10)
    pool = kv.pools[0]
    parent = make_seq(0, [1, 2, 3, 4, 5, 6])
    allocate(kv, parent)
    parent.num_computed_tokens = 6
    kv.commit_computed(parent)
    children = [make_seq(1 + i, parent.token_ids, index=1 + i) for i in range(3)]
    for child in children:
        fork(kv, parent, child)
    assert pool.blocks[1].ref_count == 4
    kv.free(children[0])  # three holders left: block 1 may still be written
    assert pool.blocks[1].block_hash is None and pool.blocks[1].ref_count == 3
    # Each remaining candidate's first token makes its own copy of the shared block.
    for token, seq in zip((70, 71), children[1:], strict=True):
        seq.append_token(token)
        assert kv.append_slots(seq)
        seq.num_computed_tokens = 7
    assert [kv.block_tables(c)[0] for c in children[1:]] == [[0, 2], [0, 3]]
    assert kv.take_cow_pairs() == [[(1, 2), (1, 3)]]
    for seq in children[1:]:
        seq.append_token(99)
        kv.free(seq)
    # Each kept its own tokens; the parent, last holder of block 1, keeps 5, 6.
    kv.free(parent)
    assert {pool.blocks[b].token_ids for b in (1, 2, 3)} == {(5, 6), (5, 6, 70), (5, 6, 71)}
    assert all(b.ref_count == 0 for b in pool.blocks)
    again = make_seq(9, [1, 2, 3, 4, 5, 6, 71, 5])
    assert allocate(kv, again) == 7
    assert kv.take_cow_pairs() == [[(3, kv.block_tables(again)[0][1])]]


def test_holding_the_source_needs_room_or_the_hit_goes_without_it() -> None:
    kv = one_kind(num_blocks=3)
    seq = make_seq(0, [1, 2, 3, 4, 5, 6])
    allocate(kv, seq)
    finish(kv, seq, 6)  # block 0 full, block 1 partial (5, 6): both cached
    filler = make_seq(1, [50])
    allocate(kv, filler)  # takes block 2
    # Reviving block 0 and holding block 1 would leave no block for the new one.
    turn2 = make_seq(2, [1, 2, 3, 4, 5, 6, 7])
    assert allocate(kv, turn2) == 4
    assert kv.block_tables(turn2)[0] == [0, 1]  # block 1 evicted: it is the new block now
    assert kv.take_cow_pairs() == [[]] and kv.pools[0].cached.keys() == {
        kv.pools[0].blocks[0].block_hash}


def test_a_swap_keeps_no_partial_block() -> None:
    kv = one_kind(num_host_blocks=4)
    seq = make_seq(0, [1, 2, 3, 4, 5, 6])
    allocate(kv, seq)
    seq.num_computed_tokens = 6
    kv.commit_computed(seq)
    assert kv.swap_out([seq]) == [[(0, 0), (1, 1)]]
    assert set(kv.pools[0].cached.values()) == {kv.pools[0].blocks[0]}


def test_prefix_caching_off_keeps_nothing() -> None:
    kv = one_kind(enable_prefix_caching=False)
    seq = make_seq(0, [1, 2, 3, 4, 5, 6])
    allocate(kv, seq)
    finish(kv, seq, 6)
    assert kv.pools[0].cached == {}
    assert allocate(kv, make_seq(1, [1, 2, 3, 4, 5, 6, 7])) == 0


class DictTier:
    def __init__(self) -> None:
        self.saved: set[bytes] = set()

    def has(self, block_hash: bytes) -> bool:
        return block_hash in self.saved

    def load(self, block_hash: bytes, token_ids: tuple[int, ...]) -> bytes | None:
        return None


def test_the_tier_below_never_gets_a_partial_block() -> None:
    kv = one_kind(num_blocks=3, lower_tiers=[DictTier()])
    pool, tier = kv.pools[0], kv.tiers[0]
    seq = make_seq(0, [1, 2, 3, 4, 5, 6])
    allocate(kv, seq)
    finish(kv, seq, 6)
    assert [s[0] for s in tier.unsaved(pool)] == [0]  # the full block only
    allocate(kv, make_seq(1, [9] * 12))  # evicts both cached blocks
    saves = kv.take_saves()
    assert [s[0] for s in saves[0]] == [0]
    assert pool.cached == {}


def two_groups() -> KVCacheManager:
    full = FullAttentionManager(BlockPool(8, 4), 0)
    sliding = SlidingWindowManager(BlockPool(8, 4), window=4, lookahead=8, group=1)
    return KVCacheManager([full, sliding], [KVGroupSpec((1,)), KVGroupSpec((0,), 4)])


def test_both_groups_copy_their_partial_block_or_neither_does() -> None:
    kv = two_groups()
    tokens = list(range(10))
    seq = make_seq(0, tokens)
    allocate(kv, seq)
    seq.num_computed_tokens = 8  # one step's 8 tokens, then room for the next chunk
    kv.commit_computed(seq)
    assert kv.append_slots(seq)
    finish(kv, seq, 10)  # blocks 0, 1 full; block 2 holds 8, 9 in both groups
    null = kv.pools[1].null_id
    turn2 = make_seq(1, tokens + [10, 11, 12])
    assert allocate(kv, turn2) == 10
    # 10 computed, window 4: the sliding group reads from token 7 on, block 1.
    assert kv.block_tables(turn2) == [[0, 1, 3, 4], [null, 1, 3, 4]]
    assert kv.take_cow_pairs() == [[(2, 3)], [(2, 3)]]
    kv.free(turn2)  # nothing computed past the hit: nothing new kept

    # One group lost its copy (evicted): neither group reuses one.
    sliding = kv.pools[1]
    del sliding.cached[sliding.blocks[2].block_hash]
    sliding.blocks[2].block_hash = sliding.blocks[2].token_ids = None
    turn3 = make_seq(2, tokens + [10, 11, 12])
    assert allocate(kv, turn3) == 8
    assert kv.take_cow_pairs() == [[], []]


def test_a_model_with_linear_state_never_keeps_a_partial_block() -> None:
    specs = [KVGroupSpec((1,)), KVGroupSpec((0,), linear=True)]
    kv = KVCacheManager.build(specs, [8, 6], 4, live_state_slots=2)
    assert isinstance(kv.managers[1], LinearStateManager) and not kv.reuse_partial
    seq = make_seq(0, [1, 2, 3, 4, 5, 6])
    allocate(kv, seq)
    kv.take_cow_pairs()
    finish(kv, seq, 6)
    pool = kv.pools[0]
    assert all(not pool.is_partial(b) for b in pool.cached.values())
    # The snapshot after block 0 serves 4 tokens; the 5, 6 after it are computed again.
    assert allocate(kv, make_seq(1, [1, 2, 3, 4, 5, 6, 7])) == 4
