"""Random operation sequences on a global and a sliding group behind the coordinator,
checking after each step what test_kv_cache_state_machine.py checks for one pool, per
group, plus the window: a sliding table holds no block wholly before its window and never
more than the window and one step's tokens.

The machine plays the runner: it keeps each group's blocks' content, applies the
copy-on-write and swap pairs (a list per group, in its ids) and checks that every
computed position a group still reads holds its own token.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.core.kv_coordinator import KVCacheCoordinator, KVGroupSpec
from engine.core.sequence import Sequence

BLOCK_SIZE, WINDOW, LOOKAHEAD = 2, 4, 3
NUM_BLOCKS = (12, 8)  # global, sliding
NUM_HOST_BLOCKS = 6
PREFIXES = [[], [1, 2, 1, 2, 1, 2, 1], [1, 2, 1, 2, 3, 3], [3, 3, 3, 3]]
prompts = st.tuples(st.sampled_from(PREFIXES), st.lists(st.integers(0, 3), max_size=6)).map(
    lambda parts: parts[0] + parts[1]).filter(bool)
# Blocks a sliding table may hold: those from the window's first to the step's last.
SLIDING_BOUND = -(-(WINDOW + LOOKAHEAD) // BLOCK_SIZE) + 1


class KVGroupsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kv = KVCacheCoordinator.build(
            [KVGroupSpec((1,)), KVGroupSpec((0,), WINDOW)], NUM_BLOCKS, BLOCK_SIZE,
            num_host_blocks=NUM_HOST_BLOCKS, lookahead=LOOKAHEAD)
        self.live: list[Sequence] = []
        self.swapped: list[Sequence] = []
        # Per group: each block's slots (the null block last) and each host block's.
        self.device = [[[None] * BLOCK_SIZE for _ in range(n + 1)] for n in NUM_BLOCKS]
        self.host = [[[None] * BLOCK_SIZE for _ in range(NUM_HOST_BLOCKS)] for _ in NUM_BLOCKS]
        self.ids = itertools.count()
        self.fresh_tokens = itertools.count(1000)

    def _new_seq(self, tokens: list[int]) -> Sequence:
        return Sequence(next(self.ids), "r", 0, list(tokens), len(tokens))

    def _snapshot(self) -> tuple:
        return tuple(([b.block_id for b in p.free_queue], [b.ref_count for b in p.blocks],
                      dict(p.cached)) for p in self.kv.pools) + (
            [[list(t) for t in s.block_tables] for s in self.live],)

    def _step(self, seq: Sequence) -> bool:
        """One scheduler step for ``seq``: room, copies, then at most LOOKAHEAD tokens."""
        before = self._snapshot()
        promised = self.kv.can_append([seq])
        if not self.kv.append_slots(seq):
            assert not promised and self._snapshot() == before
            return False
        for device, pairs in zip(self.device, self.kv.take_cow_pairs(), strict=True):
            for src, dst in pairs:
                device[dst] = list(device[src])
        end = min(seq.num_tokens, seq.num_computed_tokens + LOOKAHEAD)
        for g, pool in enumerate(self.kv.pools):
            table = seq.block_tables[g]
            for pos in range(seq.num_computed_tokens, end):
                assert table[pos // BLOCK_SIZE] != pool.null_id, (g, seq.label, pos)
                block = pool.blocks[table[pos // BLOCK_SIZE]]
                assert block.ref_count == 1 and block.block_hash is None, (g, block)
                self.device[g][block.block_id][pos % BLOCK_SIZE] = seq.token_ids[pos]
        seq.num_computed_tokens = end
        self.kv.commit_computed(seq)
        return True

    def _allocate(self, seq: Sequence, prefill: bool) -> bool:
        before = self._snapshot()
        cached = self.kv.allocate(seq)
        if cached is None:
            assert self._snapshot() == before, "a failed allocate changed a pool"
            assert all(t == [] for t in seq.block_tables) and seq.num_computed_tokens == 0
            return False
        assert cached == seq.num_computed_tokens and cached % BLOCK_SIZE == 0
        self.live.append(seq)
        while prefill and seq.num_uncomputed_tokens and self._step(seq):
            pass
        return True

    # ------------------------------------------------------------------ rules
    @rule(tokens=prompts, prefill=st.booleans())
    def allocate(self, tokens: list[int], prefill: bool) -> None:
        self._allocate(self._new_seq(tokens), prefill)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100), token=st.integers(0, 3))
    def step(self, pick: int, token: int) -> None:
        seq = self.live[pick % len(self.live)]
        if seq.num_uncomputed_tokens == 0:
            seq.append_token(token)
        self._step(seq)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100), diverge=st.sampled_from([None, 0, 1]))
    def fork(self, pick: int, diverge: int | None) -> None:
        parent = self.live[pick % len(self.live)]
        child = Sequence(next(self.ids), "r", 1, list(parent.token_ids),
                         parent.num_prompt_tokens)
        self.kv.fork(parent, child)
        assert child.block_tables == parent.block_tables
        self.live.append(child)
        if diverge is not None and child.num_uncomputed_tokens == 0:
            child.append_token(diverge)
            self._step(child)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100))
    def free(self, pick: int) -> None:
        seq = self.live.pop(pick % len(self.live))
        self.kv.free(seq)
        assert seq.block_tables == [[], []]

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100), prefill=st.booleans())
    def recompute(self, pick: int, prefill: bool) -> None:
        seq = self.live.pop(pick % len(self.live))
        self.kv.free(seq)
        self._allocate(seq, prefill)

    @precondition(lambda self: self.live)
    @rule(picks=st.lists(st.integers(0, 100), min_size=1, max_size=3, unique=True))
    def swap_out(self, picks: list[int]) -> None:
        seqs = list({id(s): s for s in (self.live[p % len(self.live)] for p in picks)}.values())
        if not self.kv.can_swap_out(seqs):
            return
        for g, pairs in enumerate(self.kv.swap_out(seqs)):
            for dev, host in pairs:
                self.host[g][host] = list(self.device[g][dev])
        for seq in seqs:
            assert seq.block_tables == [[], []]
            self.live.remove(seq)
            self.swapped.append(seq)

    @precondition(lambda self: self.swapped)
    @rule(picks=st.lists(st.integers(0, 100), min_size=1, max_size=3, unique=True))
    def swap_in(self, picks: list[int]) -> None:
        seqs = list({id(s): s for s in (self.swapped[p % len(self.swapped)]
                                        for p in picks)}.values())
        if not self.kv.can_swap_in(seqs):
            return
        for g, pairs in enumerate(self.kv.swap_in(seqs)):
            for host, dev in pairs:
                self.device[g][dev] = list(self.host[g][host])
        for seq in seqs:
            self.swapped.remove(seq)
            self.live.append(seq)

    @rule(num_tokens=st.integers(1, 2 * NUM_BLOCKS[0]), keep=st.booleans())
    def pressure(self, num_tokens: int, keep: bool) -> None:
        seq = self._new_seq([next(self.fresh_tokens) for _ in range(num_tokens)])
        if self._allocate(seq, prefill=True) and not keep:
            self.live.remove(seq)
            self.kv.free(seq)

    # ------------------------------------------------------------- invariants
    @invariant()
    def free_xor_referenced_and_refs_equal_tables(self) -> None:
        for g, pool in enumerate(self.kv.pools):
            queued = {b.block_id for b in pool.free_queue}
            assert len(queued) == len(pool.free_queue)
            assert pool.null_id not in queued and pool.null_block.ref_count == 0
            holders = [0] * pool.num_blocks
            for seq in self.live:
                for block_id in seq.block_tables[g]:
                    if block_id != pool.null_id:
                        holders[block_id] += 1
            assert [b.ref_count for b in pool.blocks] == holders, g
            assert queued == {b.block_id for b in pool.blocks if b.ref_count == 0}, g

    @invariant()
    def cache_maps_to_matching_blocks(self) -> None:
        for g, pool in enumerate(self.kv.pools):
            for block_hash, block in pool.cached.items():
                assert block.block_hash == block_hash
                content = self.device[g][block.block_id]
                assert tuple(content) == block.token_ids, (g, block)

    @invariant()
    def held_positions_hold_their_tokens_and_the_window_bound(self) -> None:
        sliding = self.kv.managers[1]
        null = sliding.pool.null_id
        for seq in self.live:
            first_kept = sliding.first_kept(seq.num_computed_tokens)
            table = seq.block_tables[1]
            assert all(b == null for b in table[:first_kept]), (seq.label, table)
            assert sum(b != null for b in table) <= SLIDING_BOUND
            # Every position of a held block, which covers the keys the next token reads
            # (the last WINDOW - 1 computed ones, and itself).
            assert first_kept * BLOCK_SIZE <= max(0, seq.num_computed_tokens - WINDOW + 1)
            for g, start in ((0, 0), (1, first_kept * BLOCK_SIZE)):
                for pos in range(start, seq.num_computed_tokens):
                    block_id = seq.block_tables[g][pos // BLOCK_SIZE]
                    slot = self.device[g][block_id][pos % BLOCK_SIZE]
                    assert slot == seq.token_ids[pos], (g, seq.label, pos)

    @invariant()
    def stats_partition_the_pools(self) -> None:
        stats = self.kv.stats(self.live, with_blocks=False)
        assert stats.num_free + stats.num_used == sum(NUM_BLOCKS)
        assert [g.num_free + g.num_used for g in stats.groups] == list(NUM_BLOCKS)

    def teardown(self) -> None:
        for seq in self.live:
            self.kv.free(seq)
        for seq in self.swapped:
            self.kv.free_host(seq)
        for m in self.kv.managers:
            pool = m.pool
            assert pool.num_free_blocks == pool.num_blocks
            assert all(b.ref_count == 0 for b in pool.blocks)
            assert pool.host_refs == {} and m.host_tables == {}
            assert sorted(pool.host_free) == list(range(NUM_HOST_BLOCKS))


TestKVGroupsMachine = KVGroupsMachine.TestCase
TestKVGroupsMachine.settings = settings(max_examples=300, stateful_step_count=40,
                                        deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])
