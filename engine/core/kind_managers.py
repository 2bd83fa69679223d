"""One KV group's blocks for each sequence: allocation with prefix hits, appends with
copy-on-write, forks, frees and swaps, over that group's `BlockPool`.

Attention kinds differ in one hook, ``skipped_tokens(n)``: how many leading tokens a
sequence with ``n`` computed tokens no longer reads. Full attention reads everything (0);
a sliding window W reads the last W keys, so ``n - W + 1`` leading tokens are skipped.
Everything kind-specific follows from it: blocks wholly inside the skipped tokens are
released after each step (the table keeps its length, the entry becomes the null
block; a full block goes to the free queue still hashed), and a prefix hit of ``P``
tokens needs only the blocks from ``skipped_tokens(P)`` on to be cached.

A window also gives blocks per chunk (``lookahead``: the scheduler's per-step token
budget), never the whole prompt at once, so a 10k-token prompt holds about
``(W + lookahead) / block_size`` blocks there.

Window 4, block_size 4, after 11 computed tokens (11 - 4 + 1 = 8 skipped)::

    table  [null, null, 2]   blocks 0 and 1 (tokens 0..7) released, block 2 read
"""

from __future__ import annotations

from engine.core.block_hashes import block_images, extend_hashes
from engine.core.block_pool import BlockPool
from engine.core.free_block_queue import Block
from engine.core.host_swap import HostSwap
from engine.core.sequence import Sequence
from engine.core.tier_blocks import TierBlocks, TierHit

# A prefix block found by a lookup: in memory, a tier below, or neither (None).
Found = Block | TierHit | None
# A plan: the prefix blocks to reuse (None: a skipped one, the null block) and how many
# new blocks follow them.
Plan = tuple[list[Found], int]


