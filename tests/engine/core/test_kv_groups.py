"""KV groups: a global and a sliding manager, each over its own pool, behind the
KV cache manager, with exact block ids (per group), ref counts and free-queue order
(block_size 4, window 4, at most 8 tokens per step)."""

from __future__ import annotations

import pytest

from engine.core.block_pool import BlockPool
from engine.core.kind_managers import FullAttentionManager, SingleKindManager, SlidingWindowManager
from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec, group_layers
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.sampling_params import SamplingParams
from tests.engine.core.admission import allocate, fork

GLOBAL, SLIDING = 0, 1


def two_groups(num_blocks: int = 8, num_host_blocks: int = 0,
               sliding_blocks: int | None = None) -> KVCacheManager:
    full = FullAttentionManager(BlockPool(num_blocks, 4, num_host_blocks, bytes_per_block=100),
                                GLOBAL)
    sliding = SlidingWindowManager(
        BlockPool(sliding_blocks or num_blocks, 4, num_host_blocks, bytes_per_block=300),
        window=4, lookahead=8, group=SLIDING)
    return KVCacheManager([full, sliding], [KVGroupSpec((3,)), KVGroupSpec((0, 1, 2), 4)])


def make_seq(seq_id: int, tokens: list[int], index: int = 0) -> Sequence:
    return Sequence(seq_id, "r", index, list(tokens), len(tokens))


def step(kv: KVCacheManager, seq: Sequence, num_tokens: int) -> None:
    """What the engine does after a step that computed ``num_tokens`` of ``seq``."""
    seq.num_computed_tokens += num_tokens
    kv.commit_computed(seq)


def refs(manager: SingleKindManager, *block_ids: int) -> list[int]:
    return [manager.pool.blocks[b].ref_count for b in block_ids]


def hit(manager: SingleKindManager, seq: Sequence, limit: int | None = None) -> int:
    return manager.longest_hit(manager.lookup(seq), limit)


def test_group_layers_puts_full_attention_first():
    windows = [64, 64, None, 64, 64, None]
    assert group_layers(windows, 4096) == [KVGroupSpec((2, 5)), KVGroupSpec((0, 1, 3, 4), 64)]
    assert group_layers([None, None], 4096) == [KVGroupSpec((0, 1))]
    assert group_layers([16, 16], 4096) == [KVGroupSpec((0, 1), 16)]  # Mistral v0.1
    assert group_layers([4096, None], 1024) == [KVGroupSpec((0, 1))]  # hides nothing
    assert KVGroupSpec((0,), 64).name == "sliding (window 64)"


