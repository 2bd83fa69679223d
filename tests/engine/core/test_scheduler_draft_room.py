"""Drafts dropped for room give their blocks back: a request whose candidates' drafts are
halved to fit the pool, one candidate then left out of the step (the step's sequence
limit), must not keep the block an earlier step took for that candidate's draft. The
case hypothesis found in test_spec_state_machine.py, replayed with exact block ids."""

from __future__ import annotations

import itertools

from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.scheduler import Scheduler
from engine.sampling_params import SamplingParams

BLOCK_SIZE = 2


def step(scheduler: Scheduler, tokens, drafts: dict[int, int]) -> None:
    """One step: every sampled candidate keeps none of its drafts and takes the model's
    next token; then sequence ``id`` gets ``drafts[id]`` drafts (copies of its tokens)."""
    out = scheduler.schedule()
    scheduler.kv.take_cow_pairs()
    sampled = [item.seq for item in out.scheduled if item.samples]
    scheduler.mark_computed(out)
    for seq in sampled:
        request = scheduler.requests[seq.request_id]
        for s in scheduler.fork(request) if seq.needs_fork else [seq]:
            s.append_token(next(tokens))
            scheduler.settle_drafts(s)
    for request in scheduler.requests.values():
        for s in request.live_seqs:
            if s.seq_id in drafts:
                s.draft_token_ids = [s.token_ids[i % s.num_tokens]
                                     for i in range(drafts[s.seq_id])]


def test_a_candidate_left_out_after_its_drafts_were_halved_holds_no_draft_block():
    kv = KVCacheManager.build([KVGroupSpec((0,))], [14], BLOCK_SIZE, lookahead=8)
    scheduler = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=8, max_model_len=40)
    for i, (prompt, n) in enumerate([([0], 1), ([0], 2), ([0, 0, 0], 2), ([0, 0, 0], 1)]):
        scheduler.add_request(f"r{i}", prompt, SamplingParams(n=n, max_tokens=None))
    tokens = itertools.count(10)
    step(scheduler, tokens, {5: 1, 3: 1})  # r2's second candidate is sequence 5
    step(scheduler, tokens, {2: 2})
    [first, second] = scheduler.requests["r2"].live_seqs
    assert (second.seq_id, kv.block_tables(second)[0]) == (5, [2, 3, 8])  # 8: its draft's
    # r2 both drafting does not fit: the drafts are halved (5's to none), and with four
    # sequences already in the step, 5 is left out. Its draft's block goes back.
    step(scheduler, tokens, {})
    assert second.draft_token_ids == [] and kv.block_tables(second)[0] == [2, 3]
    assert kv.block_tables(first)[0] == [2, 7, 8]
    for request in scheduler.requests.values():
        for s in request.live_seqs:
            assert len(kv.block_tables(s)[0]) <= kv.managers[0].blocks_needed(
                s.num_tokens_with_drafts)
