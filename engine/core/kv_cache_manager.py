"""The KV cache manager, what the scheduler talks to (the `KVCache` protocol): every KV
group's per-kind manager (`kind_managers.py`, `linear_state_manager.py`) behind one
interface, always (one group or several), so the scheduler's decisions hold across
groups. (vLLM splits this into its KVCacheManager and a coordinator; here they are one.)

A sequence is admitted, or gets room for its next tokens, only when every group has it;
its prefix hit is one length that every group serves; forks, frees and swaps touch every
group. Block ids never mix: the moves it returns (copy-on-write and swap pairs) are a
list per group, in that group's own ids, which is how the runner applies them.

Blocks found on disk are read in the background (`disk_loads.py`, which keeps the
tickets and load-aheads): ``allocate`` takes blocks for them and queues their reads; the
sequence's ``load_state`` is ``LOADING`` until every read is in (``finish_read``), and
``FAILED`` when one fails its checks. Partial-block reuse is `partial_blocks.py`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from collections.abc import Sequence as Seq
from contextlib import contextmanager
from dataclasses import dataclass

from engine.core.block_pool import BlockPool
from engine.core.disk_loads import DiskLoads, LoadState
from engine.core.kind_managers import FullAttentionManager, SingleKindManager, SlidingWindowManager
from engine.core.kv_protocol import GroupMoves, PrefixHit
from engine.core.kv_stats import KVStats, merge_stats, pool_stats
from engine.core.linear_state_manager import LinearStateManager
from engine.core.partial_blocks import (
    copy_in,
    extra_cost,
    hold_sources,
    keep_partials,
    options,
    release_sources,
)
from engine.core.sequence import Sequence
from engine.core.tier_blocks import LowerTier, Save, TierBlocks


@dataclass(slots=True, frozen=True)
class KVGroupSpec:
    """The layers of one attention kind; ``window`` None for full attention. A
    ``linear`` group holds linear-attention state slots, not token blocks
    (engine/core/linear_state_manager.py); it comes after the attention groups."""

    layers: tuple[int, ...]
    window: int | None = None
    linear: bool = False

    @property
    def name(self) -> str:
        if self.linear:
            return "linear state"
        return "global" if self.window is None else f"sliding (window {self.window})"


def group_layers(windows: Seq[int | None], max_model_len: int,
                 linear: Seq[int] = ()) -> list[KVGroupSpec]:
    """Each layer's window (None: full attention) to groups, full attention first. A
    window as long as the context hides nothing: that layer is a full one. The
    ``linear`` layers (linear attention) form one state group, last."""
    kinds: dict[int | None, list[int]] = {}
    for layer, window in enumerate(windows):
        if layer in linear:
            continue
        kinds.setdefault(None if window is None or window >= max_model_len else window,
                         []).append(layer)
    order = sorted(kinds, key=lambda w: (w is not None, w or 0))
    groups = [KVGroupSpec(tuple(kinds[w]), w) for w in order]
    return groups + ([KVGroupSpec(tuple(linear), linear=True)] if linear else [])


class KVCacheManager:
    def __init__(self, managers: Seq[SingleKindManager], specs: Seq[KVGroupSpec]) -> None:
        if not managers or len(managers) != len(specs):
            raise ValueError("KVCacheManager takes one manager per KV group spec")
        if any(m.group != g for g, m in enumerate(managers)):
            raise ValueError("manager g must keep block table g")
        self.managers = list(managers)
        self.specs = list(specs)
        self.pools = [m.pool for m in self.managers]
        self.tiers = [m.tier for m in self.managers]
        first = self.pools[0]
        self.block_size = first.block_size
        # Limits the prompt a request may have: the first group holds every token of a
        # model with full attention (a sliding group's pool only windows).
        self.num_blocks = first.num_blocks
        self.num_host_blocks = first.num_host_blocks
        self.prefix_hit_tokens = 0  # prompt tokens served from the prefix cache, since start
        self.rolled_back_blocks = 0  # blocks given back after rejected drafts, since start
        self.prefix_query_tokens = 0  # prompt tokens looked up, since start
        self.disk_hit_tokens = 0  # of the hits, prompt tokens loaded from disk
        self.loads = DiskLoads(self.managers)
        # A partial block is reused only where every group is token blocks.
        self.reuse_partial = first.enable_prefix_caching and not any(
            isinstance(m, LinearStateManager) for m in self.managers)
        # False: partial reuse takes partial cached blocks only, not a full block's first
        # tokens (an int4 pool's keys, engine/core/partial_blocks.py).
        self.partial_from_full = True

    @classmethod
    def build(cls, specs: Seq[KVGroupSpec], num_blocks: Seq[int], block_size: int, *,
              num_host_blocks: int = 0, enable_prefix_caching: bool = True,
              bytes_per_layer_block: int = 0, lookahead: int = 512,
              group_block_bytes: Seq[int] | None = None, state_slot_bytes: int = 0,
              live_state_slots: int = 1, snapshot_every: int = 1,
              lower_tiers: Seq[LowerTier | None] | None = None) -> KVCacheManager:
        """A pool and a manager per spec: ``num_blocks[g]`` blocks for group g, the same
        host pool size for each; ``lookahead`` is the most tokens a step computes of a
        sequence (the scheduler's budget), how far ahead a window gets blocks. A block's
        bytes: ``group_block_bytes[g]`` where given (groups whose layers differ in head
        shape), else ``bytes_per_layer_block`` per layer. A linear group's count is its
        state slots (``live_state_slots`` of them for running states, as many host slots
        when there is a host pool) of ``state_slot_bytes``; ``snapshot_every`` is its
        snapshot interval in blocks. ``lower_tiers[g]``: group g's view of the tier below
        memory (the disk), None without one; its `TierBlocks` is both the pool's
        eviction hook and the manager's way to hits there."""
        lowers = list(lower_tiers) if lower_tiers is not None else [None] * len(specs)
        if len(lowers) != len(specs):
            raise ValueError(f"lower_tiers: one per KV group spec ({len(specs)}), "
                             f"got {len(lowers)}")
        managers: list[SingleKindManager] = []
        for g, (spec, count) in enumerate(zip(specs, num_blocks, strict=True)):
            tier = TierBlocks(lowers[g], block_size)
            hook = tier if lowers[g] is not None else None
            if spec.linear:
                pool = BlockPool(count, block_size, count if num_host_blocks else 0,
                                 enable_prefix_caching, state_slot_bytes, hook)
                managers.append(LinearStateManager(pool, g, live_state_slots,
                                                   snapshot_every, tier))
                continue
            block_bytes = (group_block_bytes[g] if group_block_bytes is not None
                           else bytes_per_layer_block * len(spec.layers))
            pool = BlockPool(count, block_size, num_host_blocks, enable_prefix_caching,
                             block_bytes, hook)
            managers.append(FullAttentionManager(pool, g, tier=tier) if spec.window is None
                            else SlidingWindowManager(pool, spec.window, lookahead, g, tier))
        return cls(managers, specs)

    @property
    def state_slots(self) -> int:
        """Slots of the linear-attention state group (a running candidate holds one);
        0 without one."""
        return self.pools[-1].num_blocks if self.specs[-1].linear else 0

    @contextmanager
    def unrecorded(self) -> Iterator[None]:
        """Allocations inside count no prefix lookup or hit and cache no partial block:
        a run that leaves the cache's figures as they were (the engine's warm-up)."""
        counters = self.prefix_hit_tokens, self.prefix_query_tokens, self.disk_hit_tokens
        reuse_partial, self.reuse_partial = self.reuse_partial, False
        try:
            yield
        finally:
            self.prefix_hit_tokens, self.prefix_query_tokens, self.disk_hit_tokens = counters
            self.reuse_partial = reuse_partial

    def blocks_needed(self, num_tokens: int) -> int:
        return self.managers[0].blocks_needed(num_tokens)

    def block_tables(self, seq: Sequence) -> list[list[int]]:
        """``seq``'s block table in each group (empty where it holds none): the managers'
        own lists, which change as ``seq`` is served, not copies. Once per scheduled
        sequence per step: ``m.table`` inlined."""
        seq_id = seq.seq_id
        return [m.tables.get(seq_id, []) for m in self.managers]

    def draft_state_slots(self, seq: Sequence, num_drafts: int) -> list[int]:
        """The linear-attention state slots that keep the state after each of the first
        ``num_drafts`` tokens of ``seq``'s verify step (engine/core/linear_state_manager.py);
        none without a state group or drafts."""
        last = self.managers[-1]
        if not isinstance(last, LinearStateManager):
            return []
        return last.draft_slots(seq, num_drafts)

    # -------------------------------------------------------------- allocation
    def allocate(self, seq: Sequence) -> PrefixHit | None:
        """Every group's blocks for ``seq``, for all its tokens from its prefix hit on;
        returns that hit (tokens whose K/V need no compute; those on disk are read before
        ``seq`` runs: its ``load_state``), for the scheduler to start ``seq`` after, or
        None, changing nothing, when some group cannot serve. The
        hit is the longest every group serves: a group may have to go lower than
        another's hit, so repeat until all agree. A partial block cached after the hit's
        full blocks in every group (`partial_blocks.py`) adds its tokens, copied into the
        first new block, unless holding it for the copy is what would not fit."""
        pairs, hit = self._find(seq)
        for num_partial, sources in options(self.pools, seq, hit, self.reuse_partial,
                                          self.partial_from_full):
            computed = hit + num_partial
            plans = [m.plan(seq, f, hit, computed) for m, f in pairs]
            if all(m.cost(p) + extra_cost(src) <= m.pool.num_free_blocks
                   for m, p, src in zip(self.managers, plans, sources, strict=True)):
                break
        else:
            return None
        hold_sources(self.managers, sources)
        loaded = [m.apply(seq, plan) for m, plan in zip(self.managers, plans, strict=True)]
        self.loads.queue(seq)
        copy_in(self.managers, sources, seq, hit)
        # Prompt tokens that came from disk: the first group's (it holds every token).
        found = PrefixHit(computed, len(loaded[0]) * self.block_size)
        self.prefix_hit_tokens += found.num_tokens
        self.prefix_query_tokens += seq.num_tokens
        self.disk_hit_tokens += found.num_disk_tokens
        return found

    def preload(self, seq: Sequence, spare_blocks: int = 0) -> int:
        """Load the blocks of ``seq``'s prefix hit that are on disk into free blocks, as
        prefix-cache entries no sequence holds (a chat opened ahead of its next turn:
        that turn's lookup then finds them in memory, and counts them as loaded from
        disk). Their reads are queued; ``seq`` holds the blocks until the last is in,
        then is freed. Returns the tokens loaded, now or by an earlier preload; 0,
        changing nothing, when some group would have fewer than ``spare_blocks`` free
        blocks left. Counts no prefix hit: the request that uses them does."""
        pairs, hit = self._find(seq)
        plans = [(m.plan(seq, f, hit)[0], 0) for m, f in pairs]
        if any(m.cost(p) + spare_blocks > m.pool.num_free_blocks
               for m, p in zip(self.managers, plans, strict=True)):
            return 0
        loaded = [m.apply(seq, plan) for m, plan in zip(self.managers, plans, strict=True)]
        self.loads.queue(seq)
        if self.loads.start_preload(seq, loaded):
            self.free(seq)
        return len(loaded[0]) * self.block_size

    def load_state(self, seq: Sequence) -> LoadState:
        return self.loads.state(seq)

    def finish_read(self, ticket: int, ok: bool) -> None:
        """The read of ``ticket`` is over (`DiskLoads.finish_read`); a load-ahead it
        ends is freed, its blocks cached."""
        ended = self.loads.finish_read(ticket, ok)
        if ended is not None:
            self.free(ended)

    def _find(self, seq: Sequence) -> tuple[list, int]:
        """Each manager with its lookup of ``seq``, and the hit they agree on."""
        pairs = [(m, m.lookup(seq)) for m in self.managers]
        return pairs, self._agreed_hit(pairs, None)

    @staticmethod
    def _agreed_hit(pairs, limit: int | None) -> int:
        hit = min(m.longest_hit(f, limit) for m, f in pairs)
        while True:
            agreed = min(m.longest_hit(f, hit) for m, f in pairs)
            if agreed == hit:
                return hit
            hit = agreed

    def can_append(self, seqs: Seq[Sequence]) -> bool:
        """Whether ``append_slots`` can serve each of ``seqs`` its next tokens."""
        for m in self.managers:
            free = m.pool.num_free_blocks
            for seq in seqs:
                needed, shared = m.plan_append(seq)
                free -= needed + len(shared)
                if free < 0:
                    return False
        return True

    def append_slots(self, seq: Sequence) -> bool:
        """Room for ``seq``'s tokens not yet computed (its decode token, a prompt's next
        chunk); False, changing nothing, when some group is out of blocks."""
        plans = []
        for m in self.managers:
            plan = m.plan_append(seq)
            if plan[0] + len(plan[1]) > m.pool.num_free_blocks:
                return False
            plans.append(plan)
        for m, plan in zip(self.managers, plans, strict=True):
            m.append_slots(seq, plan)
        return True

    def fork(self, parent: Sequence, child: Sequence) -> None:
        for m in self.managers:
            m.fork(parent, child)

    def commit_computed(self, seq: Sequence) -> None:
        for m in self.managers:
            m.commit_computed(seq)

    def rewind_point(self, seq: Sequence, computed: int) -> int:
        """The computed tokens ``seq`` keeps when cut back to ``computed`` (a draft model's
        sequence after its rejected drafts): no group writes into a cached block."""
        for m in self.managers:
            computed = min(computed, m.rewind_point(seq, computed))
        return computed

    def trim(self, seq: Sequence) -> None:
        """Give back the blocks past ``seq``'s computed tokens (rejected drafts')."""
        for m in self.managers:
            self.rolled_back_blocks += m.trim(seq)

    def free(self, seq: Sequence) -> None:
        """Give back ``seq``'s blocks, cancelling the reads it waits for; blocks of a
        load cut short that were read are cached, as if loaded ahead. A sequence that
        leaves (finished, or preempted by recompute; a swap keeps its blocks elsewhere)
        keeps its partial last block cached where it may be reused, unless it leaves
        while still loading."""
        if self.reuse_partial and self.loads.state(seq) is LoadState.NONE:
            keep_partials(self.managers, seq)
        read = self.loads.clear(seq)
        for m in self.managers:
            m.free(seq)
        for g, block_id in read:
            if (self.pools[g].blocks[block_id].block_hash is not None
                    and not self.specs[g].linear):
                self.tiers[g].preloaded.add(block_id)

    def free_host(self, seq: Sequence) -> None:
        for m in self.managers:
            m.free_host(seq)

    def take_cow_pairs(self) -> GroupMoves:
        pairs = [m.take_cow_pairs() for m in self.managers]
        for pool in self.pools:
            release_sources(pool)  # their copies are in ``pairs``
        return pairs

    def take_saves(self) -> list[list[Save]]:
        """Per group, the blocks to save to disk before this step writes into them."""
        return [t.take_saves() for t in self.tiers]

    def unsaved_cached(self) -> list[list[Save]]:
        """Per group, every cached block the disk lacks (saved when the model unloads)."""
        return [t.unsaved(p) for t, p in zip(self.tiers, self.pools, strict=True)]

    # -------------------------------------------------------------------- swap
    def can_swap_out(self, seqs: Seq[Sequence]) -> bool:
        return all(m.blocks_held(seqs) <= len(m.pool.host_free) for m in self.managers)

    def swap_out(self, seqs: Seq[Sequence]) -> GroupMoves:
        """(device, host) pairs per group."""
        return [m.swap_out(seqs) for m in self.managers]

    def can_swap_in(self, seqs: Seq[Sequence], reserve: int = 0) -> bool:
        """Whether ``seqs`` fit back on the device with ``reserve`` blocks to spare."""
        return all(m.host_blocks_held(seqs) + reserve <= m.pool.num_free_blocks
                   for m in self.managers)

    def swap_in(self, seqs: Seq[Sequence]) -> GroupMoves:
        """(host, device) pairs per group."""
        return [m.swap_in(seqs) for m in self.managers]

    # ------------------------------------------------------------------- stats
    def stats(self, holders: Iterable[Sequence] = (), with_blocks: bool = True) -> KVStats:
        """The pools as the memory panel shows them. ``holders`` are the sequences that
        hold blocks (the engine's request table knows them): they label each block's
        owners and measure the slots in use."""
        holders = list(holders)
        parts = []
        for m in self.managers:
            held = [(s, m.table(s)) for s in holders]
            parts.append(pool_stats(m.pool, m.group, held, with_blocks))
        stats = merge_stats(parts, self.specs, self.prefix_hit_tokens,
                            self.prefix_query_tokens)
        stats.rolled_back_blocks = self.rolled_back_blocks
        return stats
