"""Beams are copy-on-write forks of one another in the paged KV cache: after every step
the pool's reference counts and its free queue are exactly what the running beams'
block tables hold (a dropped beam gave back only its own references), the block map
(kv_stats) shows the shared blocks with their owners, and at the end every block is
free."""

from __future__ import annotations

from collections import Counter

import pytest

from engine.beam.params import BeamSearchParams
from tests.engine.tiny_models import random_prompt

BLOCK = 8


@pytest.fixture(scope="module")
def engine(tiny_dir):
    from engine import LLM

    # Small blocks: a 12-token prompt leaves a partial tail that the forks copy on write.
    return LLM(str(tiny_dir), num_gpu_blocks=96, kv_cache_dtype="float32",
               block_size=BLOCK).engine


def held(engine, request_id):
    """Each running beam with its table in the (one) KV group, and the count of beams
    holding each block."""
    request = engine.scheduler.requests.get(request_id)
    beams = [] if request is None else request.live_seqs
    null = engine.kv_cache.pools[0].null_id
    tables = {s: [b for b in engine.kv_cache.block_tables(s)[0] if b != null] for s in beams}
    return tables, Counter(b for table in tables.values() for b in table)


def check_pool(engine, request_id):
    pool = engine.kv_cache.pools[0]
    tables, refs = held(engine, request_id)
    assert {b.block_id: b.ref_count for b in pool.blocks if b.ref_count} == dict(refs)
    assert {b.block_id for b in pool.free_queue} == set(range(pool.num_blocks)) - set(refs)
    stats = engine.kv_stats()
    shared = {b for b, n in refs.items() if n > 1}
    assert stats.num_shared == len(shared)
    owners = {info.block_id: set(info.owners) for info in stats.blocks if info.owners}
    assert owners == {b: {s.label for s, t in tables.items() if b in t} for b in refs}
    assert all(info.state == "shared" for info in stats.blocks if info.block_id in shared)
    return tables, refs


def test_forks_share_and_drops_free_only_their_own(engine):
    request_id = engine.add_request(random_prompt(7, 12), BeamSearchParams(4, 20))
    saw_drop = saw_fork = saw_shared = False
    while engine.has_unfinished_requests():
        before, _ = held(engine, request_id)
        engine.step()
        if not engine.has_unfinished_requests():
            break
        after, refs = check_pool(engine, request_id)
        dropped = [s for s in before if s not in after]
        forked = [s for s in after if s not in before]
        saw_drop |= bool(dropped)
        saw_fork |= bool(forked)
        saw_shared |= any(n > 1 for n in refs.values())
        for seq in dropped:
            # Its blocks are gone from the pool's counts unless a surviving beam holds them.
            assert all(refs.get(b, 0) == sum(b in t for t in after.values())
                       for b in before[seq])
        for child in forked:
            # A fork holds its parent's blocks: the same table as a beam that ran on.
            assert any(after[child] == t for s, t in after.items() if s is not child)
    assert saw_drop and saw_fork and saw_shared
    pool = engine.kv_cache.pools[0]
    assert all(b.ref_count == 0 for b in pool.blocks)
    assert len(pool.free_queue) == pool.num_blocks
    assert engine.kv_stats().num_used == 0


def test_abort_frees_every_beam(engine):
    request_id = engine.add_request(random_prompt(8, 9), BeamSearchParams(3, 30))
    for _ in range(6):
        engine.step()
    assert len(held(engine, request_id)[0]) == 3
    output = engine.abort(request_id)
    assert output is not None and output.finished
    assert not engine.has_unfinished_requests()
    pool = engine.kv_cache.pools[0]
    assert all(b.ref_count == 0 for b in pool.blocks)
    assert len(pool.free_queue) == pool.num_blocks


@pytest.mark.parametrize("config", [{"num_gpu_blocks": 6}, {"max_model_len": 40}])
def test_a_search_past_the_pool_or_context_ends_with_context(tiny_dir, config):
    """Out of blocks (the scheduler ends the lone request) or at the context's end, a
    search ends with the beams it has, every block freed."""
    from engine import LLM

    fields = {"num_gpu_blocks": 64, "kv_cache_dtype": "float32", "block_size": BLOCK, **config}
    llm = LLM(str(tiny_dir), **fields)
    [out] = llm.beam_search([[1, 2, 3, 4, 5]], BeamSearchParams(4, 200))
    assert len(out.outputs) == 4
    assert {o.finish_reason for o in out.outputs} == {"context"}
    if "max_model_len" in config:
        assert all(5 + len(o.token_ids) == 40 for o in out.outputs)
    assert [o.score for o in out.outputs] == sorted((o.score for o in out.outputs),
                                                    reverse=True)
    assert llm.kv_stats().num_used == 0
    assert not llm.engine.has_unfinished_requests()
