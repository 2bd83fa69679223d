"""The block manager of a sliding-window KV group: it holds only the window.

A sliding layer with window W computes the token at position p from keys p - W + 1 .. p,
so once a sequence has ``N`` computed tokens, blocks lying wholly before ``N - W`` are
never read again (the attention kernels skip them, whatever their table entry says).
This manager releases them after each step (``commit_computed``): the table keeps its
length (positions still index it) and the entry becomes ``NO_BLOCK``; a full block goes
to the free queue still hashed, so a later turn can find it in the prefix cache.

Blocks are given per chunk: room for at most ``lookahead`` (the scheduler's per-step
token budget) uncomputed tokens, never the whole prompt at once, so a 10k-token prompt
holds about ``(W + lookahead) / block_size`` blocks here, not 10k / block_size.

A prefix hit here is the longest prefix ``P`` whose last W tokens' blocks (those not
wholly before ``P - W``) are all cached; earlier ones may long be evicted.

Window 64, block_size 16, after 150 computed tokens (blocks 0..9; 150 - 64 = 86)::

    table  [-, -, -, -, -, 5, 9, 2, 7, 4]   blocks 0-4 end at or before 80 <= 86: released
                                            block 5 (80..95) holds keys still in the window
"""

from __future__ import annotations

from engine.core.block_manager import NO_BLOCK, BlockManager
from engine.core.free_block_queue import Block
from engine.core.sequence import Sequence


class SlidingBlockManager(BlockManager):
    def __init__(self, num_blocks: int, block_size: int, window: int, lookahead: int,
                 num_host_blocks: int = 0, enable_prefix_caching: bool = True,
                 bytes_per_block: int = 0, group: int = 0) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if lookahead < 1:
            raise ValueError(f"lookahead must be >= 1, got {lookahead}")
        super().__init__(num_blocks, block_size, num_host_blocks, enable_prefix_caching,
                         bytes_per_block, group)
        self.window = window
        self.lookahead = lookahead

    def first_kept(self, num_computed: int) -> int:
        """Index of the first block still read once ``num_computed`` tokens are in."""
        return max(0, num_computed - self.window) // self.block_size

    # -------------------------------------------------------------- allocation
    def hit_tokens(self, seq: Sequence, limit: int | None = None) -> int:
        num_full = self._num_lookup_blocks(seq)
        if limit is not None:
            num_full = min(num_full, limit // self.block_size)
        # last_miss[k]: the last block index < k that is not cached (-1: none).
        last_miss = [-1]
        for i in range(num_full):
            last_miss.append(last_miss[-1] if self._cached_block(seq, i) else i)
        for k in range(num_full, 0, -1):
            if last_miss[k] < self.first_kept(k * self.block_size):
                return k * self.block_size
        return 0

    def plan_allocation(self, seq: Sequence,
                        hit_tokens: int | None = None) -> tuple[list[Block | None], int]:
        assert not any(b != NO_BLOCK for b in self._table(seq)), f"{seq.label} holds blocks"
        if hit_tokens is None:
            hit_tokens = self.hit_tokens(seq)
        num_hits = hit_tokens // self.block_size
        first = self.first_kept(hit_tokens)
        hits: list[Block | None] = [None] * first
        hits += [self._cached_block(seq, i) for i in range(first, num_hits)]
        assert all(b is not None for b in hits[first:]), "hit_tokens promised cached blocks"
        end = min(seq.num_tokens, hit_tokens + self.lookahead)
        return hits, self.blocks_needed(end) - num_hits

    # ------------------------------------------------------------------ append
    def _append_target(self, seq: Sequence) -> int:
        # The scheduler computes at most `lookahead` tokens of a sequence per step.
        return min(seq.num_tokens, seq.num_computed_tokens + self.lookahead)

    # ----------------------------------------------------------------- release
    def commit_computed(self, seq: Sequence) -> None:
        super().commit_computed(seq)  # hash first: released full blocks stay cached
        self.release_out_of_window(seq)

    def release_out_of_window(self, seq: Sequence) -> None:
        table = self._table(seq)
        end = min(self.first_kept(seq.num_computed_tokens), len(table))
        start = end
        while start > 0 and table[start - 1] != NO_BLOCK:
            start -= 1  # entries before the first placeholder were released earlier
        # Oldest first into the queue: the blocks nearest the end (the next turn's
        # window) are evicted last.
        self._release(table[start:end])
        table[start:end] = [NO_BLOCK] * (end - start)

    def free(self, seq: Sequence) -> None:
        # Oldest first too, unlike a full group's tail-first free: a sliding hit needs
        # the blocks just before the end, not the chat's beginning.
        self._release(self._table(seq))
        self._set_table(seq, [])
        seq.num_computed_tokens = 0
