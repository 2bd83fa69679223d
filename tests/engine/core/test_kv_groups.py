"""KV groups: a global and a sliding block manager behind the KVGroups facade, with exact
block ids and ref counts (block_size 4, window 4, at most 8 tokens per step)."""

from __future__ import annotations

import pytest

from engine.core.block_manager import NO_BLOCK, BlockManager
from engine.core.kv_groups import KVGroups, KVGroupSpec, group_layers, split_moves
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.core.sliding_blocks import SlidingBlockManager
from engine.sampling_params import SamplingParams

GLOBAL, SLIDING = 0, 1


def two_groups(num_blocks: int = 8, num_host_blocks: int = 0) -> KVGroups:
    full = BlockManager(num_blocks, 4, num_host_blocks, bytes_per_block=100, group=GLOBAL)
    sliding = SlidingBlockManager(num_blocks, 4, window=4, lookahead=8,
                                  num_host_blocks=num_host_blocks, bytes_per_block=300,
                                  group=SLIDING)
    return KVGroups([full, sliding], [KVGroupSpec((3,)), KVGroupSpec((0, 1, 2), 4)])


def make_seq(seq_id: int, tokens: list[int], index: int = 0) -> Sequence:
    return Sequence(seq_id, "r", index, list(tokens), len(tokens))


def step(kv: KVGroups, seq: Sequence, num_tokens: int) -> None:
    """What the engine does after a step that computed ``num_tokens`` of ``seq``."""
    seq.num_computed_tokens += num_tokens
    kv.commit_computed(seq)


def refs(bm: BlockManager, *block_ids: int) -> list[int]:
    return [bm.blocks[b].ref_count for b in block_ids]


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
    seq = make_seq(0, list(range(10)))
    assert kv.allocate(seq) == 0
    # The global group holds every token; the sliding one the first step's 8 only.
    assert seq.block_tables == [[0, 1, 2], [0, 1]]
    step(kv, seq, 8)
    # 8 computed, window 4: sliding block 0 (tokens 0-3) ends at 4 <= 8 - 4, released
    # still hashed (to the queue's tail); the global group keeps everything.
    assert seq.block_tables == [[0, 1, 2], [NO_BLOCK, 1]]
    assert refs(sliding, 0, 1) == [0, 1]
    assert sliding.blocks[0].block_hash is not None
    assert [b.block_id for b in sliding.free_queue] == [2, 3, 4, 5, 6, 7, 0]
    assert kv.can_append([seq]) and kv.append_slots(seq)
    assert seq.block_tables == [[0, 1, 2], [NO_BLOCK, 1, 2]]
    step(kv, seq, 2)
    assert seq.block_tables == [[0, 1, 2], [NO_BLOCK, 1, 2]]  # 10 - 4 = 6: block 1 kept

    child = make_seq(1, seq.token_ids, index=1)
    kv.fork(seq, child)
    assert child.block_tables == seq.block_tables
    assert refs(full, 0, 1, 2) == [2, 2, 2] and refs(sliding, 1, 2) == [2, 2]
    seq.append_token(50)
    child.append_token(51)
    assert kv.append_slots(seq)  # writes position 10, in the shared block 2 of each group
    assert seq.block_tables == [[0, 1, 3], [NO_BLOCK, 1, 3]]
    # Pool-wide ids: the sliding group's blocks come after the global group's 8.
    assert kv.take_cow_pairs() == [(2, 3), (2 + 8, 3 + 8)]
    assert refs(full, 2, 3) == [1, 1] and refs(sliding, 2, 3) == [1, 1]
    assert kv.append_slots(child)  # block 2 is its own now: no copy
    assert kv.take_cow_pairs() == []
    step(kv, seq, 1)
    step(kv, child, 1)
    # 11 computed: 11 - 4 = 7, block 1 (4-7) ends at 8 > 7: kept in both candidates.
    assert refs(sliding, 1) == [2]

    stats = kv.stats([seq, child])
    assert [(g.name, g.num_layers, g.num_blocks, g.num_used) for g in stats.groups] == [
        ("global", 1, 8, 4), ("sliding (window 4)", 3, 8, 3)]
    assert (stats.num_blocks, stats.num_used) == (16, 7)
    assert stats.used_bytes == 4 * 100 + 3 * 300
    assert stats.blocks_per_owner == {"r:0": 3 + 2, "r:1": 3 + 2}
    assert stats.headroom_tokens() == 4 * 4  # the global group's free blocks

    kv.free(seq)
    kv.free(child)
    assert seq.block_tables == [[], []] and child.block_tables == [[], []]
    assert full.num_free_blocks == sliding.num_free_blocks == 8
    assert all(b.ref_count == 0 for m in kv.managers for b in m.blocks)
    assert kv.stats().num_used == 0


