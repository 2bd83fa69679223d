"""HiddenRows: the target's hidden states kept per candidate until its MTP head reads them."""

from __future__ import annotations

import torch

from engine.spec.mtp_rows import HiddenRows

ZERO = torch.zeros(1, 2)


def rows(start: int, stop: int) -> torch.Tensor:
    """Row p holds (p, -p): a row's value names its position."""
    return torch.tensor([[p, -p] for p in range(start, stop)], dtype=torch.float32)


def test_chunks_join_and_a_recompute_replaces_from_its_start():
    kept = HiddenRows()
    kept.put(0, rows(0, 5))
    kept.put(5, rows(5, 9))  # the next chunk (a verify step's rows included)
    assert torch.equal(kept.gather(range(0, 9), ZERO), rows(0, 9))
    kept.put(7, rows(7, 8) + 100)  # drafts past 7 were rejected: the next step from 7
    assert (kept.start, kept.end) == (0, 8)
    assert torch.equal(kept.gather(range(6, 8), ZERO), torch.cat([rows(6, 7), rows(7, 8) + 100]))


def test_positions_never_computed_read_zeros():
    kept = HiddenRows()
    kept.put(16, rows(16, 20))  # a prefix hit: the target began at 16
    got = kept.gather(range(14, 18), ZERO)
    assert torch.equal(got, torch.cat([ZERO, ZERO, rows(16, 18)]))
    assert kept.gather(range(3, 3), ZERO).shape == (0, 2)


def test_read_rows_are_dropped_and_a_fork_gets_the_shared_prompts():
    kept = HiddenRows()
    kept.put(0, rows(0, 10))
    child = kept.copy_below(6)
    assert (child.start, child.end) == (0, 6)
    kept.drop_before(4)
    assert (kept.start, kept.end) == (4, 10)
    assert torch.equal(kept.gather(range(4, 10), ZERO), rows(4, 10))
    kept.drop_before(12)
    assert kept.rows is None and kept.end == 12
    assert kept.copy_below(3).rows is None
