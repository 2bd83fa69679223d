"""KV groups: one block pool and one block table per attention kind.

A model's layers split by what they read: full-attention layers the whole context,
sliding layers (window W) only the last W tokens. Each kind gets a pool of its own layers
and its own block ids (`BlockManager`, or `SlidingBlockManager`, which frees what fell
out of the window), and each sequence a table per group (``Sequence.block_tables``).
Gemma 3 (five sliding layers per global one) then holds the whole context in one layer
of six and only a window in the others.

A model of one kind has one group, and the engine hands the scheduler that group's block
manager itself: this facade exists only for several. It presents the block manager's
interface to the scheduler, so every decision holds across groups: a sequence is
admitted, or gets room for its next tokens, only when every group has it; the prefix-hit
length is one for all groups; forks, frees and swaps touch every group.

Block ids in the moves it returns (copy-on-write and swap pairs) and in ``stats`` run on
from one group to the next: group g's block b is ``device_offsets[g] + b``, its host
block h is ``host_offsets[g] + h``; the runner splits them back (`split_moves`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace

from engine.core.block_manager import BlockManager
from engine.core.kv_stats import KVGroupStats, KVStats
from engine.core.sequence import Sequence


@dataclass(slots=True, frozen=True)
class KVGroupSpec:
    """The layers of one attention kind; ``window`` None for full attention."""

    layers: tuple[int, ...]
    window: int | None = None

    @property
    def name(self) -> str:
        return "global" if self.window is None else f"sliding (window {self.window})"


def group_layers(windows: Seq[int | None], max_model_len: int) -> list[KVGroupSpec]:
    """Each layer's window (None: full attention) to groups, full attention first. A
    window as long as the context hides nothing: that layer is a full one."""
    kinds: dict[int | None, list[int]] = {}
    for layer, window in enumerate(windows):
        kinds.setdefault(None if window is None or window >= max_model_len else window,
                         []).append(layer)
    order = sorted(kinds, key=lambda w: (w is not None, w or 0))
    return [KVGroupSpec(tuple(kinds[w]), w) for w in order]


def split_moves(pairs: Iterable[tuple[int, int]], first: Seq[int], second: Seq[int],
                group_of_first: bool = True) -> list[list[tuple[int, int]]]:
    """Pool-wide (a, b) pairs to per-group local pairs; ``first`` / ``second`` are the
    offsets of a's and b's id spaces; the group is read from a (or from b)."""
    out: list[list[tuple[int, int]]] = [[] for _ in first]
    for a, b in pairs:
        key, offsets = (a, first) if group_of_first else (b, second)
        g = bisect.bisect_right(offsets, key) - 1
        out[g].append((a - first[g], b - second[g]))
    return out


class KVGroups:
    def __init__(self, managers: Seq[BlockManager], specs: Seq[KVGroupSpec]) -> None:
        if len(managers) != len(specs) or len(managers) < 2:
            raise ValueError("KVGroups takes two or more groups, one manager per spec")
        assert all(m.group == g for g, m in enumerate(managers)), "manager g keeps table g"
        self.managers = list(managers)
        self.specs = list(specs)
        first = self.managers[0]
        self.block_size = first.block_size
        # Limits the prompt a request may have: the first group holds every token (a
        # sliding group's pool only windows).
        self.num_blocks = first.num_blocks
        self.num_host_blocks = first.num_host_blocks
        self.device_offsets = _offsets(m.num_blocks for m in self.managers)
        self.host_offsets = _offsets(m.num_host_blocks for m in self.managers)

    def blocks_needed(self, num_tokens: int) -> int:
        return self.managers[0].blocks_needed(num_tokens)

    # -------------------------------------------------------------- allocation
    def allocate(self, seq: Sequence) -> int | None:
        """Every group's blocks for ``seq``, or None, changing nothing, when some group
        cannot serve. The prefix hit is the shortest of the groups' (a hit length valid
        in each: sliding groups may have to go lower, so repeat until all agree)."""
        hit = min(m.hit_tokens(seq) for m in self.managers)
        while True:
            agreed = min(m.hit_tokens(seq, hit) for m in self.managers)
            if agreed == hit:
                break
            hit = agreed
        plans = [m.plan_allocation(seq, hit) for m in self.managers]
        if any(m.allocation_cost(p) > m.num_free_blocks
               for m, p in zip(self.managers, plans, strict=True)):
            return None
        for m, plan in zip(self.managers, plans, strict=True):
            m.apply_allocation(seq, plan)
        return hit

    def can_append(self, seqs: Seq[Sequence]) -> bool:
        return all(m.can_append(seqs) for m in self.managers)

    def append_slots(self, seq: Sequence) -> bool:
        # Checked first in every group, so a failure changes nothing.
        if not self.can_append([seq]):
            return False
        for m in self.managers:
            ok = m.append_slots(seq)
            assert ok, "can_append promised room"
        return True

    def fork(self, parent: Sequence, child: Sequence) -> None:
        for m in self.managers:
            m.fork(parent, child)

    def commit_computed(self, seq: Sequence) -> None:
        for m in self.managers:
            m.commit_computed(seq)

    def free(self, seq: Sequence) -> None:
        for m in self.managers:
            m.free(seq)

    def free_host(self, seq: Sequence) -> None:
        for m in self.managers:
            m.free_host(seq)

    def take_cow_pairs(self) -> list[tuple[int, int]]:
        return [(src + off, dst + off)
                for m, off in zip(self.managers, self.device_offsets, strict=True)
                for src, dst in m.take_cow_pairs()]

    # -------------------------------------------------------------------- swap
    def can_swap_out(self, seqs: Seq[Sequence]) -> bool:
        return all(m.can_swap_out(seqs) for m in self.managers)

    def swap_out(self, seqs: Seq[Sequence]) -> list[tuple[int, int]]:
        return [(d + self.device_offsets[g], h + self.host_offsets[g])
                for g, m in enumerate(self.managers) for d, h in m.swap_out(seqs)]

    def can_swap_in(self, seqs: Seq[Sequence], reserve: int = 0) -> bool:
        return all(m.can_swap_in(seqs, reserve) for m in self.managers)

    def swap_in(self, seqs: Seq[Sequence]) -> list[tuple[int, int]]:
        return [(h + self.host_offsets[g], d + self.device_offsets[g])
                for g, m in enumerate(self.managers) for h, d in m.swap_in(seqs)]

    # ------------------------------------------------------------------- stats
    def stats(self, holders: Iterable[Sequence] = (), with_blocks: bool = True) -> KVStats:
        holders = list(holders)
        parts = [m.stats(holders, with_blocks) for m in self.managers]
        total = parts[0]
        per_owner = dict(total.blocks_per_owner)
        blocks = list(total.blocks)
        for part, off in zip(parts[1:], self.device_offsets[1:], strict=True):
            for label, count in part.blocks_per_owner.items():
                per_owner[label] = per_owner.get(label, 0) + count
            blocks += [replace(b, block_id=b.block_id + off) for b in part.blocks]
        return replace(
            total,
            num_blocks=sum(p.num_blocks for p in parts),
            num_free=sum(p.num_free for p in parts),
            num_used=sum(p.num_used for p in parts),
            num_cached=sum(p.num_cached for p in parts),
            num_shared=sum(p.num_shared for p in parts),
            bytes_saved_by_sharing=sum(p.bytes_saved_by_sharing for p in parts),
            allocated_slots=sum(p.allocated_slots for p in parts),
            used_slots=sum(p.used_slots for p in parts),
            num_host_blocks=sum(p.num_host_blocks for p in parts),
            num_host_used=sum(p.num_host_used for p in parts),
            blocks=blocks,
            blocks_per_owner=per_owner,
            groups=[KVGroupStats(spec.name, len(spec.layers), p.num_blocks, p.num_used,
                                 p.num_cached, p.num_free, p.bytes_per_block)
                    for spec, p in zip(self.specs, parts, strict=True)],
        )


def _offsets(sizes: Iterable[int]) -> list[int]:
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    return offsets[:-1]
