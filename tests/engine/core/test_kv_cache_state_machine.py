"""Random operation sequences on the KV cache of one attention kind over device, host
and disk tiers, checking its invariants after each step.

The machine plays the model runner too: it keeps what each physical block would hold
(the token whose K/V sits in each slot), applies copy-on-write pairs, swap mappings and
the disk tier's saves (a block's content copied out before it is reused) and loads (a
file's content copied into a block) to that content, and checks that every computed
position of every sequence reads back its own token. That catches a wrong prefix hit, a
missed copy, a bad swap mapping or a block loaded into the wrong place, not only
bookkeeping slips. The disk is a dict that a rule can damage: a damaged file must be
recomputed, never read.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.core.block_pool import BlockPool
from engine.core.kv_coordinator import KVCacheCoordinator, KVGroupSpec
from engine.core.sequence import Sequence

NUM_BLOCKS = 12
BLOCK_SIZE = 2
NUM_HOST_BLOCKS = 6
# Prompts drawn from a few common prefixes and a tiny vocabulary hit the cache often.
PREFIXES = [[], [1, 2, 1, 2, 1, 2, 1], [1, 2, 1, 2, 3, 3], [3, 3, 3, 3]]
prompts = st.tuples(st.sampled_from(PREFIXES), st.lists(st.integers(0, 3), max_size=6)).map(
    lambda parts: parts[0] + parts[1]).filter(bool)


class DictTier:
    """The disk: block hash -> (tokens, slot contents); ``damaged`` files fail their check."""

    def __init__(self) -> None:
        self.files: dict[bytes, tuple[tuple[int, ...], list[int | None]]] = {}
        self.damaged: set[bytes] = set()
        self.loads = 0

    def has(self, block_hash: bytes) -> bool:
        return block_hash in self.files

    def load(self, block_hash: bytes, token_ids: tuple[int, ...]) -> bytes | None:
        tokens, content = self.files[block_hash]
        if block_hash in self.damaged or tokens != token_ids:
            del self.files[block_hash]  # skipped and removed, as the store does
            self.damaged.discard(block_hash)
            return None
        self.loads += 1
        return bytes(repr(content), "ascii")


class KVCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bm = KVCacheCoordinator.build([KVGroupSpec((0,))], [NUM_BLOCKS], BLOCK_SIZE,
                                           num_host_blocks=NUM_HOST_BLOCKS)
        self.pool: BlockPool = self.bm.pools[0]
        self.manager = self.bm.managers[0]
        self.disk = DictTier()
        self.pool.tier = self.disk
        self.live: list[Sequence] = []  # holding device blocks
        self.swapped: list[Sequence] = []  # holding host blocks
        self.device: list[list[int | None]] = [[None] * BLOCK_SIZE for _ in range(NUM_BLOCKS)]
        self.host: list[list[int | None]] = [[None] * BLOCK_SIZE
                                             for _ in range(NUM_HOST_BLOCKS)]
        self.ids = itertools.count()
        self.fresh_tokens = itertools.count(1000)  # never match anything cached

    # ---------------------------------------------------------------- helpers
    def _new_seq(self, tokens: list[int]) -> Sequence:
        return Sequence(next(self.ids), "r", 0, list(tokens), len(tokens))

    def _snapshot(self) -> tuple:
        bm = self.bm
        return ([b.block_id for b in self.pool.free_queue], [b.ref_count for b in self.pool.blocks],
                dict(self.pool.cached), bm.prefix_hit_tokens, bm.prefix_query_tokens,
                [list(s.block_table) for s in self.live])

    def _tier_moves(self) -> None:
        """What the runner does first in a step: save the blocks about to be reused,
        then (after any swap or copy) fill the blocks loaded from disk."""
        [saves], [loads] = self.bm.take_tier_moves()
        for block_id, block_hash, tokens in saves:
            content = self.device[block_id]
            assert tuple(content) == tokens, f"saving block {block_id} with wrong content"
            self.disk.files[block_hash] = (tokens, list(content))
        for block_id, payload in loads:
            self.device[block_id] = eval(payload.decode())  # the DictTier's repr
            block = self.pool.blocks[block_id]
            assert tuple(self.device[block_id]) == block.token_ids

    def _compute(self, seq: Sequence) -> bool:
        """One step for ``seq``: make room, apply copies, write its uncomputed tokens."""
        bm = self.bm
        before = self._snapshot()
        one_token = seq.num_uncomputed_tokens == 1
        promised = bm.can_append([seq])
        if not bm.append_slots(seq):
            assert self._snapshot() == before, "a failed append_slots changed the pool"
            assert not promised or not one_token, "can_append promised room"
            return False
        if one_token:
            assert promised, "append_slots found room can_append denied"
        self._tier_moves()
        for src, dst in bm.take_cow_pairs()[0]:
            self.device[dst] = list(self.device[src])
        assert len(seq.block_table) == bm.blocks_needed(seq.num_tokens)
        for pos in range(seq.num_computed_tokens, seq.num_tokens):
            block = self.pool.blocks[seq.block_table[pos // BLOCK_SIZE]]
            assert block.ref_count == 1, f"write into block {block.block_id} shared"
            assert block.block_hash is None, f"write into cached block {block.block_id}"
            self.device[block.block_id][pos % BLOCK_SIZE] = seq.token_ids[pos]
        seq.num_computed_tokens = seq.num_tokens
        bm.commit_computed(seq)
        return True

    def _allocate(self, seq: Sequence, prefill: bool) -> bool:
        before = self._snapshot()
        cached = self.bm.allocate(seq)
        self._tier_moves()
        if cached is None:
            assert self._snapshot() == before, "a failed allocate changed the pool"
            assert seq.block_table == [] and seq.num_computed_tokens == 0
            return False
        assert cached == seq.num_computed_tokens
        assert cached % BLOCK_SIZE == 0 and cached < seq.num_tokens
        self.live.append(seq)
        if prefill:
            self._compute(seq)
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
        self._compute(seq)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100), diverge=st.sampled_from([None, 0, 1, 2, 3]))
    def fork(self, pick: int, diverge: int | None) -> None:
        parent = self.live[pick % len(self.live)]
        child = Sequence(next(self.ids), parent.request_id, 1, list(parent.token_ids),
                         parent.num_prompt_tokens)
        free_before = self.pool.num_free_blocks
        self.bm.fork(parent, child)
        assert child.block_table == parent.block_table
        assert child.num_computed_tokens == parent.num_computed_tokens
        assert self.pool.num_free_blocks == free_before
        self.live.append(child)
        if diverge is not None and child.num_uncomputed_tokens == 0:
            # A candidate's first token: it lands in the shared partial block, if any.
            child.append_token(diverge)
            self._compute(child)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100))
    def free(self, pick: int) -> None:
        seq = self.live.pop(pick % len(self.live))
        self.bm.free(seq)
        assert seq.block_table == [] and seq.num_computed_tokens == 0

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100), prefill=st.booleans())
    def recompute(self, pick: int, prefill: bool) -> None:
        """Preemption by recompute: free, then allocate the same tokens again."""
        seq = self.live.pop(pick % len(self.live))
        self.bm.free(seq)
        self._allocate(seq, prefill)

    @precondition(lambda self: self.live)
    @rule(picks=st.lists(st.integers(0, 100), min_size=1, max_size=4, unique=True))
    def swap_out(self, picks: list[int]) -> None:
        seqs = list({id(s): s for s in (self.live[p % len(self.live)] for p in picks)}.values())
        if not self.bm.can_swap_out(seqs):
            return
        held = {b for s in seqs for b in s.block_table}
        computed = [s.num_computed_tokens for s in seqs]
        mapping = self.bm.swap_out(seqs)[0]
        assert {d for d, _ in mapping} == held and len(mapping) == len(held)
        assert len({h for _, h in mapping}) == len(mapping)
        for dev, host in mapping:
            self.host[host] = list(self.device[dev])
        assert [s.num_computed_tokens for s in seqs] == computed
        for seq in seqs:
            assert seq.block_table == []
            self.live.remove(seq)
            self.swapped.append(seq)

    @precondition(lambda self: self.swapped)
    @rule(picks=st.lists(st.integers(0, 100), min_size=1, max_size=4, unique=True))
    def swap_in(self, picks: list[int]) -> None:
        seqs = list({id(s): s for s in (self.swapped[p % len(self.swapped)]
                                        for p in picks)}.values())
        if not self.bm.can_swap_in(seqs):
            return
        held = {h for s in seqs for h in self.manager.host_tables[s.seq_id]}
        mapping = self.bm.swap_in(seqs)[0]
        self._tier_moves()  # saves of the blocks it reused, before the copies
        assert {h for h, _ in mapping} == held and len(mapping) == len(held)
        assert len({d for _, d in mapping}) == len(mapping)
        for host, dev in mapping:
            self.device[dev] = list(self.host[host])
        for seq in seqs:
            self.swapped.remove(seq)
            self.live.append(seq)

    @precondition(lambda self: self.swapped)
    @rule(pick=st.integers(0, 100))
    def finish_swapped(self, pick: int) -> None:
        seq = self.swapped.pop(pick % len(self.swapped))
        self.bm.free_host(seq)
        assert seq.seq_id not in self.manager.host_tables

    @precondition(lambda self: self.disk.files)
    @rule(pick=st.integers(0, 100))
    def damage_a_file(self, pick: int) -> None:
        self.disk.damaged.add(sorted(self.disk.files)[pick % len(self.disk.files)])

    @rule(num_blocks=st.integers(1, NUM_BLOCKS), keep=st.booleans())
    def pressure(self, num_blocks: int, keep: bool) -> None:
        """A prompt of never-seen tokens: it can only be served by evicting cached blocks."""
        tokens = [next(self.fresh_tokens) for _ in range(num_blocks * BLOCK_SIZE)]
        seq = self._new_seq(tokens)
        fits = num_blocks <= self.pool.num_free_blocks
        assert self._allocate(seq, prefill=True) == fits
        if fits and not keep:
            self.live.remove(seq)
            self.bm.free(seq)

    # ------------------------------------------------------------- invariants
    @invariant()
    def free_xor_referenced(self) -> None:
        pool = self.pool
        queued = [b.block_id for b in pool.free_queue]
        assert len(queued) == len(set(queued)) == len(pool.free_queue) == pool.num_free_blocks
        for block in self.pool.blocks:
            assert (block.ref_count == 0) == self.pool.free_queue.contains(block), block
            assert (block.ref_count == 0) == (block.block_id in queued), block
        assert self.pool.num_free_blocks == sum(b.ref_count == 0 for b in self.pool.blocks)

    @invariant()
    def ref_count_equals_tables_holding(self) -> None:
        holders = [0] * NUM_BLOCKS
        for seq in self.live:
            for block_id in seq.block_table:
                holders[block_id] += 1
        assert [b.ref_count for b in self.pool.blocks] == holders

    @invariant()
    def cache_maps_to_matching_blocks(self) -> None:
        for block_hash, block in self.pool.cached.items():
            assert block.block_hash == block_hash
            assert tuple(self.device[block.block_id]) == block.token_ids
        for block in self.pool.blocks:
            if block.block_hash is not None:
                assert self.pool.cached[block.block_hash] is block

    @invariant()
    def computed_positions_hold_their_tokens(self) -> None:
        for seq in self.live:
            assert len(seq.block_table) >= self.bm.blocks_needed(seq.num_computed_tokens)
            for pos in range(seq.num_computed_tokens):
                slot = self.device[seq.block_table[pos // BLOCK_SIZE]][pos % BLOCK_SIZE]
                assert slot == seq.token_ids[pos], f"{seq.label} position {pos}"
        for seq in self.swapped:
            table = self.manager.host_tables[seq.seq_id]
            for pos in range(seq.num_computed_tokens):
                assert self.host[table[pos // BLOCK_SIZE]][pos % BLOCK_SIZE] == \
                    seq.token_ids[pos]

    @invariant()
    def host_refs_consistent(self) -> None:
        counts: dict[int, int] = {}
        for seq in self.swapped:
            for host_id in self.manager.host_tables[seq.seq_id]:
                counts[host_id] = counts.get(host_id, 0) + 1
        assert self.pool.host_refs == counts
        assert self.manager.host_tables.keys() == {s.seq_id for s in self.swapped}
        assert len(self.pool.host_free) == len(set(self.pool.host_free))
        assert set(self.pool.host_free).isdisjoint(counts)
        assert set(self.pool.host_free) | counts.keys() == set(range(NUM_HOST_BLOCKS))

    @invariant()
    def disk_files_hold_their_tokens(self) -> None:
        for block_hash, (tokens, content) in self.disk.files.items():
            assert tuple(content) == tokens, block_hash
            cached = self.pool.cached.get(block_hash)
            assert cached is None or cached.token_ids == tokens

    @invariant()
    def stats_partition_the_pool(self) -> None:
        stats = self.bm.stats(with_blocks=False)
        assert stats.num_free + stats.num_used == NUM_BLOCKS
        assert stats.num_cached == sum(b.ref_count == 0 for b in self.pool.cached.values())
        assert stats.num_shared == sum(b.ref_count > 1 for b in self.pool.blocks)
        assert stats.num_host_used == len(self.pool.host_refs)

    def teardown(self) -> None:
        for seq in self.live:
            self.bm.free(seq)
        for seq in self.swapped:
            self.bm.free_host(seq)
        assert self.pool.num_free_blocks == NUM_BLOCKS
        assert all(b.ref_count == 0 for b in self.pool.blocks)
        assert self.pool.host_refs == {} and self.manager.host_tables == {}
        assert sorted(self.pool.host_free) == list(range(NUM_HOST_BLOCKS))


KVCacheMachine.TestCase.settings = settings(
    max_examples=500,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
# About 25 s on the 2-core dev machine, nearly all of it hypothesis' own bookkeeping.
TestKVCacheMachine = pytest.mark.slow(KVCacheMachine.TestCase)
