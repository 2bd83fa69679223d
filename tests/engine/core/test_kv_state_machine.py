"""Random operation sequences on the KV cache manager, one machine parameterized by
the tiers below the device (none, or the host pool and the disk) and by the KV kinds
(global attention alone, or a global and a sliding-window group), checking its
invariants after every step.

The machine plays the model runner too: per group it keeps what each physical block
would hold (the token whose K/V sits in each slot), applies copy-on-write pairs, swap
mappings and the disk tier's saves (a block's content copied out before it is reused)
and reads (a file's content copied into the block taken for it, then reported done, as
the engine does with its background reader) to that content, and checks that every
position a group still reads holds its own token. That catches a wrong prefix hit, a
missed copy, a bad swap mapping or a block loaded into the wrong place, not only
bookkeeping slips. The disk is a dict that a rule can damage: a damaged file must be
recomputed, never read; a sequence may be freed while its reads are out (an abort), and
its reads' results must then be dropped. A sequence's partial last block stays cached when
it leaves, and a next turn (its tokens and more) gets it copied into a block of its own. A
sliding table holds no block wholly before its window and never more than the window and
one step's tokens.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.core.disk_loads import LoadState
from engine.core.kind_managers import SlidingWindowManager
from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.sequence import Sequence
from tests.engine.core.admission import admit, allocate, fork, restart

BLOCK_SIZE, WINDOW, LOOKAHEAD = 2, 4, 3
NUM_HOST_BLOCKS = 6
# Prompts drawn from a few common prefixes and a tiny vocabulary hit the cache often.
PREFIXES = [[], [1, 2, 1, 2, 1, 2, 1], [1, 2, 1, 2, 3, 3], [3, 3, 3, 3]]
prompts = st.tuples(st.sampled_from(PREFIXES), st.lists(st.integers(0, 3), max_size=6)).map(
    lambda parts: parts[0] + parts[1]).filter(bool)
# Blocks a sliding table may hold: those from the window's first to the step's last.
SLIDING_BOUND = -(-(WINDOW + LOOKAHEAD) // BLOCK_SIZE) + 1
KINDS = {"global": ([KVGroupSpec((0,))], [12]),
         "global+sliding": ([KVGroupSpec((1,)), KVGroupSpec((0,), WINDOW)], [12, 8])}


class DictTier:
    """The disk: block hash -> (tokens, slot contents); ``damaged`` files fail their check."""

    def __init__(self) -> None:
        self.files: dict[bytes, tuple[tuple[int, ...], list[int | None]]] = {}
        self.damaged: set[bytes] = set()

    def has(self, block_hash: bytes) -> bool:
        return block_hash in self.files

    def load(self, block_hash: bytes, token_ids: tuple[int, ...]) -> bytes | None:
        tokens, content = self.files[block_hash]
        if block_hash in self.damaged or tokens != token_ids:
            del self.files[block_hash]  # skipped and removed, as the store does
            self.damaged.discard(block_hash)
            return None
        return bytes(repr(content), "ascii")


class KVMachine(RuleBasedStateMachine):
    KIND = "global"
    TIERS = True  # the host pool and the disk below the device

    def __init__(self) -> None:
        super().__init__()
        specs, self.num_blocks = KINDS[self.KIND]
        self.num_host = NUM_HOST_BLOCKS if self.TIERS else 0
        self.disks = [DictTier() if self.TIERS else None for _ in specs]
        self.kv = KVCacheManager.build(specs, self.num_blocks, BLOCK_SIZE,
                                       num_host_blocks=self.num_host, lookahead=LOOKAHEAD,
                                       lower_tiers=self.disks)
        self.pools = self.kv.pools
        self.groups = range(len(self.pools))
        self.live: list[Sequence] = []  # holding device blocks
        self.swapped: list[Sequence] = []  # holding host blocks
        # Per group: each block's slots (the null block last) and each host block's.
        self.device = [[[None] * BLOCK_SIZE for _ in range(n + 1)] for n in self.num_blocks]
        self.host = [[[None] * BLOCK_SIZE for _ in range(self.num_host)] for _ in self.pools]
        self.ids = itertools.count()
        self.fresh_tokens = itertools.count(1000)  # never match anything cached

    # ---------------------------------------------------------------- helpers
    def _new_seq(self, tokens: list[int]) -> Sequence:
        return Sequence(next(self.ids), "r", 0, list(tokens), len(tokens))

    def _snapshot(self) -> tuple:
        kv = self.kv
        return tuple(([b.block_id for b in p.free_queue], [b.ref_count for b in p.blocks],
                      dict(p.cached), set(t.preloaded))
                     for p, t in zip(self.pools, self.kv.tiers, strict=True)) + (
            kv.prefix_hit_tokens, kv.prefix_query_tokens,
            [[list(t) for t in self.kv.block_tables(s)] for s in self.live])

    def _tier_moves(self) -> None:
        """What the runner does first in a step: save the blocks about to be reused."""
        for g, saves in enumerate(self.kv.take_saves()):
            for block_id, block_hash, tokens in saves:
                content = self.device[g][block_id]
                assert tuple(content) == tokens, f"saving block {g}/{block_id} wrongly"
                self.disks[g].files[block_hash] = (tokens, list(content))

    def _finish_reads(self, reads) -> None:
        """The engine and its reader: each read's file checked, copied into its block
        (unless cancelled meanwhile) and reported."""
        for read in reads:
            payload = self.disks[read.group].load(read.block_hash, read.token_ids)
            if self.kv.loads.get(read.ticket) is None:
                continue  # cancelled: the block may be someone else's by now
            if payload is not None:
                self.device[read.group][read.block_id] = eval(payload.decode())
                assert tuple(self.device[read.group][read.block_id]) == read.token_ids
            self.kv.finish_read(read.ticket, payload is not None)

    def _step(self, seq: Sequence) -> bool:
        """One scheduler step for ``seq``: room, copies, then at most LOOKAHEAD tokens."""
        before = self._snapshot()
        one_token = seq.num_uncomputed_tokens == 1
        promised = self.kv.can_append([seq])
        if not self.kv.append_slots(seq):
            assert self._snapshot() == before, "a failed append_slots changed a pool"
            assert not promised, "can_append promised room"
            return False
        assert promised or not one_token, "append_slots found room can_append denied"
        self._tier_moves()
        for device, pairs in zip(self.device, self.kv.take_cow_pairs(), strict=True):
            for src, dst in pairs:
                device[dst] = list(device[src])
        for g, m in enumerate(self.kv.managers):
            if m.lookahead is None:  # full attention: room for every token at once
                assert len(self.kv.block_tables(seq)[g]) == m.blocks_needed(seq.num_tokens)
        end = min(seq.num_tokens, seq.num_computed_tokens + LOOKAHEAD)
        for g, pool in enumerate(self.pools):
            table = self.kv.block_tables(seq)[g]
            for pos in range(seq.num_computed_tokens, end):
                assert table[pos // BLOCK_SIZE] != pool.null_id, (g, seq.label, pos)
                block = pool.blocks[table[pos // BLOCK_SIZE]]
                assert block.ref_count == 1, f"write into block {g}/{block.block_id} shared"
                assert block.block_hash is None, f"write into cached {g}/{block.block_id}"
                self.device[g][block.block_id][pos % BLOCK_SIZE] = seq.token_ids[pos]
        seq.num_computed_tokens = end
        self.kv.commit_computed(seq)
        return True

    def _allocate(self, seq: Sequence, prefill: bool, abort_loading: bool = False) -> bool:
        """Admission as the scheduler does it (admission.py). With ``abort_loading``, a
        sequence still waiting for reads is freed instead."""
        return admit(self.kv, seq, lambda: self._attempt(seq, abort_loading), self._step,
                     self.live, prefill)

    def _attempt(self, seq: Sequence, abort_loading: bool) -> bool:
        """One allocate, a cached block's first tokens copied into the first new block,
        then its reads."""
        before = self._snapshot()
        cached = allocate(self.kv, seq)
        self._tier_moves()
        copies = self.kv.take_cow_pairs()
        if cached is None:
            assert self._snapshot() == before, "a failed allocate changed a pool"
            assert all(t == [] for t in self.kv.block_tables(seq))
            assert seq.num_computed_tokens == 0
            assert copies == [[] for _ in self.pools]
            return False
        for g, pairs in enumerate(copies):
            # At most one copy per group: a cached block, into the first new block.
            assert len(pairs) <= 1 and bool(pairs) == (cached % BLOCK_SIZE != 0)
            for src, dst in pairs:
                assert self.kv.block_tables(seq)[g][cached // BLOCK_SIZE] == dst
                # Drained, the source is held by tables only (a full block a live
                # sequence reads may be one; a partial block has no holder).
                holders = sum(self.kv.block_tables(s)[g].count(src) for s in self.live)
                assert self.pools[g].blocks[src].ref_count == holders, "a copy source held"
                self.device[g][dst] = list(self.device[g][src])
        assert cached == seq.num_computed_tokens
        assert cached < seq.num_tokens
        reads = self.kv.loads.take_new()
        for read in reads:  # placed, not yet cached: nothing else can hit on them
            block = self.pools[read.group].blocks[read.block_id]
            assert block.ref_count == 1 and block.block_hash is None, block
        if reads and abort_loading:
            self.kv.free(seq)
            assert self.kv.block_tables(seq) == self._no_tables()
            self._finish_reads(reads)  # every one cancelled: dropped
            assert self.kv.load_state(seq) is LoadState.NONE
            return False
        self._finish_reads(reads)
        return True

    def _no_tables(self) -> list[list[int]]:
        return [[] for _ in self.pools]

    # ------------------------------------------------------------------ rules
    @rule(tokens=prompts, prefill=st.booleans(), abort_loading=st.booleans())
    def allocate(self, tokens: list[int], prefill: bool, abort_loading: bool) -> None:
        self._allocate(self._new_seq(tokens), prefill, abort_loading)

    @rule(tokens=prompts)
    def preload(self, tokens: list[int]) -> None:
        """A chat opened: its disk hits become cached blocks that nothing holds."""
        seq = self._new_seq(tokens)
        held = [[b.ref_count for b in p.blocks] for p in self.pools]
        self.kv.preload(seq)
        self._tier_moves()
        self._finish_reads(self.kv.loads.take_new())
        assert self.kv.load_state(seq) is LoadState.NONE
        assert self.kv.block_tables(seq) == self._no_tables() and seq.num_computed_tokens == 0
        assert [[b.ref_count for b in p.blocks] for p in self.pools] == held

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100), token=st.integers(0, 3))
    def step(self, pick: int, token: int) -> None:
        seq = self.live[pick % len(self.live)]
        if seq.num_uncomputed_tokens == 0:
            seq.append_token(token)
        self._step(seq)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100), diverge=st.sampled_from([None, 0, 1, 2, 3]))
    def fork(self, pick: int, diverge: int | None) -> None:
        parent = self.live[pick % len(self.live)]
        child = Sequence(next(self.ids), parent.request_id, 1, list(parent.token_ids),
                         parent.num_prompt_tokens)
        free_before = [p.num_free_blocks for p in self.pools]
        fork(self.kv, parent, child)
        assert self.kv.block_tables(child) == self.kv.block_tables(parent)
        assert child.num_computed_tokens == parent.num_computed_tokens
        assert [p.num_free_blocks for p in self.pools] == free_before
        self.live.append(child)
        if diverge is not None and child.num_uncomputed_tokens == 0:
            # A candidate's first token: it lands in the shared partial block, if any.
            child.append_token(diverge)
            self._step(child)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100))
    def free(self, pick: int) -> None:
        seq = self.live.pop(pick % len(self.live))
        computed = seq.num_computed_tokens
        self.kv.free(seq)
        # The blocks go; the sequence's progress is the scheduler's to reset.
        assert self.kv.block_tables(seq) == self._no_tables()
        assert seq.num_computed_tokens == computed

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100), more=st.lists(st.integers(0, 3), min_size=1, max_size=4))
    def next_turn(self, pick: int, more: list[int]) -> None:
        """A chat's reply ends, and its next turn extends everything it holds."""
        seq = self.live.pop(pick % len(self.live))
        tokens = list(seq.token_ids) + more
        self.kv.free(seq)
        self._allocate(self._new_seq(tokens), prefill=False)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100), prefill=st.booleans())
    def recompute(self, pick: int, prefill: bool) -> None:
        """Preemption by recompute: free, then allocate the same tokens again."""
        seq = self.live.pop(pick % len(self.live))
        restart(self.kv, seq)
        self._allocate(seq, prefill)

    @precondition(lambda self: self.live)
    @rule(picks=st.lists(st.integers(0, 100), min_size=1, max_size=4, unique=True))
    def swap_out(self, picks: list[int]) -> None:
        seqs = list({id(s): s for s in (self.live[p % len(self.live)] for p in picks)}.values())
        if not self.kv.can_swap_out(seqs):
            return
        computed = [s.num_computed_tokens for s in seqs]
        held = [{b for s in seqs for b in self.kv.block_tables(s)[g]} - {p.null_id}
                for g, p in enumerate(self.pools)]
        for g, pairs in enumerate(self.kv.swap_out(seqs)):
            assert {d for d, _ in pairs} == held[g] and len(pairs) == len(held[g])
            assert len({h for _, h in pairs}) == len(pairs)
            for dev, host in pairs:
                self.host[g][host] = list(self.device[g][dev])
        assert [s.num_computed_tokens for s in seqs] == computed
        for seq in seqs:
            assert self.kv.block_tables(seq) == self._no_tables()
            self.live.remove(seq)
            self.swapped.append(seq)

    @precondition(lambda self: self.swapped)
    @rule(picks=st.lists(st.integers(0, 100), min_size=1, max_size=4, unique=True))
    def swap_in(self, picks: list[int]) -> None:
        seqs = list({id(s): s for s in (self.swapped[p % len(self.swapped)]
                                        for p in picks)}.values())
        if not self.kv.can_swap_in(seqs):
            return
        held = [{h for s in seqs for h in m.host_tables[s.seq_id]} - {None}
                for m in self.kv.managers]
        moves = self.kv.swap_in(seqs)
        self._tier_moves()  # saves of the blocks it reused, before the copies
        for g, pairs in enumerate(moves):
            assert {h for h, _ in pairs} == held[g] and len(pairs) == len(held[g])
            assert len({d for _, d in pairs}) == len(pairs)
            for host, dev in pairs:
                self.device[g][dev] = list(self.host[g][host])
        for seq in seqs:
            self.swapped.remove(seq)
            self.live.append(seq)

    @precondition(lambda self: self.swapped)
    @rule(pick=st.integers(0, 100))
    def finish_swapped(self, pick: int) -> None:
        seq = self.swapped.pop(pick % len(self.swapped))
        self.kv.free_host(seq)
        assert all(seq.seq_id not in m.host_tables for m in self.kv.managers)

    @precondition(lambda self: any(d is not None and d.files for d in self.disks))
    @rule(pick=st.integers(0, 100))
    def damage_a_file(self, pick: int) -> None:
        disk = next(d for d in self.disks if d is not None and d.files)
        disk.damaged.add(sorted(disk.files)[pick % len(disk.files)])

    @rule(num_blocks=st.integers(1, 12), keep=st.booleans())
    def pressure(self, num_blocks: int, keep: bool) -> None:
        """A prompt of never-seen tokens: it can only be served by evicting cached blocks."""
        n = num_blocks * BLOCK_SIZE
        seq = self._new_seq([next(self.fresh_tokens) for _ in range(n)])
        # A sliding group takes blocks for one step's tokens at a time.
        fits = all(m.blocks_needed(n if m.lookahead is None else min(n, m.lookahead))
                   <= m.pool.num_free_blocks for m in self.kv.managers)
        assert self._allocate(seq, prefill=True) == fits
        if fits and not keep:
            self.live.remove(seq)
            self.kv.free(seq)

    # ------------------------------------------------------------- invariants
    @invariant()
    def free_xor_referenced_and_refs_equal_tables(self) -> None:
        for g, pool in enumerate(self.pools):
            queued = [b.block_id for b in pool.free_queue]
            assert len(queued) == len(set(queued)) == pool.num_free_blocks
            assert pool.null_id not in queued and pool.null_block.ref_count == 0
            for block in pool.blocks:
                assert (block.ref_count == 0) == pool.free_queue.contains(block), block
                assert (block.ref_count == 0) == (block.block_id in queued), block
            holders = [0] * pool.num_blocks
            for seq in self.live:
                for block_id in self.kv.block_tables(seq)[g]:
                    if block_id != pool.null_id:
                        holders[block_id] += 1
            assert [b.ref_count for b in pool.blocks] == holders, g

    @invariant()
    def tables_only_for_the_live(self) -> None:
        """A sequence freed, swapped out, or not admitted leaves no table behind."""
        live = {s.seq_id for s in self.live}
        assert all(set(m.tables) == live for m in self.kv.managers)

    @invariant()
    def cache_maps_to_matching_blocks(self) -> None:
        for g, (pool, tier) in enumerate(zip(self.pools, self.kv.tiers, strict=True)):
            for block_hash, block in pool.cached.items():
                assert block.block_hash == block_hash
                tokens = block.token_ids or ()  # a partial block's first slots only
                assert tuple(self.device[g][block.block_id][:len(tokens)]) == tokens, (
                    g, block)
                assert block.ref_count == 0 or not pool.is_partial(block), "partial shared"
            assert pool.copy_sources == []
            for block in pool.blocks:
                if block.block_hash is not None:
                    assert pool.cached[block.block_hash] is block
            # The index by parent lists exactly the cached blocks that name one, each
            # under it, none empty.
            indexed = {(after, i) for after, kids in pool.children.items() for i in kids}
            assert indexed == {(b.after, b.block_id) for b in pool.blocks
                               if b.after is not None}
            assert all(pool.children.values())
            assert all(pool.blocks[i].block_hash is not None for _, i in indexed)
            # Loaded ahead and not used yet: cached, held by nothing.
            for block_id in tier.preloaded:
                block = pool.blocks[block_id]
                assert block.block_hash is not None and block.ref_count == 0, block

    @invariant()
    def held_positions_hold_their_tokens(self) -> None:
        for seq in self.live:
            for g, m in enumerate(self.kv.managers):
                table, null = self.kv.block_tables(seq)[g], m.pool.null_id
                first_kept = m.first_kept(seq.num_computed_tokens)
                assert len(table) >= m.blocks_needed(seq.num_computed_tokens)
                assert all(b == null for b in table[:first_kept]), (g, seq.label, table)
                if isinstance(m, SlidingWindowManager):
                    assert sum(b != null for b in table) <= SLIDING_BOUND
                    # Every position of a held block, which covers the keys the next
                    # token reads (the last WINDOW - 1 computed ones, and itself).
                    assert first_kept * BLOCK_SIZE <= max(
                        0, seq.num_computed_tokens - WINDOW + 1)
                for pos in range(first_kept * BLOCK_SIZE, seq.num_computed_tokens):
                    slot = self.device[g][table[pos // BLOCK_SIZE]][pos % BLOCK_SIZE]
                    assert slot == seq.token_ids[pos], (g, seq.label, pos)
        for seq in self.swapped:
            for g, m in enumerate(self.kv.managers):
                table = m.host_tables[seq.seq_id]
                for pos in range(m.first_kept(seq.num_computed_tokens) * BLOCK_SIZE,
                                 seq.num_computed_tokens):
                    host_id = table[pos // BLOCK_SIZE]
                    assert self.host[g][host_id][pos % BLOCK_SIZE] == seq.token_ids[pos]

    @invariant()
    def host_refs_consistent(self) -> None:
        for m in self.kv.managers:
            pool = m.pool
            counts: dict[int, int] = {}
            for seq in self.swapped:
                for host_id in m.host_tables[seq.seq_id]:
                    if host_id is not None:
                        counts[host_id] = counts.get(host_id, 0) + 1
            assert pool.host_refs == counts
            assert m.host_tables.keys() == {s.seq_id for s in self.swapped}
            assert len(pool.host_free) == len(set(pool.host_free))
            assert set(pool.host_free).isdisjoint(counts)
            assert set(pool.host_free) | counts.keys() == set(range(self.num_host))

    @invariant()
    def disk_files_hold_their_tokens(self) -> None:
        for pool, disk in zip(self.pools, self.disks, strict=True):
            for block_hash, (tokens, content) in (disk.files.items() if disk else ()):
                assert tuple(content) == tokens, block_hash
                cached = pool.cached.get(block_hash)
                assert cached is None or cached.token_ids == tokens

    @invariant()
    def stats_partition_the_pools(self) -> None:
        stats = self.kv.stats(self.live, with_blocks=False)
        assert stats.num_free + stats.num_used == sum(self.num_blocks)
        assert [g.num_free + g.num_used for g in stats.groups] == self.num_blocks
        assert stats.num_cached == sum(b.ref_count == 0 for p in self.pools
                                       for b in p.cached.values())
        assert stats.num_shared == sum(b.ref_count > 1 for p in self.pools for b in p.blocks)
        assert stats.num_host_used == sum(len(p.host_refs) for p in self.pools)

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
            assert sorted(pool.host_free) == list(range(self.num_host))


def _machine(kind: str, tiers: bool, examples: int):
    name = f"KVMachine_{kind.replace('+', '_')}_{'tiers' if tiers else 'device'}"
    machine = type(name, (KVMachine,), {"KIND": kind, "TIERS": tiers})
    machine.TestCase.settings = settings(
        max_examples=examples, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
    return machine.TestCase


# Most examples where the most can go wrong: every tier under both kinds.
TestGlobalOnTheDevice = _machine("global", False, 100)
TestGlobalOverTheTiers = pytest.mark.slow(_machine("global", True, 400))
TestTwoKindsOnTheDevice = _machine("global+sliding", False, 100)
TestTwoKindsOverTheTiers = pytest.mark.slow(_machine("global+sliding", True, 300))