def test_allocation_release_fork_cow_and_free_in_both_groups():
    kv = two_groups()
    full, sliding = kv.managers
    null = sliding.pool.null_id
    assert null == 8  # the block after the pool's 8
    seq = make_seq(0, list(range(10)))
    assert allocate(kv, seq) == 0
    # The global group holds every token; the sliding one the first step's 8 only.
    assert kv.block_tables(seq) == [[0, 1, 2], [0, 1]]
    step(kv, seq, 8)
    # 8 computed, window 4: the next token reads keys 5..8, 8 - 4 + 1 = 5 are skipped, so
    # sliding block 0 (tokens 0-3) is released still hashed (to the queue's tail); the
    # global group keeps everything.
    assert kv.block_tables(seq) == [[0, 1, 2], [null, 1]]
    assert refs(sliding, 0, 1) == [0, 1]
    assert sliding.pool.blocks[0].block_hash is not None
    assert [b.block_id for b in sliding.pool.free_queue] == [2, 3, 4, 5, 6, 7, 0]
    assert kv.can_append([seq]) and kv.append_slots(seq)
    assert kv.block_tables(seq) == [[0, 1, 2], [null, 1, 2]]
    step(kv, seq, 2)
    assert kv.block_tables(seq) == [[0, 1, 2], [null, 1, 2]]  # 7 skipped: block 1 (4-7) read

    child = make_seq(1, seq.token_ids, index=1)
    fork(kv, seq, child)
    assert kv.block_tables(child) == kv.block_tables(seq)
    assert refs(full, 0, 1, 2) == [2, 2, 2] and refs(sliding, 1, 2) == [2, 2]
    seq.append_token(50)
    child.append_token(51)
    assert kv.append_slots(seq)  # writes position 10, in the shared block 2 of each group
    assert kv.block_tables(seq) == [[0, 1, 3], [null, 1, 3]]
    # Each group's pairs in its own ids.
    assert kv.take_cow_pairs() == [[(2, 3)], [(2, 3)]]
    assert refs(full, 2, 3) == [1, 1] and refs(sliding, 2, 3) == [1, 1]
    assert kv.append_slots(child)  # block 2 is its own now: no copy
    assert kv.take_cow_pairs() == [[], []]
    step(kv, seq, 1)
    step(kv, child, 1)
    # 11 computed: the next token reads keys 8..11; block 1 (4-7) is released by both.
    assert refs(sliding, 1) == [0]
    assert kv.block_tables(seq)[SLIDING] == [null, null, 3]
    assert kv.block_tables(child)[SLIDING] == [null, null, 2]

    stats = kv.stats([seq, child])
    assert [(g.name, g.num_layers, g.num_blocks, g.num_used) for g in stats.groups] == [
        ("global", 1, 8, 4), ("sliding (window 4)", 3, 8, 2)]
    assert (stats.num_blocks, stats.num_used) == (16, 6)
    assert stats.used_bytes == 4 * 100 + 2 * 300
    assert stats.blocks_per_owner == {"r:0": 3 + 1, "r:1": 3 + 1}
    assert stats.headroom_tokens() == 4 * 4  # the global group's free blocks
    assert [(b.group, b.block_id) for b in stats.blocks if b.ref_count] == [
        (GLOBAL, 0), (GLOBAL, 1), (GLOBAL, 2), (GLOBAL, 3), (SLIDING, 2), (SLIDING, 3)]

    kv.free(seq)
    kv.free(child)
    assert kv.block_tables(seq) == [[], []] and kv.block_tables(child) == [[], []]
    assert full.pool.num_free_blocks == sliding.pool.num_free_blocks == 8
    assert all(b.ref_count == 0 for p in kv.pools for b in p.blocks)
    assert kv.stats().num_used == 0


def test_a_prefix_hit_needs_only_the_windows_blocks_cached():
    kv = two_groups(num_blocks=8, sliding_blocks=3)
    full, sliding = kv.managers
    null = sliding.pool.null_id
    assert null == 3
    first = make_seq(0, list(range(12)))
    allocate(kv, first)
    step(kv, first, 8)
    kv.append_slots(first)
    step(kv, first, 4)
    assert kv.block_tables(first) == [[0, 1, 2], [null, null, 2]]
    kv.free(first)
    # Oldest first, so the window's block (2) is evicted last.
    assert [b.block_id for b in sliding.pool.free_queue] == [0, 1, 2]
    hog = make_seq(1, [200, 201, 202, 203])
    allocate(kv, hog)  # evicts sliding block 0 (tokens 0-3)
    kv.free(hog)
    assert sliding.pool.blocks[0].block_hash is None

    # Next turn, 12 tokens + 5: the global group hits 3 blocks; a sliding hit at 12 needs
    # block 2 (tokens 8-11) only, still cached, though tokens 0-3 are gone.
    second = make_seq(2, list(range(12)) + [90, 91, 92, 93, 94])
    assert allocate(kv, second) == 12
    assert second.num_computed_tokens == 12
    assert kv.block_tables(second) == [[0, 1, 2, 3, 4], [null, null, 2, 0, 1]]
    assert refs(sliding, 0, 1, 2) == [1, 1, 1] and refs(full, 0, 1, 2) == [1, 1, 1]
    kv.free(second)

    # Now sliding block 1 (tokens 4-7) was reused as well: a 9-token prompt would hit 8
    # in the global group alone, but the sliding group can serve no prefix, so both
    # groups compute from token 0.
    third = make_seq(3, list(range(9)))
    assert hit(full, third) == 8 and hit(sliding, third) == 0
    assert allocate(kv, third) == 0
    assert third.num_computed_tokens == 0
    assert kv.block_tables(third)[GLOBAL] == [3, 4, 5]
    assert kv.block_tables(third)[SLIDING] == [1, 0]  # the first step's 8 tokens
    kv.free(third)


