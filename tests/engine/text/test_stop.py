"""StopChecker: stop strings on streamed text deltas."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.text.stop import StopChecker


def feed(checker: StopChecker, deltas: list[str]) -> list[tuple[bool, str]]:
    return [checker.check(d) for d in deltas]


def test_a_stop_string_split_across_deltas_is_never_emitted() -> None:
    checker = StopChecker(["###"])
    assert feed(checker, ["Hello #", "#", "# world"]) == [
        (False, "Hello "), (False, ""), (True, ""),
    ]
    assert checker.stopped
    assert checker.check("more") == (True, "")


def test_a_held_tail_is_released_when_it_stops_matching() -> None:
    checker = StopChecker(["END"])
    assert feed(checker, ["the EN", "d of", " it E"]) == [
        (False, "the "), (False, "ENd of"), (False, " it "),
    ]
    assert checker.flush() == "E"
    assert checker.flush() == ""


def test_the_stop_string_completed_first_wins() -> None:
    assert StopChecker(["c", "b c"]).check("a b c d") == (True, "a ")
    # "b" is complete before "abc" could be, however the text arrives.
    assert StopChecker(["abc", "b"]).check("xabc") == (True, "xa")
    assert feed(StopChecker(["abc", "b"]), ["xa", "bc"]) == [(False, "x"), (True, "a")]
    assert StopChecker("STOP").check("abcSTOPdef") == (True, "abc")


def test_no_stop_strings_pass_everything_through() -> None:
    checker = StopChecker([])
    assert feed(checker, ["a", "b"]) == [(False, "a"), (False, "b")]


def test_empty_stop_strings_are_rejected() -> None:
    with pytest.raises(ValueError, match="stop"):
        StopChecker(["ok", ""])


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="ab\n", max_size=30),
    cuts=st.lists(st.integers(0, 30), max_size=8),
    stops=st.lists(st.text(alphabet="ab\n", min_size=1, max_size=4), min_size=1, max_size=3),
)
def test_streamed_text_is_the_text_cut_at_the_first_stop(text, cuts, stops) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    checker = StopChecker(stops)
    emitted, stopped = "", False
    for start, end in zip(bounds, bounds[1:], strict=False):
        stopped, out = checker.check(text[start:end])
        emitted += out
        assert not any(s in emitted for s in stops)
        if stopped:
            break
    # Cut where the stop string that is complete first (the earliest end) starts.
    hits = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    if hits:
        assert stopped and emitted == text[: min(hits)[1]]
    else:
        assert not stopped and emitted + checker.flush() == text
