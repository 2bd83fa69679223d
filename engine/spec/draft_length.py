"""How many tokens one candidate drafts next: it follows what the model accepted.

A draft the model rejects costs its share of the verify forward and gives nothing back,
so a candidate whose drafts keep failing drafts fewer, then none for a while (plain
decode), then tries one again: a chat where nothing repeats decodes at the plain rate.

- the first step asks for at most ``first`` (a guess that fails costs its share of the
  verify forward, so a long one is earned: 4 by default, more for a client's prediction);
- every draft accepted: twice as many next time, up to the limit;
- some accepted: one more than were accepted;
- none accepted: half as many; at zero, a pause of 2, 4, 8... steps (at most
  ``_LONGEST_PAUSE``) before a single draft is tried again.
"""

from __future__ import annotations

_LONGEST_PAUSE = 64
FIRST = 4


class DraftLength:
    __slots__ = ("limit", "k", "_misses", "_pause")

    def __init__(self, limit: int, first: int = FIRST) -> None:
        if limit < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {limit}")
        self.limit = limit
        self.k = min(limit, first)
        self._misses = 0  # verify steps in a row that accepted nothing
        self._pause = 0  # steps left without drafting

    def next(self) -> int:
        """The drafts to ask for this step (0 while paused)."""
        if self._pause:
            self._pause -= 1
            if not self._pause:
                self.k = 1
            return 0
        return self.k

    def update(self, drafted: int, accepted: int) -> None:
        """What the step that verified ``drafted`` drafts accepted."""
        if drafted <= 0:
            return
        if accepted >= drafted:
            self._misses = 0
            self.k = min(self.limit, 2 * self.k)
        elif accepted > 0:
            self._misses = 0
            self.k = min(self.limit, accepted + 1)
        else:
            self._misses += 1
            self.k //= 2
            if self.k == 0:
                self._pause = min(_LONGEST_PAUSE, 2 ** self._misses)
