"""The draft length follows acceptance: up when drafts are kept, down to a pause when
they keep failing, then one draft again."""

from __future__ import annotations

import pytest

from engine.spec.draft_length import DraftLength


def test_starts_small_and_grows_to_the_limit():
    assert DraftLength(32).next() == 4
    d = DraftLength(32, first=8)
    assert d.next() == 8
    d.update(8, 8)
    assert d.next() == 16
    d.update(16, 16)
    assert d.next() == 32
    d.update(32, 32)
    assert d.next() == 32


def test_grows_when_all_kept_and_settles_after_partial():
    d = DraftLength(8, first=8)
    assert d.next() == 8
    d.update(8, 8)
    assert d.next() == 8  # at the limit
    d.update(8, 3)
    assert d.next() == 4  # one more than were kept
    d.update(4, 4)
    assert d.next() == 8


def test_failures_halve_then_pause_then_retry_one():
    d = DraftLength(4, first=4)
    d.update(4, 0)
    assert d.next() == 2
    d.update(2, 0)
    assert d.next() == 1
    d.update(1, 0)  # third miss in a row: a pause of 2 ** 3 steps
    assert [d.next() for _ in range(8)] == [0] * 8
    assert d.next() == 1
    d.update(1, 0)  # the fourth miss: twice as long
    assert [d.next() for _ in range(16)] == [0] * 16
    assert d.next() == 1
    d.update(1, 1)
    assert d.next() == 2


def test_nothing_drafted_changes_nothing():
    d = DraftLength(4, first=4)
    d.update(0, 0)
    assert d.next() == 4


def test_limit_must_be_positive():
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        DraftLength(0)
