"""A verify step's linear-attention states (engine/spec on a hybrid model): the state
after each of its tokens but the last kept in spare slots, so the state can go back to the
last token the model keeps.

A verify step computes a sequence's last token and its d drafts as one chunk, so the
running state it leaves has seen every draft. Before it, the sequence takes d spare slots
(`VerifyStates.draft_slots`, taken with the step's other room by the manager's
``append_slots``); the runner writes the state after 1, 2, ... d of the chunk's tokens
there (`chunk_snapshots`). Once the model kept k drafts, the slot holding the state after
the last kept token becomes the running slot and the others go back (``trim``): nothing
is copied. A block boundary the kept tokens crossed is cached from its slot at once; one
at the last kept token gets a slot that the next step fills before its first token (a
snapshot at offset 0). A sequence that ends on a kept token caches them when it is freed.

`VerifyStates` is `LinearStateManager`'s (engine/core/linear_state_manager.py) and reads its
pool, tables and snapshot settings.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from engine.core.block_hashes import extend_hashes
from engine.core.block_pool import BlockPool
from engine.core.sequence import Sequence


class VerifyStates:
    """The verify-step half of `LinearStateManager`: ``drafting`` (a sequence's computed
    tokens before its verify step, and its draft slots) and what settles it."""

    # The manager's, read here.
    pool: BlockPool
    tables: dict[int, list[int]]
    drafting: dict[int, tuple[int, list[int]]]
    block_size: int
    snapshot_every: int
    live_slots: int
    num_live: int

    def _tokens(self, seq: Sequence, i: int) -> tuple[int, ...]: ...

    def draft_slots(self, seq: Sequence, num_drafts: int) -> list[int]:
        """The slots of ``seq``'s verify step with ``num_drafts`` drafts (fewer than it
        asked for when the step's token budget cut some: those slots go back now)."""
        start, slots = self.drafting.get(seq.seq_id, (0, []))
        if not num_drafts:
            self._release_drafting(seq)
            return []
        if len(slots) > num_drafts:
            self.pool.release(slots[num_drafts:])
            self.drafting[seq.seq_id] = (start, slots[:num_drafts])
        return slots[:num_drafts]

    def _release_drafting(self, seq: Sequence) -> None:
        _, slots = self.drafting.pop(seq.seq_id, (0, []))
        self.pool.release(slots)

    def trim(self, seq: Sequence) -> int:
        """After a verify step: the state after the last kept token becomes the running
        one (nothing is copied: a kept draft's slot takes the running slot's place) and
        the boundaries the kept tokens crossed are cached. Slots are not token blocks:
        none counts as rolled back."""
        verified = self._verified(seq)
        if verified is None:
            return 0
        start, kept, states = verified
        table = self.tables[seq.seq_id]
        stale = []
        if kept in states:  # a draft was rejected: the running slot saw it
            stale.append(table[0])
            table[0] = states.pop(kept)
        self._cache_boundaries(seq, start, kept, states, running=True)
        self.pool.release([*stale, *states.values()])
        return 0

    def _verified(self, seq: Sequence) -> tuple[int, int, dict[int, int]] | None:
        """``seq``'s verify step: its computed tokens before it, how many of its chunk's
        tokens are kept (its last token and the kept drafts), and its draft slots by
        the chunk's tokens whose state each holds; None without one."""
        start, slots = self.drafting.pop(seq.seq_id, (0, []))
        kept = seq.num_computed_tokens - start
        if not slots or seq.seq_id not in self.tables or kept < 1:
            self.pool.release(slots)
            return None
        return start, kept, dict(enumerate(slots, start=1))

    def _cache_boundaries(self, seq: Sequence, start: int, kept: int,
                          states: dict[int, int], running: bool) -> None:
        """Cache the state at each block boundary that the verify step's kept tokens
        crossed after its first token (that one's `_take_snapshots` took before the
        step). A draft slot in ``states`` is cached at once (and leaves ``states``). The
        state after the last kept token is the running one: a boundary there gets a
        spare slot that the next step fills before its first token (a snapshot at
        offset 0, `chunk_snapshots`) and its ``commit_computed`` caches. ``running``
        False: the sequence ends, and ``states`` holds that state too."""
        pool = self.pool
        if not pool.enable_prefix_caching:
            return
        bs, table = self.block_size, self.tables[seq.seq_id]
        extend_hashes(seq, (start + kept) // bs, bs)
        for i in range((start + 1) // bs, (start + kept) // bs):
            offset = (i + 1) * bs - start
            if offset < 2 or (i + 1) % self.snapshot_every:
                continue
            if (1 + i < len(table) and table[1 + i] != pool.null_id) \
                    or seq.block_hashes[i] in pool.cached:
                continue
            if offset in states:
                slot = states.pop(offset)
                pool.register(pool.blocks[slot], seq.block_hashes[i], self._tokens(seq, i))
                pool.release([slot])
            elif running and pool.num_free_blocks > max(0, self.live_slots - self.num_live):
                table += [pool.null_id] * (2 + i - len(table))
                table[1 + i] = pool.take().block_id


def chunk_snapshots(table: list[int], start: int, end: int, block_size: int, null: int,
                    draft_slots: Seq[int] = ()) -> list[tuple[int, int]]:
    """The states a step keeps of a sequence's chunk, tokens [start, end), as (tokens into
    the chunk, slot), in order: each block boundary in (start, end] whose snapshot slot
    ``table`` holds; one at ``start`` itself still waiting for its state (a verify step
    left it: offset 0, the state the chunk starts from); and a verify step's
    ``draft_slots``, the state after each of its tokens but the last."""
    first = max(0, start // block_size - 1)
    boundaries = [((i + 1) * block_size - start, table[1 + i])
                  for i in range(first, min(end // block_size, len(table) - 1))
                  if table[1 + i] != null and (i + 1) * block_size >= start]
    drafts = list(enumerate(draft_slots, start=1))
    return sorted(boundaries + drafts) if drafts else boundaries