def test_sliding_hit_length_by_hand():
    sliding = SlidingWindowManager(BlockPool(8, 4), window=4, lookahead=8)
    kv = KVCacheManager([sliding], [KVGroupSpec((0,), 4)])
    seq = make_seq(0, list(range(17)))
    allocate(kv, seq)
    for _ in range(2):
        seq.num_computed_tokens = min(seq.num_tokens, seq.num_computed_tokens + 8)
        kv.commit_computed(seq)
        kv.append_slots(seq)
    kv.free(seq)
    again = make_seq(1, list(range(17)))
    # 4 full blocks looked up ((17 - 1) // 4); all cached -> the hit is 16, needing
    # block 3 only (first kept at 16 is (16 - 4 + 1) // 4 = 3).
    assert hit(sliding, again) == 16
    assert hit(sliding, again, limit=9) == 8


def test_allocation_fails_whole_when_one_group_is_short():
    kv = two_groups(num_blocks=4)
    full, sliding = kv.managers
    hog = make_seq(0, list(range(4)))
    allocate(kv, hog)  # global 1 block, sliding 1 block
    big = make_seq(1, list(range(100, 116)))  # global needs 4 > 3 free
    assert allocate(kv, big) is None
    assert kv.block_tables(big) == [[], []]
    assert full.pool.num_free_blocks == 3 and sliding.pool.num_free_blocks == 3


def test_swap_out_and_in_per_group():
    kv = two_groups(num_blocks=8, num_host_blocks=4)
    seq = make_seq(0, list(range(10)))
    allocate(kv, seq)
    step(kv, seq, 8)
    kv.append_slots(seq)
    step(kv, seq, 2)
    null = kv.pools[SLIDING].null_id
    assert kv.block_tables(seq) == [[0, 1, 2], [null, 1, 2]]
    assert kv.can_swap_out([seq])
    # Each group's (device, host) pairs in its own ids; the null entry moves nothing.
    assert kv.swap_out([seq]) == [[(0, 0), (1, 1), (2, 2)], [(1, 0), (2, 1)]]
    assert seq.num_computed_tokens == 10
    assert all(b.ref_count == 0 for p in kv.pools for b in p.blocks)
    assert kv.can_swap_in([seq])
    assert kv.swap_in([seq]) == [[(0, 2), (1, 3), (2, 4)], [(0, 2), (1, 3)]]
    assert kv.block_tables(seq) == [[2, 3, 4], [null, 2, 3]]


def test_scheduler_keeps_the_window_bound_through_chunks():
    kv = two_groups(num_blocks=16)
    scheduler = Scheduler(kv, max_num_batched_tokens=8)
    request = scheduler.add_request("r", list(range(30)), SamplingParams(max_tokens=4))
    seq = request.seqs[0]
    while seq.num_computed_tokens < seq.num_tokens:
        out = scheduler.schedule()
        assert out.num_batched_tokens <= 8
        scheduler.mark_computed(out)
        held = [b for b in kv.block_tables(seq)[SLIDING] if b != kv.pools[SLIDING].null_id]
        # The window's blocks (at most 2 for window 4) plus room for the next chunk's
        # tokens not yet computed: never the whole prompt.
        assert len(held) <= 2 + 2
        assert len(kv.block_tables(seq)[GLOBAL]) == 8
    scheduler.finish_seq(seq, "stop")
    assert all(b.ref_count == 0 for p in kv.pools for b in p.blocks)


@pytest.mark.parametrize(("window", "lookahead"), [(0, 8), (4, 0)])
def test_sliding_manager_checks_its_arguments(window, lookahead):
    with pytest.raises(ValueError, match="window|lookahead"):
        SlidingWindowManager(BlockPool(8, 4), window=window, lookahead=lookahead)
