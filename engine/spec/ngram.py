"""Prompt lookup: drafts copied from where the reply's last few tokens appeared before.

Two sources, tried in this order:

- the client's prediction (OpenAI's Predicted Outputs: the text the reply is expected to
  be, such as the file an editor asks to have edited). Drafts follow the reply's position
  in it: the prediction's opening before the reply has a token, then the continuation of
  the latest suffix of the reply found in it, preferring the first match past the last one
  used, so a reply that repeats a line keeps moving forward through the prediction;
- the request's own tokens (prompt and reply so far): the continuation of the most recent
  earlier occurrence of the longest suffix of 3 or 4 tokens. Code edits and quoted text copy
  from the prompt; one or two repeated tokens ("of the") are too weak a signal to draft on
  (in prose they cost more rejected drafts than they save: docs/BENCHMARKS.md).

Each index is built once and grows by the tokens appended since the last call, so a step
costs a few dictionary lookups however long the chat is.
"""

from __future__ import annotations

from bisect import bisect_right

_OWN_NGRAMS = (4, 3)  # suffix lengths tried over the request's own tokens, longest first
_PREDICTION_NGRAMS = (4, 3, 2, 1)


class OwnTokens:
    """The latest end position of each n-gram of one sequence's tokens."""

    __slots__ = ("_last", "_indexed")

    def __init__(self) -> None:
        self._last: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are in ``_last``

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest
        suffix of ``tokens`` (the suffix itself excluded)."""
        n_tokens = len(tokens)
        # Index n-grams ending before the last token: the suffix must find an earlier one.
        for end in range(max(self._indexed, 1), n_tokens):
            for n in _OWN_NGRAMS:
                if end >= n:
                    self._last[tuple(tokens[end - n:end])] = end
        self._indexed = max(self._indexed, n_tokens)
        if k <= 0:
            return []
        for n in _OWN_NGRAMS:
            if n_tokens <= n:
                continue
            end = self._last.get(tuple(tokens[n_tokens - n:]))
            if end is not None:
                return tokens[end:end + k]
        return []


class Prediction:
    """Where a reply stands in the text the client predicted it to be."""

    __slots__ = ("ids", "_ends", "_last_end", "_last_len")

    def __init__(self, ids: list[int]) -> None:
        self.ids = list(ids)
        # n-gram -> the end positions of its occurrences, ascending.
        self._ends: dict[tuple[int, ...], list[int]] = {}
        for n in _PREDICTION_NGRAMS:
            for end in range(n, len(self.ids)):
                self._ends.setdefault(tuple(self.ids[end - n:end]), []).append(end)
        self._last_end = 0  # where the last proposal started in the prediction
        self._last_len = 0  # the reply's length then

    def propose(self, reply: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens of the prediction that should follow ``reply`` (the tokens
        generated so far)."""
        if k <= 0 or not self.ids:
            return []
        if not reply:
            self._last_end = self._last_len = 0
            return self.ids[:k]
        # Where the reply stands if it kept to the prediction since the last proposal.
        expected = self._last_end + len(reply) - self._last_len
        for n in _PREDICTION_NGRAMS:
            if len(reply) < n:
                continue
            ends = self._ends.get(tuple(reply[-n:]))
            if not ends:
                continue
            i = bisect_right(ends, self._last_end)
            if expected in ends[i:i + 64]:
                end = expected  # still in step: a repeated line elsewhere cannot pull it
            else:
                end = ends[i] if i < len(ends) else ends[-1]
            self._last_end, self._last_len = end, len(reply)
            return self.ids[end:end + k]
        return []
