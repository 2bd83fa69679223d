"""Random operation sequences on a full-attention group and a linear-state group behind
the KV cache manager: allocation with prefix hits at snapshots, steps crossing block
boundaries, forks, frees, recompute and swaps, and speculative decoding's verify steps
(drafts kept or rolled back: the running state goes back to the last kept token).

The machine plays the runner: each state slot holds the token prefix its state has
absorbed, each KV block its tokens. Copy and swap pairs are applied as the runner does
(before the next write: the engine drains them every step),
a step's snapshots are written as its chunk crosses their boundaries, and every resumed
step checks that the running state holds exactly the sequence's computed tokens.

Run again over a disk tier (a dict per group): blocks and snapshots leaving memory are
saved there (a snapshot must hold its prefix), prefix hits read them back into the slots
and blocks taken for them (then a snapshot is copied into the running state), and a
rule damages files, which must fail their read and be recomputed.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.sequence import Sequence
from engine.core.verify_states import chunk_snapshots
from tests.engine.core.admission import admit, allocate, fork, restart

BS, LOOKAHEAD = 2, 3
NUM_BLOCKS, NUM_SLOTS, LIVE_SLOTS, HOST = 14, 9, 4, 6
FULL, LINEAR = 0, 1
PREFIXES = [[], [1, 2, 1, 2, 1, 2, 1], [1, 2, 1, 2, 3, 3], [3, 3, 3, 3]]
prompts = st.tuples(st.sampled_from(PREFIXES), st.lists(st.integers(0, 3), max_size=6)).map(
    lambda parts: parts[0] + parts[1]).filter(bool)


class Shelf:
    """One group's disk: hash -> content (a block's tokens, a snapshot's prefix)."""

    def __init__(self) -> None:
        self.files: dict[bytes, object] = {}
        self.damaged: set[bytes] = set()

    def has(self, block_hash: bytes) -> bool:
        return block_hash in self.files

    def read(self, block_hash: bytes):
        """The content, or None for a damaged file (removed, as the store does)."""
        if block_hash in self.damaged:
            self.damaged.discard(block_hash)
            del self.files[block_hash]
            return None
        return self.files[block_hash]


