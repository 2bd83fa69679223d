"""Random speculative steps through the real Scheduler over a KV cache manager (global
attention alone, or with a sliding-window group), with no model: the machine plays the
runner and the verifier. Requests (some with candidates) arrive; each step drafts a few
tokens for every decoding candidate, schedules, and keeps a random number of each
candidate's drafts (every kept draft counted as the token after it goes in, the rest
rolled back, as LLMEngine does); candidates finish or are aborted; a small pool preempts.

After every step: each pool's reference counts equal the live sequences' tables, the free
queue holds every other block, no table holds a block past the tokens it has room for,
and every block the prefix cache holds carries the tokens its holders really have (a
rejected draft never reached a hash)."""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.scheduler import Scheduler
from engine.core.sequence import SequenceStatus
from engine.sampling_params import SamplingParams

BLOCK_SIZE, WINDOW, BUDGET = 2, 4, 8
KINDS = {"global": ([KVGroupSpec((0,))], [14]),
         "global+sliding": ([KVGroupSpec((1,)), KVGroupSpec((0,), WINDOW)], [14, 10])}
prompts = st.lists(st.integers(0, 3), min_size=1, max_size=7)


class SpecMachine(RuleBasedStateMachine):
    KIND = "global"

    def __init__(self) -> None:
        super().__init__()
        specs, num_blocks = KINDS[self.KIND]
        self.kv = KVCacheManager.build(specs, num_blocks, BLOCK_SIZE, lookahead=BUDGET)
        self.scheduler = Scheduler(self.kv, max_num_seqs=4, max_num_batched_tokens=BUDGET,
                                   max_model_len=40)
        self.ids = itertools.count()
        self.tokens = itertools.count(10)  # the "model's" tokens: never a draft's

    @rule(prompt=prompts, n=st.sampled_from([1, 1, 2]))
    def add(self, prompt, n):
        if len(self.scheduler.requests) < 4:
            self.scheduler.add_request(f"r{next(self.ids)}", prompt,
                                       SamplingParams(n=n, max_tokens=None))

    @rule(data=st.data())
    def step(self, data):
        out = self.scheduler.schedule()
        for item in out.scheduled:
            # The runner writes only where the tables say; a draft never lands in the null
            # block or a block another sequence still holds.
            seq = item.seq
            for g, table in enumerate(item.block_tables):
                pool = self.kv.pools[g]
                for p in range(seq.num_computed_tokens,
                               seq.num_computed_tokens + item.num_new_tokens):
                    if self.kv.managers[g].skipped_tokens(p + 1) > p:
                        continue
                    block = table[p // BLOCK_SIZE]
                    assert block != pool.null_id
                    assert pool.blocks[block].ref_count == 1, "a write into a shared block"
        self.kv.take_cow_pairs()
        sampled = [item for item in out.scheduled if item.samples]
        self.scheduler.mark_computed(out)
        for item in sampled:
            seq = item.seq
            request = self.scheduler.requests[seq.request_id]
            seqs = self.scheduler.fork(request) if seq.needs_fork else [seq]
            for s in seqs:
                drafts = list(s.draft_token_ids[:item.num_drafts])
                kept = data.draw(st.integers(0, len(drafts)))
                new = drafts[:kept] + [next(self.tokens)]
                for i, token in enumerate(new):
                    if i:
                        self.scheduler.accept_draft(s)
                    s.append_token(token)
                self.scheduler.settle_drafts(s)
        # Drafts for the next step: a few tokens of the sequence's own (lookup's kind).
        for request in self.scheduler.requests.values():
            for s in request.live_seqs:
                if s.status is SequenceStatus.RUNNING and s.num_uncomputed_tokens == 1 \
                        and s.num_computed_tokens >= s.num_prompt_tokens \
                        and not s.draft_token_ids:  # drafts not yet scheduled stay
                    count = data.draw(st.integers(0, 3))
                    s.draft_token_ids = [s.token_ids[i % s.num_tokens] for i in range(count)]

    @rule(data=st.data())
    def finish(self, data):
        # A candidate ends on a token it sampled: never with its prompt's last token
        # still uncomputed (its candidates not yet forked), as the engine's stops go.
        live = [s for r in self.scheduler.requests.values() for s in r.live_seqs
                if s.status is SequenceStatus.RUNNING and s.num_uncomputed_tokens == 1
                and s.num_computed_tokens >= s.num_prompt_tokens]
        if live:
            self.scheduler.finish_seq(data.draw(st.sampled_from(live)), "stop")
            self.scheduler.remove_finished()

    @rule(data=st.data())
    def abort(self, data):
        if self.scheduler.requests:
            self.scheduler.abort(data.draw(st.sampled_from(sorted(self.scheduler.requests))))

    @invariant()
    def pools_hold_exactly_the_tables(self):
        seqs = [s for r in self.scheduler.requests.values() for s in r.live_seqs]
        for g, pool in enumerate(self.kv.pools):
            refs = Counter(b for s in seqs for b in self.kv.block_tables(s)[g]
                           if b != pool.null_id)
            assert {b.block_id: b.ref_count for b in pool.blocks if b.ref_count} == dict(refs)
            assert {b.block_id for b in pool.free_queue} == \
                set(range(pool.num_blocks)) - set(refs)

    @invariant()
    def no_block_past_the_room_a_sequence_has(self):
        for request in self.scheduler.requests.values():
            for s in request.live_seqs:
                for g, table in enumerate(self.kv.block_tables(s)):
                    room = self.kv.managers[g].blocks_needed(s.num_tokens_with_drafts)
                    assert len(table) <= room

    @invariant()
    def cached_blocks_hold_their_holders_tokens(self):
        for request in self.scheduler.requests.values():
            for s in request.live_seqs:
                for g, table in enumerate(self.kv.block_tables(s)):
                    pool = self.kv.pools[g]
                    for i, block_id in enumerate(table):
                        if block_id == pool.null_id:
                            continue
                        if pool.blocks[block_id].block_hash is not None:
                            block = pool.blocks[block_id]
                            assert block.token_ids == tuple(
                                s.token_ids[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE])


class SlidingSpecMachine(SpecMachine):
    KIND = "global+sliding"


TestSpecMachine = SpecMachine.TestCase
TestSpecMachine.settings = settings(max_examples=300, stateful_step_count=30, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])
TestSlidingSpecMachine = SlidingSpecMachine.TestCase
TestSlidingSpecMachine.settings = TestSpecMachine.settings
