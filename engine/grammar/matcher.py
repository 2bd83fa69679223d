"""One constrained candidate's place in its grammar, and the batch's token masks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class Matcher:
    """Wraps an xgrammar ``GrammarMatcher``: the tokens a candidate may sample next, and
    its state advanced by each sampled token. It lives with the candidate (not with its
    KV blocks), so preemption by recompute or swap leaves it where the reply is."""

    __slots__ = ("_matcher", "_vocab_size")

    def __init__(self, matcher, vocab_size: int) -> None:
        self._matcher, self._vocab_size = matcher, vocab_size

    def fork(self) -> Matcher:
        """An independent copy at the same state, for a candidate forked from this one."""
        return Matcher(self._matcher.fork(), self._vocab_size)

    def accept(self, token: int) -> bool:
        """Advance by ``token``; False when the grammar does not allow it (nothing moves)."""
        return bool(self._matcher.accept_token(token))

    @property
    def done(self) -> bool:
        """The reply is complete and its stop token taken: nothing more may follow."""
        return bool(self._matcher.is_terminated())

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)


def token_masks(matchers: Sequence[Matcher | None], vocab_size: int) -> list[torch.Tensor | None]:
    """Per row, the boolean [vocab_size] mask of the tokens it may sample (None for an
    unconstrained row). One bitmask is filled for the constrained rows and unpacked once."""
    constrained = [i for i, m in enumerate(matchers) if m is not None]
    masks: list[torch.Tensor | None] = [None] * len(matchers)
    if not constrained:
        return masks
    words = (vocab_size + 31) // 32
    # numpy owns the buffer and unpacks it in one single-threaded call: a few torch ops
    # here would each wake torch's thread pool, which costs more than the work.
    bits = np.full((len(constrained), words), -1, dtype=np.int32)
    bitmask = torch.from_numpy(bits)
    for row, i in enumerate(constrained):
        matchers[i].fill(bitmask, row)
    # Bit j of word w is token 32 * w + j: little-endian words, little bit order.
    unpacked = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")
    allowed = torch.from_numpy(unpacked[:, :vocab_size].astype(bool))
    for row, i in enumerate(constrained):
        masks[i] = allowed[row]
    return masks
