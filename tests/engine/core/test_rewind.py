"""Scheduler.rewind: a draft model's sequence cut back after its rejected drafts keeps
the K/V before the cut and gives back the blocks past it, and never writes again into a
block the prefix cache holds."""

from __future__ import annotations

import pytest

from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.scheduler import Scheduler
from engine.sampling_params import SamplingParams

BS = 4


def running(tokens: list[int]):
    kv = KVCacheManager.build([KVGroupSpec((0,))], [8], BS)
    scheduler = Scheduler(kv, max_num_batched_tokens=64)
    request = scheduler.add_request("r", tokens, SamplingParams(max_tokens=None))
    out = scheduler.schedule()
    scheduler.mark_computed(out)
    return kv, scheduler, request.seqs[0]


def test_a_cut_inside_the_tail_block_keeps_it():
    kv, scheduler, seq = running(list(range(6)))  # blocks 0 (full, cached) and 1
    seq.append_token(6)
    table = list(kv.block_tables(seq)[0])
    assert table == [0, 1] and seq.num_computed_tokens == 6
    scheduler.rewind(seq, 5)
    assert seq.token_ids == [0, 1, 2, 3, 4] and seq.num_computed_tokens == 5
    assert kv.block_tables(seq)[0] == [0, 1]
    assert len(seq.block_hashes) == 1


def test_a_cut_into_a_cached_block_recomputes_it_in_a_new_block():
    kv, scheduler, seq = running(list(range(9)))  # blocks 0, 1 full (cached), 2
    pool = kv.pools[0]
    assert kv.block_tables(seq)[0] == [0, 1, 2] and pool.blocks[1].block_hash is not None
    scheduler.rewind(seq, 6)  # position 6 lies in block 1, which is cached
    assert seq.num_computed_tokens == 4  # from block 1's start
    assert kv.block_tables(seq)[0] == [0]
    assert len(seq.block_hashes) == 1
    # Block 1 stays in the prefix cache (ref count 0, at the free queue's tail), block 2
    # is a plain free block again, at its head.
    assert pool.blocks[1].ref_count == 0 and pool.blocks[1].block_hash is not None
    queue = [b.block_id for b in pool.free_queue]
    assert queue[0] == 2 and queue[-1] == 1
    seq.token_ids += [60, 70]
    assert kv.append_slots(seq)
    assert kv.block_tables(seq)[0] == [0, 2]  # a new block for the new tokens


def test_a_cut_must_keep_a_token():
    _, scheduler, seq = running([1, 2, 3])
    with pytest.raises(ValueError, match="cannot keep 0 of 3"):
        scheduler.rewind(seq, 0)