def test_a_prefix_hit_needs_only_the_windows_blocks_cached():
    full = BlockManager(8, 4, group=GLOBAL)
    sliding = SlidingBlockManager(3, 4, window=4, lookahead=8, group=SLIDING)
    kv = KVGroups([full, sliding], [KVGroupSpec((1,)), KVGroupSpec((0,), 4)])
    first = make_seq(0, list(range(12)))
    kv.allocate(first)
    step(kv, first, 8)
    kv.append_slots(first)
    step(kv, first, 4)
    assert first.block_tables == [[0, 1, 2], [NO_BLOCK, NO_BLOCK, 2]]
    kv.free(first)
    # Oldest first, so the window's block (2) is evicted last.
    assert [b.block_id for b in sliding.free_queue] == [0, 1, 2]
    hog = make_seq(1, [200, 201, 202, 203])
    kv.allocate(hog)  # evicts sliding block 0 (tokens 0-3)
    kv.free(hog)
    assert sliding.blocks[0].block_hash is None

    # Next turn, 12 tokens + 5: the global group hits 3 blocks; a sliding hit at 12 needs
    # block 2 (tokens 8-11) only, still cached, though tokens 0-3 are gone.
    second = make_seq(2, list(range(12)) + [90, 91, 92, 93, 94])
    assert kv.allocate(second) == 12
    assert second.num_computed_tokens == 12
    assert second.block_tables == [[0, 1, 2, 3, 4], [NO_BLOCK, NO_BLOCK, 2, 0, 1]]
    assert refs(sliding, 0, 1, 2) == [1, 1, 1] and refs(full, 0, 1, 2) == [1, 1, 1]
    kv.free(second)

    # Now sliding block 1 (tokens 4-7) was reused as well: a 9-token prompt would hit 8
    # in the global group alone, but the sliding group can serve no prefix, so both
    # groups compute from token 0.
    third = make_seq(3, list(range(9)))
    assert full.hit_tokens(third) == 8 and sliding.hit_tokens(third) == 0
    assert kv.allocate(third) == 0
    assert third.num_computed_tokens == 0
    assert third.block_tables[GLOBAL] == [3, 4, 5]
    assert third.block_tables[SLIDING] == [1, 0]  # the first step's 8 tokens
    kv.free(third)


def test_sliding_hit_length_by_hand():
    sliding = SlidingBlockManager(8, 4, window=4, lookahead=8)
    seq = make_seq(0, list(range(17)))
    sliding.allocate(seq)
    for _ in range(2):
        seq.num_computed_tokens = min(seq.num_tokens, seq.num_computed_tokens + 8)
        sliding.commit_computed(seq)
        sliding.append_slots(seq)
    sliding.free(seq)
    again = make_seq(1, list(range(17)))
    # 4 full blocks looked up ((17 - 1) // 4); all cached -> the hit is 16, needing
    # block 3 only (first kept at 16 is (16 - 4) // 4 = 3).
    assert sliding.hit_tokens(again) == 16
    assert sliding.hit_tokens(again, limit=9) == 8


def test_allocation_fails_whole_when_one_group_is_short():
    kv = two_groups(num_blocks=4)
    full, sliding = kv.managers
    hog = make_seq(0, list(range(4)))
    kv.allocate(hog)  # global 1 block, sliding 1 block
    big = make_seq(1, list(range(100, 116)))  # global needs 4 > 3 free
    assert kv.allocate(big) is None
    assert big.block_tables == [[], []]
    assert full.num_free_blocks == 3 and sliding.num_free_blocks == 3


def test_swap_out_and_in_per_group():
    kv = two_groups(num_blocks=8, num_host_blocks=4)
    seq = make_seq(0, list(range(10)))
    kv.allocate(seq)
    step(kv, seq, 8)
    kv.append_slots(seq)
    step(kv, seq, 2)
    assert seq.block_tables == [[0, 1, 2], [NO_BLOCK, 1, 2]]
    assert kv.can_swap_out([seq])
    # Host ids run on too: the sliding group's host blocks come after the global 4.
    assert kv.swap_out([seq]) == [(0, 0), (1, 1), (2, 2), (1 + 8, 0 + 4), (2 + 8, 1 + 4)]
    assert seq.num_computed_tokens == 10
    assert all(b.ref_count == 0 for m in kv.managers for b in m.blocks)
    assert kv.can_swap_in([seq])
    pairs = kv.swap_in([seq])
    assert pairs == [(0, 2), (1, 3), (2, 4), (0 + 4, 2 + 8), (1 + 4, 3 + 8)]
    assert seq.block_tables == [[2, 3, 4], [NO_BLOCK, 2, 3]]
    per_group = split_moves(pairs, kv.host_offsets, kv.device_offsets, group_of_first=False)
    assert [len(p) for p in per_group] == [3, 2]


def test_scheduler_keeps_the_window_bound_through_chunks():
    kv = two_groups(num_blocks=16)
    scheduler = Scheduler(kv, max_num_batched_tokens=8)
    group = scheduler.add_request("r", list(range(30)), SamplingParams(max_tokens=4))
    seq = group.seqs[0]
    while seq.num_computed_tokens < seq.num_tokens:
        out = scheduler.schedule()
        assert out.num_batched_tokens <= 8
        scheduler.mark_computed(out)
        held = [b for b in seq.block_tables[SLIDING] if b != NO_BLOCK]
        # The window's blocks (at most 2 for window 4) plus room for the next chunk's
        # tokens not yet computed: never the whole prompt.
        assert len(held) <= 2 + 2
        assert len(seq.block_tables[GLOBAL]) == 8
    scheduler.finish_seq(seq, "stop")
    assert all(b.ref_count == 0 for m in kv.managers for b in m.blocks)


@pytest.mark.parametrize(("window", "lookahead"), [(0, 8), (4, 0)])
def test_sliding_manager_checks_its_arguments(window, lookahead):
    with pytest.raises(ValueError, match="window|lookahead"):
        SlidingBlockManager(8, 4, window=window, lookahead=lookahead)
