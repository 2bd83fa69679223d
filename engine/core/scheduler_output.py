"""What the scheduler decides for one step: the sequences that run, with how many tokens
and the blocks they read and write, and the block moves (a list per KV group, in that
group's ids) the runner applies before the forward."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.kv_protocol import GroupMoves
from engine.core.sequence import Request, Sequence


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # tokens computed this step, starting at seq.num_computed_tokens
    # The sequence's block table per KV group (KVCache.block_tables): the KV cache's own
    # lists, so read them before ``mark_computed``, which may change them.
    block_tables: list[list[int]]
    # Linear-attention state slots keeping the state after each of the chunk's first
    # ``num_drafts`` tokens (a hybrid model's verify step; KVCache.draft_state_slots).
    draft_state_slots: list[int] = field(default_factory=list)
    # The chunk reaches the sequence's last token, so its logits are sampled.
    samples: bool = field(init=False)
    # Of ``num_new_tokens``, the sequence's drafts (engine/spec) after its last token:
    # each of their positions is sampled too, to verify them.
    num_drafts: int = field(init=False)

    def __post_init__(self) -> None:
        end = self.seq.num_computed_tokens + self.num_new_tokens
        self.samples = end >= self.seq.num_tokens
        self.num_drafts = max(0, end - self.seq.num_tokens)

    @property
    def num_sampled_rows(self) -> int:
        """The logits rows this sequence gets: its last token's and one per draft."""
        return self.num_drafts + 1 if self.samples else 0


@dataclass(slots=True)
class SchedulerOutput:
    """A step's work. Block moves are a list per KV group, in that group's block ids."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    cow_pairs: GroupMoves = field(default_factory=list)  # (src, dst) device blocks
    swap_out: GroupMoves = field(default_factory=list)  # (device, host)
    swap_in: GroupMoves = field(default_factory=list)  # (host, device)
    preempted: list[str] = field(default_factory=list)  # request ids
    finished: list[Request] = field(default_factory=list)  # ended by the scheduler

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not (self.scheduled or any(self.swap_out) or any(self.swap_in)
                    or any(self.cow_pairs))


def add_moves(into: GroupMoves, moves: GroupMoves) -> None:
    while len(into) < len(moves):
        into.append([])
    for pairs, more in zip(into, moves, strict=False):
        pairs += more