class HybridMachine(RuleBasedStateMachine):
    DISK = False

    def __init__(self) -> None:
        super().__init__()
        self.disks = [Shelf(), Shelf()] if self.DISK else []
        self.kv = KVCacheManager.build(
            [KVGroupSpec((1,)), KVGroupSpec((0,), linear=True)], [NUM_BLOCKS, NUM_SLOTS], BS,
            num_host_blocks=HOST, live_state_slots=LIVE_SLOTS,
            lower_tiers=self.disks or None)
        self.state = self.kv.managers[LINEAR]
        self.live: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.blocks: list[list] = [[None] * BS for _ in range(NUM_BLOCKS + 1)]
        self.host_blocks: list[list] = [[None] * BS for _ in range(HOST)]
        self.slots: list[tuple | None] = [None] * (NUM_SLOTS + 1)
        self.host_slots: list[tuple | None] = [None] * NUM_SLOTS
        self.prefix_of: dict[bytes, tuple] = {}  # a block hash -> every token up to it
        self.ids = itertools.count()
        self.fresh = itertools.count(1000)

    def _saves(self) -> None:
        """What the runner does first: copy out the cached blocks about to be reused."""
        for g, saves in enumerate(self.kv.take_saves()):
            for block_id, block_hash, tokens in saves:
                if g == LINEAR:
                    content = self.slots[block_id]
                    assert content == self.prefix_of[block_hash], "saving a wrong snapshot"
                else:
                    content = list(self.blocks[block_id])
                    assert tuple(content) == tokens, "saving a wrong block"
                self.disks[g].files[block_hash] = content

    def _reads(self) -> None:
        """The reader and the engine's copies of what it read."""
        for read in self.kv.loads.take_new():
            content = self.disks[read.group].read(read.block_hash)
            if content is not None:
                if read.group == LINEAR:
                    self.slots[read.block_id] = content
                else:
                    self.blocks[read.block_id] = list(content)
            self.kv.finish_read(read.ticket, content is not None)

    def _apply_copies(self) -> None:
        self._saves()
        full, linear = self.kv.take_cow_pairs()
        for src, dst in full:
            self.blocks[dst] = list(self.blocks[src])
        # As the runner's batched copy: every source read before any target is written.
        contents = [self.slots[src] for src, _ in linear]
        for (_, dst), content in zip(linear, contents, strict=True):
            self.slots[dst] = content

    def _step(self, seq: Sequence) -> bool:
        if not self.kv.append_slots(seq):
            return False
        self._apply_copies()
        start = seq.num_computed_tokens
        end = min(seq.num_tokens, start + LOOKAHEAD)
        table = self.kv.block_tables(seq)[FULL]
        for pos in range(start, end):
            self.blocks[table[pos // BS]][pos % BS] = seq.token_ids[pos]
        self._run_states(seq, seq.token_ids, start, end)
        seq.num_computed_tokens = end
        self.kv.commit_computed(seq)
        self._note_prefixes(seq)
        return True

    def _run_states(self, seq: Sequence, tokens: list[int], start: int, end: int,
                    draft_slots: list[int] = ()) -> None:
        """The linear layers over ``tokens[start:end]``: the states the runner keeps on
        the way (`chunk_snapshots`), then the running state."""
        states = self.kv.block_tables(seq)[LINEAR]
        if start:
            assert self.slots[states[0]] == tuple(seq.token_ids[:start]), seq.label
        for offset, slot in chunk_snapshots(states, start, end, BS, self.state.pool.null_id,
                                            draft_slots):
            self.slots[slot] = tuple(tokens[:start + offset])
        self.slots[states[0]] = tuple(tokens[:end])

    def _note_prefixes(self, seq: Sequence) -> None:
        for i, h in enumerate(seq.block_hashes):
            self.prefix_of[h] = tuple(seq.token_ids[:(i + 1) * BS])

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100), drafts=st.lists(st.integers(0, 3), min_size=1, max_size=5),
          data=st.data())
    def verify(self, pick, drafts, data) -> None:
        """A verify step as LLMEngine runs it (engine/spec): the sequence's last token
        and its drafts (some cut by the step's budget) in one chunk, the kept drafts
        counted one by one as the token after each goes in, then the rest rolled back,
        or the sequence ends on one of the tokens."""
        seq = self.live[pick % len(self.live)]
        while seq.num_uncomputed_tokens > 1:  # the rest of its prompt first
            if not self._step(seq):
                return
        if seq.num_uncomputed_tokens == 0:
            seq.append_token(data.draw(st.integers(0, 3)))
        seq.draft_token_ids = list(drafts)
        if not self.kv.append_slots(seq):
            seq.draft_token_ids.clear()  # out of room: the drafts go first
            return
        num = data.draw(st.integers(0, len(drafts)))
        del seq.draft_token_ids[num:]
        draft_slots = self.kv.draft_state_slots(seq, num)
        assert len(draft_slots) == num
        self._apply_copies()
        start, tokens = seq.num_computed_tokens, seq.token_ids + seq.draft_token_ids
        table = self.kv.block_tables(seq)[FULL]
        for pos in range(start, start + 1 + num):
            self.blocks[table[pos // BS]][pos % BS] = tokens[pos]
        self._run_states(seq, tokens, start, start + 1 + num, draft_slots)
        seq.num_computed_tokens += 1
        self.kv.commit_computed(seq)
        kept = data.draw(st.integers(0, num))
        new = seq.draft_token_ids[:kept] + [next(self.fresh)]
        # Mostly it goes on (len(new)); else it ends on one of the tokens.
        ends_at = data.draw(st.one_of(st.just(len(new)), st.integers(0, len(new))))
        for i, token in enumerate(new):
            if i:  # the draft before this token was kept
                seq.num_computed_tokens += 1
                self.kv.commit_computed(seq)
            seq.append_token(token)
            if i == ends_at:
                self._note_prefixes(seq)
                self.kv.free(seq)
                self._note_prefixes(seq)
                self.live.remove(seq)
                return
        seq.draft_token_ids.clear()
        self.kv.trim(seq)
        self._note_prefixes(seq)

    def _allocate(self, seq: Sequence, prefill: bool) -> bool:
        """Admission as the scheduler does it (admission.py)."""
        return admit(self.kv, seq, lambda: self._attempt(seq), self._step, self.live, prefill)

    def _attempt(self, seq: Sequence) -> bool:
        hit = allocate(self.kv, seq)
        if hit is None:
            assert all(t == [] for t in self.kv.block_tables(seq))
            return False
        assert hit % BS == 0 and hit < seq.num_tokens
        # The engine applies a step's copies before anything else writes a slot.
        self._apply_copies()
        self._reads()
        self._apply_copies()  # a snapshot read from disk, into the running state
        return True

    def _new(self, tokens: list[int], width: int = 1) -> Sequence:
        seq = Sequence(next(self.ids), "r", 0, list(tokens), len(tokens))
        seq.needs_fork, seq.fork_width = width > 1, width
        return seq

    @rule(tokens=prompts, prefill=st.booleans(), width=st.integers(1, 3))
    def allocate(self, tokens, prefill, width) -> None:
        self._allocate(self._new(tokens, width), prefill)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100), token=st.integers(0, 3))
    def step(self, pick, token) -> None:
        seq = self.live[pick % len(self.live)]
        if seq.num_uncomputed_tokens == 0:
            seq.append_token(token)
        self._step(seq)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100))
    def fork(self, pick) -> None:
        parent = self.live[pick % len(self.live)]
        if not (self.state.reserved.get(parent.seq_id) or self.state.pool.num_free_blocks):
            return
        child = Sequence(next(self.ids), "r", 1, list(parent.token_ids),
                         parent.num_prompt_tokens)
        fork(self.kv, parent, child)
        self._apply_copies()
        parent.needs_fork = False
        self.live.append(child)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100), recompute=st.booleans())
    def free(self, pick, recompute) -> None:
        seq = self.live.pop(pick % len(self.live))
        restart(self.kv, seq)  # dropped, or recomputed
        assert self.kv.block_tables(seq) == [[], []]
        if recompute:
            self._allocate(seq, prefill=True)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100))
    def swap_out(self, pick) -> None:
        seq = self.live[pick % len(self.live)]
        if not self.kv.can_swap_out([seq]):
            return
        full, linear = self.kv.swap_out([seq])
        for dev, host in full:
            self.host_blocks[host] = list(self.blocks[dev])
        for dev, host in linear:
            self.host_slots[host] = self.slots[dev]
        self.live.remove(seq)
        self.swapped.append(seq)

    @precondition(lambda self: self.swapped)
    @rule(pick=st.integers(0, 100))
    def swap_in(self, pick) -> None:
        seq = self.swapped[pick % len(self.swapped)]
        if not self.kv.can_swap_in([seq]):
            return
        full, linear = self.kv.swap_in([seq])
        self._saves()
        for host, dev in full:
            self.blocks[dev] = list(self.host_blocks[host])
        for host, dev in linear:
            self.slots[dev] = self.host_slots[host]
        self.swapped.remove(seq)
        self.live.append(seq)

    @rule(num_tokens=st.integers(1, 12))
    def pressure(self, num_tokens) -> None:
        seq = self._new([next(self.fresh) for _ in range(num_tokens)])
        if self._allocate(seq, prefill=True):
            self.live.remove(seq)
            self.kv.free(seq)

    @precondition(lambda self: any(d.files for d in self.disks))
    @rule(pick=st.integers(0, 100))
    def damage_a_file(self, pick) -> None:
        disk = next(d for d in self.disks if d.files)
        disk.damaged.add(sorted(disk.files)[pick % len(disk.files)])

    @invariant()
    def disk_files_hold_their_content(self) -> None:
        for g, disk in enumerate(self.disks):
            for block_hash, content in disk.files.items():
                expected = self.prefix_of[block_hash]
                assert (content if g == LINEAR else tuple(content)) == (
                    expected if g == LINEAR else expected[-BS:]), block_hash

    @invariant()
    def refs_equal_holders_and_live_count(self) -> None:
        pool = self.state.pool
        holders = [0] * pool.num_blocks
        for seq in self.live:
            for slot in self.kv.block_tables(seq)[LINEAR]:
                if slot != pool.null_id:
                    holders[slot] += 1
        for spare in self.state.reserved.values():
            for slot in spare:
                holders[slot] += 1
        assert [b.ref_count for b in pool.blocks] == holders
        assert {b.block_id for b in pool.free_queue} == {
            b.block_id for b in pool.blocks if b.ref_count == 0}
        running = sum(1 for s in self.live if self.kv.block_tables(s)[LINEAR])
        assert self.state.num_live == running + sum(map(len, self.state.reserved.values()))

    @invariant()
    def tables_only_for_the_live(self) -> None:
        """A sequence freed, swapped out, or not admitted leaves no table behind."""
        live = {s.seq_id for s in self.live}
        assert all(set(m.tables) == live for m in self.kv.managers)

    @invariant()
    def snapshots_hold_their_prefix(self) -> None:
        for block_hash, block in self.state.pool.cached.items():
            assert self.slots[block.block_id] == self.prefix_of[block_hash]
        for block in self.kv.pools[FULL].cached.values():
            assert tuple(self.blocks[block.block_id]) == block.token_ids


HybridMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_hybrid_state_machine = HybridMachine.TestCase


class HybridMachineOnDisk(HybridMachine):
    DISK = True


HybridMachineOnDisk.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_hybrid_state_machine_on_disk = HybridMachineOnDisk.TestCase
