"""Linear-attention state as one more kind of KV group: a state slot per sequence, and
snapshots of the state at block boundaries cached under the block's hash.

A Gated DeltaNet layer keeps a fixed-size state per sequence (a conv window and a
recurrent matrix per linear layer), not a KV entry per token. The group's `BlockPool`
hands out state slots instead of token blocks: the runner's state pool has one row per
slot (engine/runner/state_pool.py). A sequence's table in this group is::

    table[0]       its running state (the layers read and write it every step)
    table[1 + i]   a snapshot slot for the boundary after token block i, taken before
                   the step that crosses it and cached once that step ran (null: none)

A snapshot is registered under the hash of block i, the chain hash of every token up to
that boundary, and released at once: it waits in the pool's LRU like a freed full block,
evicted when a slot is needed. A prefix hit is a boundary whose snapshot and whose
full-attention blocks are all cached (the KV cache manager agrees the groups' hits): the
running slot starts as a copy of the snapshot (a copy pair, applied before the forward)
and only the tokens after it are computed.

A verify step's drafts (engine/spec) take spare slots too, one per draft, so that the state
can go back to the last token the model keeps: engine/core/verify_states.py.

Snapshots are taken only from slots the live sequences cannot need (``live_slots`` of
the pool are theirs): a snapshot never keeps a sequence from being admitted. A sequence
about to fork into n candidates takes its n slots at admission, so the fork always has
them: each candidate's running state is one copy of the prompt's final state.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from engine.core.block_hashes import extend_hashes
from engine.core.block_pool import BlockPool
from engine.core.kind_managers import Found, Plan, SingleKindManager
from engine.core.sequence import Sequence
from engine.core.tier_blocks import TierBlocks, TierHit
from engine.core.verify_states import VerifyStates


class LinearStateManager(VerifyStates, SingleKindManager):
    def __init__(self, pool: BlockPool, group: int, live_slots: int,
                 snapshot_every: int = 1, tier: TierBlocks | None = None) -> None:
        """``live_slots``: slots kept for running states (the rest may hold snapshots);
        ``snapshot_every``: snapshot each k-th block boundary."""
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {snapshot_every}")
        super().__init__(pool, group, tier=tier)
        self.live_slots = min(live_slots, pool.num_blocks)
        self.snapshot_every = snapshot_every
        self.reserved: dict[int, list[int]] = {}  # a sequence's slots for its fork
        self.num_live = 0  # running and reserved slots held
        self.from_disk: dict[int, int] = {}  # a sequence's snapshot slot being read
        # A sequence's verify step: its computed tokens before it, and the slots holding
        # the state after 1, 2, ... d of the chunk's tokens.
        self.drafting: dict[int, tuple[int, list[int]]] = {}
        self._verify_start: dict[int, int] = {}  # while a verify step is settled

    # ------------------------------------------------------------------ lookup
    def lookup(self, seq: Sequence) -> list[Found]:
        """The cached snapshot at each full prompt block's end, in memory or on disk
        (None: a miss); the last token is never a hit, as in every group."""
        pool = self.pool
        found: list[Found] = []
        for i in range(self.lookup_blocks(seq)):
            tokens = self._tokens(seq, i)
            hit: Found = pool.lookup(seq.block_hashes[i], tokens)
            found.append(hit if hit is not None else self.tier.hit(seq.block_hashes[i], tokens))
        return found

    def longest_hit(self, found: list[Found], limit: int | None = None) -> int:
        num = len(found) if limit is None else min(len(found), limit // self.block_size)
        for k in range(num, 0, -1):
            if found[k - 1] is not None:
                return k * self.block_size
        return 0

    # -------------------------------------------------------------- allocation
    def plan(self, seq: Sequence, found: list[Found], hit_tokens: int,
             computed: int | None = None) -> Plan:
        """``computed`` is always ``hit_tokens`` here (no partial block is reused)."""
        if self.table(seq):
            raise RuntimeError(f"{seq.label} already holds a state slot")
        # As the other kinds' plans, one entry per hit block: only the last one's
        # snapshot is read.
        num_hits = hit_tokens // self.block_size
        hits: list[Found] = [None] * num_hits
        if num_hits:
            hits[-1] = found[num_hits - 1]
        return hits, max(1, seq.fork_width if seq.needs_fork else 1)

    def cost(self, plan: Plan) -> int:
        hits, count = plan
        return count + (1 if hits and isinstance(hits[-1], TierHit) else 0)

    def apply(self, seq: Sequence, plan: Plan) -> list[int]:
        hits, count = plan
        snapshot = hits[-1] if hits else None
        pool = self.pool
        slots = [pool.take().block_id for _ in range(count)]
        self.num_live += count
        self._set_table(seq, slots[:1])
        if count > 1:
            self.reserved[seq.seq_id] = slots[1:]
        if isinstance(snapshot, TierHit):
            # On disk: read into a slot of its own, in the table at its boundary (after
            # block len(hits) - 1); copied into the running state once read (`load_done`).
            table = self.tables[seq.seq_id]
            placed = self.tier.place(pool, snapshot).block_id
            table += [pool.null_id] * (len(hits) - 1) + [placed]
            self.from_disk[seq.seq_id] = table[-1]
        elif snapshot is not None:
            # Read before this step's forward; touched so the LRU keeps it longest.
            self.cow_pairs.append((snapshot.block_id, slots[0]))
            pool.touch(snapshot)
            pool.release([snapshot.block_id])
        self._take_snapshots(seq, len(hits) * self.block_size)
        return []

    def load_done(self, seq: Sequence) -> None:
        """A snapshot read from disk (cached when read) is copied into the running state
        before the first forward, then let go like a memory hit's. Only now: a load
        that fails frees the sequence, and a copy into its freed slot could race
        another's."""
        slot = self.from_disk.pop(seq.seq_id, None)
        if slot is None:
            return
        table = self.tables[seq.seq_id]
        self.cow_pairs.append((slot, table[0]))
        table[table.index(slot)] = self.pool.null_id
        self.pool.release([slot])

    # ------------------------------------------------------------------ append
    def plan_append(self, seq: Sequence) -> tuple[int, list[int]]:
        """A state never grows (snapshots come from spare slots only); a verify step
        takes a slot per draft."""
        held = len(self.drafting.get(seq.seq_id, (0, []))[1])
        return max(0, len(seq.draft_token_ids) - held), []

    def append_slots(self, seq: Sequence, plan: tuple[int, list[int]]) -> None:
        self._release_drafting(seq)
        if seq.draft_token_ids:
            slots = [self.pool.take().block_id for _ in seq.draft_token_ids]
            self.drafting[seq.seq_id] = (seq.num_computed_tokens, slots)
        self._take_snapshots(seq, seq.num_computed_tokens)

    def _take_snapshots(self, seq: Sequence, computed: int) -> None:
        """Spare slots for the boundaries the sequence's tokens after ``computed`` cross
        (at admission its prefix hit, not yet its ``num_computed_tokens``)."""
        pool = self.pool
        if not pool.enable_prefix_caching:
            return
        bs, k = self.block_size, self.snapshot_every
        table = self.tables[seq.seq_id]
        first = computed // bs  # the boundary after block `first` is the next one
        num_full = seq.num_tokens // bs
        extend_hashes(seq, num_full, bs)
        for i in range(first, num_full):
            if (i + 1) % k:
                continue
            if 1 + i < len(table) and table[1 + i] != pool.null_id:
                continue
            if seq.block_hashes[i] in pool.cached:
                continue  # this prefix's state is cached already
            if pool.num_free_blocks <= max(0, self.live_slots - self.num_live):
                return
            table += [pool.null_id] * (2 + i - len(table))
            table[1 + i] = pool.take().block_id

    # ------------------------------------------------------- fork, commit, free
    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child's running state: a copy of the parent's (the prompt's final state),
        into a slot the parent took for it at admission."""
        spare = self.reserved.get(parent.seq_id)
        if spare:
            slot = spare.pop()
        else:
            slot = self.pool.take().block_id
            self.num_live += 1
        self._set_table(child, [slot])
        self.cow_pairs.append((self.table(parent)[0], slot))

    def commit_computed(self, seq: Sequence) -> None:
        """Cache the snapshots of the boundaries this step reached, then let them go."""
        pool = self.pool
        table = self.table(seq)
        bs = self.block_size
        done = min(seq.num_computed_tokens // bs, len(table) - 1)
        if done <= 0:
            return
        extend_hashes(seq, done, bs)
        for i in range(done):
            block_id = table[1 + i]
            if block_id == pool.null_id:
                continue
            pool.register(pool.blocks[block_id], seq.block_hashes[i], self._tokens(seq, i))
            pool.release([block_id])
            table[1 + i] = pool.null_id

    def free(self, seq: Sequence) -> None:
        """A sequence that ends in a verify step (it stopped on a kept token) still
        caches the boundaries its kept tokens crossed."""
        verified = self._verified(seq)
        if verified is not None:
            start, kept, states = verified
            table = self.tables[seq.seq_id]
            if kept not in states:  # every draft kept: the running slot holds the state
                states[kept] = table[0]
                table[0] = self.pool.null_id
            self._cache_boundaries(seq, start, kept, states, running=False)
            self.pool.release(list(states.values()))
        self.from_disk.pop(seq.seq_id, None)  # released with the table
        table = self.tables.pop(seq.seq_id, [])
        self.num_live -= 1 if table else 0
        spare = self.reserved.pop(seq.seq_id, [])
        self.num_live -= len(spare)
        self.pool.release([*table[1:], *table[:1], *spare])

    # -------------------------------------------------------------------- swap
    def swap_out(self, seqs: Seq[Sequence]) -> list[tuple[int, int]]:
        """Running states and pending snapshots go to the host; reserved slots are given
        back (a fork after the swap takes fresh ones)."""
        for seq in seqs:
            self._release_drafting(seq)
            spare = self.reserved.pop(seq.seq_id, [])
            self.num_live -= len(spare)
            self.pool.release(spare)
        moves = super().swap_out(seqs)
        return moves

    def swap_in(self, seqs: Seq[Sequence]) -> list[tuple[int, int]]:
        moves = super().swap_in(seqs)
        self.num_live += sum(1 for s in seqs if self.table(s))
        return moves

    def _tokens(self, seq: Sequence, i: int) -> tuple[int, ...]:
        bs = self.block_size
        return tuple(seq.token_ids[i * bs:(i + 1) * bs])

