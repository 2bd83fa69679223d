"""What the scheduler may call on the KV cache (`KVCacheManager` is the one
implementation; a test may hand the scheduler anything with these members)."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

from engine.core.disk_loads import LoadState
from engine.core.sequence import Sequence

# Per KV group, a list of (from, to) block pairs in that group's ids.
GroupMoves = list[list[tuple[int, int]]]


@dataclass(slots=True, frozen=True)
class PrefixHit:
    """What ``allocate`` found of a sequence in the cache: its first ``num_tokens`` tokens
    need no compute (``num_disk_tokens`` of them are read from disk first). The KV layer
    only reports it: the scheduler alone moves a sequence's progress."""

    num_tokens: int
    num_disk_tokens: int = 0


class KVCache(Protocol):
    block_size: int
    num_blocks: int  # of the first group, which holds every token: bounds a prompt
    num_host_blocks: int

    def blocks_needed(self, num_tokens: int) -> int: ...

    def block_tables(self, seq: Sequence) -> list[list[int]]: ...

    def draft_state_slots(self, seq: Sequence, num_drafts: int) -> list[int]: ...

    def allocate(self, seq: Sequence) -> PrefixHit | None: ...

    def can_append(self, seqs: Seq[Sequence]) -> bool: ...

    def append_slots(self, seq: Sequence) -> bool: ...

    def fork(self, parent: Sequence, child: Sequence) -> None: ...

    def commit_computed(self, seq: Sequence) -> None: ...

    def trim(self, seq: Sequence) -> None: ...

    def rewind_point(self, seq: Sequence, computed: int) -> int: ...

    def free(self, seq: Sequence) -> None: ...

    def free_host(self, seq: Sequence) -> None: ...

    def take_cow_pairs(self) -> GroupMoves: ...

    def can_swap_out(self, seqs: Seq[Sequence]) -> bool: ...

    def swap_out(self, seqs: Seq[Sequence]) -> GroupMoves: ...

    def can_swap_in(self, seqs: Seq[Sequence], reserve: int = 0) -> bool: ...

    def swap_in(self, seqs: Seq[Sequence]) -> GroupMoves: ...

    def load_state(self, seq: Sequence) -> LoadState: ...
