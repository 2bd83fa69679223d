"""Prompt lookup's two sources: the request's own tokens and the client's prediction."""

from __future__ import annotations

from engine.spec.ngram import OwnTokens, Prediction


def test_own_tokens_continue_the_latest_earlier_occurrence():
    own = OwnTokens()
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    # "1 2 3" ends at 3 and at 8 before the suffix; the latest (8) is followed by 7 8 5.
    assert own.propose(tokens, 4) == [7, 8, 5, 1]
    assert own.propose(tokens, 2) == [7, 8]


def test_own_tokens_need_three_matching_tokens_and_grow_incrementally():
    own = OwnTokens()
    assert own.propose([4, 5, 6, 7, 5, 6], 3) == []  # two repeated tokens are not enough
    tokens = [4, 5, 6, 7, 5, 6, 7]
    assert own.propose(tokens, 3) == [5, 6, 7]
    tokens += [5, 6]
    assert own.propose(tokens, 3) == [7, 5, 6]  # "6 7 5 6" found again, latest first
    assert own.propose(tokens, 0) == []


def test_prediction_opens_with_its_start_then_follows_the_reply():
    pred = Prediction([10, 11, 12, 13, 14, 15])
    assert pred.propose([], 3) == [10, 11, 12]
    assert pred.propose([10, 11, 12, 13], 3) == [14, 15]
    assert pred.propose([10, 11, 99], 3) == []  # the reply left the prediction


def test_prediction_moves_forward_through_repeated_lines():
    line = [1, 2, 3, 4]
    pred = Prediction(line + [7] + line + [8])
    assert pred.propose([1, 2], 2) == [3, 4]  # the first occurrence
    # The reply wrote the first line and a 7: after "4 7" comes the second line.
    assert pred.propose([1, 2, 3, 4, 7], 3) == [1, 2, 3]
    # Its "1 2" now continues the second line, not the first (the last match was past it).
    assert pred.propose([1, 2, 3, 4, 7, 1, 2], 3) == [3, 4, 8]


def test_prediction_of_nothing_drafts_nothing():
    assert Prediction([]).propose([], 4) == []


def test_prediction_keeps_its_place_past_a_line_repeated_close_by():
    pred = Prediction([1, 2, 3, 4, 1, 2, 3, 4, 8, 7])
    assert pred.propose([], 2) == [1, 2]
    # The reply wrote both lines: it stands at position 8, though its last four tokens also
    # end at 4, the first match past the last proposal's start.
    assert pred.propose([1, 2, 3, 4, 1, 2, 3, 4], 3) == [8, 7]
