"""The target's hidden states an MTP head has not read yet, per candidate.

Each target forward hands over its final-norm hidden states (`ModelRunner.hidden_sink`);
a tracked candidate keeps the rows of its positions, contiguous from ``start``. A chunk
that starts before the kept end (a recompute after a preemption, or the step after a
verify whose rejected drafts' rows were kept) replaces the rows from there; one that
starts past it (a prefix-cache hit: the target did not compute the cached positions)
starts over. The head reads rows below the candidate's computed tokens only, and once it
has read them they are dropped (`drop_before`).
"""

from __future__ import annotations

import torch


class HiddenRows:
    __slots__ = ("start", "rows")

    def __init__(self, start: int = 0, rows: torch.Tensor | None = None) -> None:
        self.start = start  # the position of the first kept row
        self.rows = rows  # [n, hidden]; None: none kept

    @property
    def end(self) -> int:
        return self.start + (0 if self.rows is None else self.rows.shape[0])

    def put(self, position: int, rows: torch.Tensor) -> None:
        """The target computed ``rows`` for positions from ``position`` on."""
        rows = rows.detach()
        if self.rows is None or position > self.end or position < self.start:
            self.start, self.rows = position, rows.clone()
            return
        kept = self.rows[:position - self.start]
        self.rows = torch.cat([kept, rows]) if kept.shape[0] else rows.clone()

    def gather(self, positions: range, zeros: torch.Tensor) -> torch.Tensor:
        """Rows [len(positions), hidden] of ``positions``; ``zeros`` (one row) where
        none is kept: positions the target never computed here (a prefix hit the head's
        own cache lacks), whose drafts are then only poorer, never wrong."""
        if self.rows is not None and self.start <= positions.start and \
                positions.stop <= self.end:
            return self.rows[positions.start - self.start:positions.stop - self.start]
        return torch.cat([self._row(p, zeros) for p in positions]) if len(positions) \
            else zeros[:0]

    def _row(self, position: int, zeros: torch.Tensor) -> torch.Tensor:
        if self.rows is not None and self.start <= position < self.end:
            return self.rows[position - self.start:position - self.start + 1]
        return zeros

    def drop_before(self, position: int) -> None:
        """The head has read every row before ``position``."""
        if self.rows is None or position <= self.start:
            return
        if position >= self.end:
            self.start, self.rows = position, None
            return
        self.rows = self.rows[position - self.start:].clone()
        self.start = position

    def copy_below(self, position: int) -> HiddenRows:
        """A candidate forked from this one after ``position`` shared tokens: their rows."""
        if self.rows is None or position <= self.start:
            return HiddenRows()
        return HiddenRows(self.start, self.rows[:position - self.start].clone())
