"""Sequences (one candidate's tokens and progress) and requests (a prompt and its
candidates)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from engine.sampling_params import SamplingParams


@dataclass(slots=True, frozen=True)
class ImageSpan:
    """An image's place in a prompt: tokens ``[start, end)`` hold its placeholder tokens
    (engine/vision/prompt.py), ``key`` is its content hash, which every block holding
    any of those tokens is hashed with (block_hashes.py), and ``data`` what the runner
    encodes it from (engine/vision: opaque here)."""

    start: int
    end: int
    key: bytes
    data: Any = None
    # Its tokens' rows x cols when the text model places them in 2-D (M-RoPE,
    # engine/core/mrope.py); None: they take positions like text.
    grid: tuple[int, int] | None = None
    # Tokens [lo, hi) that attend to each other bidirectionally (Gemma 3's image soft
    # tokens): the scheduler computes them in one prefill chunk and the runner lets each
    # see the run's end (AttentionMetadata.key_ends). None: causal like text.
    joint: tuple[int, int] | None = None


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # needs (re)prefill: no blocks, or blocks not yet computed
    RUNNING = "running"
    # A candidate of a request brought back after recompute preemption, holding no
    # blocks until another candidate has recomputed the shared prompt (Scheduler._unpark).
    PARKED = "parked"
    SWAPPED = "swapped"  # its KV sits in the host pool
    # Admitted with blocks whose content is still being read from disk
    # (engine/core/disk_loads.py); it runs once every read is in.
    LOADING = "loading"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """One candidate: its token ids and how many of them have K/V in the cache.

    Tokens ``[0, num_computed_tokens)`` have K/V in the cache; the rest are computed by
    the next steps (a prompt still prefilling, or the one sampled token of a decode).
    The scheduler alone moves that progress. Which blocks hold the K/V is the KV cache's
    own state (its managers' tables, by ``seq_id``; engine/core/kind_managers.py).
    """

    seq_id: int
    request_id: str
    index: int  # candidate index within its request
    token_ids: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    # Of the prefix hit at its last admission, the tokens loaded from disk.
    num_disk_tokens: int = 0
    # Chained hash of each full block, computed once and kept across preemption.
    block_hashes: list[bytes] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    generator: Any = None  # torch.Generator, owned by the engine
    # Set when this sequence's next prefill chunk ends its prompt for the first time
    # (the moment a request with n candidates forks).
    needs_fork: bool = False
    # The candidates it forks into (its request's n): a linear-attention state slot is
    # taken for each at admission (engine/core/linear_state_manager.py).
    fork_width: int = 1
    # The images in its prompt, in order (ImageSpan); a fork shares them.
    images: tuple[ImageSpan, ...] = ()
    # Tokens a proposer guessed to follow (engine/spec): the next step computes them after
    # the sequence's own uncomputed token and keeps those the model agrees with. They are
    # never part of ``token_ids`` (nor hashed into the prefix cache) until accepted.
    draft_token_ids: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.request_id}:{self.index}"

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def num_tokens_with_drafts(self) -> int:
        """The tokens the next step needs room for: its own and its drafts."""
        return len(self.token_ids) + len(self.draft_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)


@dataclass(slots=True, eq=False)
class Request:
    """One request: a prompt and its n candidate sequences.

    It starts with a single sequence; when the prompt's prefill ends, the engine forks
    it into ``params.n`` candidates that share the prompt's blocks.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    num_disk_tokens: int = 0  # of those, the tokens loaded from disk
    admitted_once: bool = False
    aborted: bool = False
    # Speculative decoding (engine/spec): drafts its candidates verified, and kept.
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0

    @property
    def live_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if not s.is_finished]

    @property
    def is_finished(self) -> bool:
        return self.aborted or (
            len(self.seqs) == self.params.n and all(s.is_finished for s in self.seqs)
        )

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading token ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