class SingleKindManager(HostSwap):
    """The blocks of KV group ``group``, one attention kind (vLLM's
    SingleTypeKVCacheManager): each sequence's block table (``tables``); swaps to the
    host pool are `HostSwap`'s. ``tier``: the group's traffic with the tier below
    (`TierBlocks`, the pool's eviction hook too); none below by default."""

    # Freed tables enter the queue oldest block first (the end is evicted last), or
    # newest first (the beginning is evicted last): whichever a later hit needs most.
    free_oldest_first = False

    def __init__(self, pool: BlockPool, group: int = 0, lookahead: int | None = None,
                 tier: TierBlocks | None = None) -> None:
        if lookahead is not None and lookahead < 1:
            raise ValueError(f"lookahead must be >= 1, got {lookahead}")
        self.pool = pool
        self.tier = tier if tier is not None else TierBlocks(None, pool.block_size)
        self.group = group
        self.block_size = pool.block_size
        self.lookahead = lookahead
        self.cow_pairs: list[tuple[int, int]] = []  # (src, dst), drained by the scheduler
        # Seq id -> its block table in this group (vLLM's req_to_blocks): the KV cache's
        # own state. The runner reads the tables a step uses from its ScheduledSeqs.
        self.tables: dict[int, list[int]] = {}
        self.host_tables: dict[int, list[int | None]] = {}

    def skipped_tokens(self, num_computed: int) -> int:
        """Leading tokens a sequence with ``num_computed`` computed tokens never reads again."""
        return 0

    def first_kept(self, num_computed: int) -> int:
        """Index of the first block still read once ``num_computed`` tokens are in."""
        return self.skipped_tokens(num_computed) // self.block_size

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, seq: Sequence) -> list[int]:
        """``seq``'s table; an empty one, not kept, while it holds no blocks (a lookup, a
        finished sequence's late ``commit_computed``). What adds blocks to a table indexes
        ``tables`` itself: a sequence given none is a bug to fail on, not an entry."""
        return self.tables.get(seq.seq_id, [])

    def _set_table(self, seq: Sequence, table: list[int]) -> None:
        self.tables[seq.seq_id] = table

    # ------------------------------------------------------------------ lookup
    def lookup_blocks(self, seq: Sequence) -> int:
        """How many of ``seq``'s blocks a lookup may hit, their hashes computed: its full
        blocks before the last token (never a hit: it is recomputed so that there are
        logits to sample from); none without prefix caching."""
        if not self.pool.enable_prefix_caching:
            return 0
        num_full = (seq.num_tokens - 1) // self.block_size
        extend_hashes(seq, num_full, self.block_size)
        return num_full

    def lookup(self, seq: Sequence) -> list[Found]:
        """The cached block of each of ``seq``'s full prompt blocks that could be a hit,
        in memory or a tier below (None: a miss), stopping where no later hit is
        possible (``lookup_blocks``)."""
        pool, tier = self.pool, self.tier
        bs = self.block_size
        num_full = self.lookup_blocks(seq)
        last_kept = self.first_kept(num_full * bs)
        found: list[Found] = []
        for i in range(num_full):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            block: Found = pool.lookup(seq.block_hashes[i], tokens)
            if block is None:
                block = tier.hit(seq.block_hashes[i], tokens)
            found.append(block)
            if block is None and i >= last_kept:
                break  # every longer prefix still reads block i
        return found

    def longest_hit(self, found: list[Found], limit: int | None = None) -> int:
        """The longest hit ``P`` (tokens, at most ``limit``) whose read blocks, those from
        ``first_kept(P)`` on, are all in ``found``."""
        num = len(found)
        if limit is not None:
            num = min(num, limit // self.block_size)
        last_miss = -1  # the last missing block index before k
        best = 0
        for k in range(1, num + 1):
            if found[k - 1] is None:
                last_miss = k - 1
            if last_miss < self.first_kept(k * self.block_size):
                best = k
        return best * self.block_size

    # -------------------------------------------------------------- allocation
    def plan(self, seq: Sequence, found: list[Found], hit_tokens: int,
             computed: int | None = None) -> Plan:
        """``computed``: the tokens that need no compute, when a partial block copied
        after the hit's full blocks adds to them."""
        if any(b != self.pool.null_id for b in self.table(seq)):
            raise RuntimeError(f"{seq.label} already holds blocks")
        computed = hit_tokens if computed is None else computed
        num_hits = hit_tokens // self.block_size
        first = self.first_kept(computed)
        hits: list[Found] = [None] * first + list(found[first:num_hits])
        end = seq.num_tokens if self.lookahead is None else min(
            seq.num_tokens, computed + self.lookahead)
        return hits, self.blocks_needed(end) - num_hits

    def cost(self, plan: Plan) -> int:
        """Free blocks a plan takes: its new blocks, the cached ones it revives and one
        for each block to read from a tier below."""
        hits, num_new = plan
        return num_new + sum(1 for b in hits if isinstance(b, TierHit)
                             or (b is not None and b.ref_count == 0))

    def apply(self, seq: Sequence, plan: Plan) -> list[int]:
        """Returns the hit's blocks that come from a tier below: placed now to be read
        (``TierBlocks.placed``), or loaded ahead (``TierBlocks.preloaded``) and used for
        the first time."""
        hits, num_new = plan
        pool, tier = self.pool, self.tier
        # Memory hits are held before any block is taken: a taken block is the free
        # queue's head, which may be one of them (cached, ref count 0).
        for block in hits:
            if block is not None and not isinstance(block, TierHit):
                pool.touch(block)
        table = [pool.null_id if block is None
                 else tier.place(pool, block).block_id if isinstance(block, TierHit)
                 else block.block_id for block in hits]
        loaded = [b for b, hit in zip(table, hits, strict=True)
                  if isinstance(hit, TierHit) or b in tier.preloaded]
        tier.preloaded.difference_update(loaded)
        table += [pool.take().block_id for _ in range(num_new)]
        self._set_table(seq, table)
        return loaded

    # ------------------------------------------------------------------ append
    def _append_target(self, seq: Sequence) -> int:
        """Tokens to have room for: all, or the next chunk's (the scheduler computes at
        most ``lookahead`` tokens of a sequence per step)."""
        end = seq.num_tokens_with_drafts
        if self.lookahead is None:
            return end
        return min(end, seq.num_computed_tokens + self.lookahead)

    def plan_append(self, seq: Sequence) -> tuple[int, list[int]]:
        """What append_slots takes: how many new blocks, and the indices of the shared
        blocks it writes (each copied first; for a decode, at most one of the two)."""
        table = self.tables[seq.seq_id]
        needed = -(-self._append_target(seq) // self.block_size) - len(table)
        blocks = self.pool.blocks
        shared = [i for i in range(seq.num_computed_tokens // self.block_size, len(table))
                  if blocks[table[i]].ref_count > 1]
        return max(needed, 0), shared

    def append_slots(self, seq: Sequence, plan: tuple[int, list[int]]) -> None:
        """Room for ``seq``'s tokens not yet computed; a shared block about to be written
        is copied first (``cow_pairs``). The caller checked the plan's cost."""
        pool = self.pool
        table = self.tables[seq.seq_id]
        needed, shared = plan
        for i in shared:
            src = pool.blocks[table[i]]
            dst = pool.take()
            src.ref_count -= 1
            table[i] = dst.block_id
            self.cow_pairs.append((src.block_id, dst.block_id))
        for _ in range(needed):
            table.append(pool.take().block_id)

    def loaded(self, block_id: int, block_hash: bytes, token_ids: tuple[int, ...]) -> None:
        """A block placed for a sequence has its content from the tier below: it joins
        the prefix cache."""
        self.pool.register(self.pool.blocks[block_id], block_hash, token_ids)

    def load_done(self, seq: Sequence) -> None:
        """Every read ``seq`` waited for is in: it runs from the next step."""

    def take_cow_pairs(self) -> list[tuple[int, int]]:
        pairs, self.cow_pairs = self.cow_pairs, []
        return pairs

    # ------------------------------------------------------- fork, commit, free
    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares every block of the parent (no new block)."""
        table = list(self.table(parent))
        self._set_table(child, table)
        child.block_hashes = list(parent.block_hashes)
        null = self.pool.null_id
        for block_id in table:
            if block_id != null:
                self.pool.blocks[block_id].ref_count += 1

    def commit_computed(self, seq: Sequence) -> None:
        """Register ``seq``'s newly full, computed blocks in the prefix cache, then
        release those it no longer reads (hashed first: they stay cached)."""
        pool = self.pool
        table = self.tables.get(seq.seq_id)
        if not table:
            return  # freed already (finished before its step was marked computed)
        if pool.enable_prefix_caching:
            bs = self.block_size
            num_full = min(seq.num_computed_tokens // bs, len(table))
            extend_hashes(seq, num_full, bs)
            for i in range(num_full - 1, -1, -1):
                if table[i] == pool.null_id:
                    break  # released, like every block before it
                block = pool.blocks[table[i]]
                if block.block_hash is not None:
                    break  # every block before a registered one is registered too
                if pool.register(block, seq.block_hashes[i],
                                 tuple(seq.token_ids[i * bs:(i + 1) * bs])):
                    pool.index_child(block, seq.block_hashes[i - 1] if i else None,
                                     block_images(seq, i * bs, (i + 1) * bs))
        end = min(self.first_kept(seq.num_computed_tokens), len(table))
        if end and table[end - 1] != pool.null_id:
            start = end
            while start > 0 and table[start - 1] != pool.null_id:
                start -= 1  # entries before the first null were released earlier
            # Oldest first: the blocks nearest the end (the next turn's window) are
            # evicted last.
            pool.release(table[start:end])
            table[start:end] = [pool.null_id] * (end - start)

    def rewind_point(self, seq: Sequence, computed: int) -> int:
        """Where a sequence cut back to ``computed`` computed tokens can go on writing:
        ``computed``, unless the block it would write into is in the prefix cache (full
        and hashed before the cut), which must not change: then that block's start."""
        table = self.tables.get(seq.seq_id, [])
        i = computed // self.block_size
        if computed % self.block_size and i < len(table) and table[i] != self.pool.null_id \
                and self.pool.blocks[table[i]].block_hash is not None:
            return i * self.block_size
        return computed

    def trim(self, seq: Sequence) -> int:
        """Give back the blocks past ``seq``'s computed tokens: those a verify step took
        for drafts the model rejected (engine/spec). Never hashed (their tokens were not
        accepted), so they go back as plain free blocks, the last first: the free queue's
        head is then what it was before they were taken. Returns how many went back."""
        table = self.tables.get(seq.seq_id)
        keep = self.blocks_needed(seq.num_computed_tokens)
        if not table or len(table) <= keep:
            return 0
        extra = table[keep:]
        self.pool.release(reversed(extra))
        del table[keep:]
        return len(extra)

    def free(self, seq: Sequence) -> None:
        table = self.tables.pop(seq.seq_id, [])
        self.pool.release(table if self.free_oldest_first else reversed(table))


class FullAttentionManager(SingleKindManager):
    """Every token is read: nothing is skipped; a freed chat's beginning is kept longest."""


class SlidingWindowManager(SingleKindManager):
    """The last ``window`` keys are read; a freed chat's end (a next turn's window) is
    kept longest."""

    free_oldest_first = True

    def __init__(self, pool: BlockPool, window: int, lookahead: int, group: int = 0,
                 tier: TierBlocks | None = None) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        super().__init__(pool, group, lookahead, tier)
        self.window = window

    def skipped_tokens(self, num_computed: int) -> int:
        return max(0, num_computed - self.window + 1)
