"""The fold of a long paste: joined into the sent text, split back out of it."""

from __future__ import annotations

from desktop_app.data.pasted_text import (
    FOLD_CHARS,
    SplitMessage,
    fold_label,
    join_draft,
    should_fold,
    split_message,
)

LONG = "line of a pasted document\n" * 100


def test_only_text_over_the_threshold_folds():
    assert not should_fold("x" * FOLD_CHARS) and should_fold("x" * (FOLD_CHARS + 1))
    assert split_message("short question") == SplitMessage("short question", "")


def test_split_reads_back_what_the_draft_joined():
    sent = join_draft("  Summarize this.\n", [LONG])
    assert sent == "Summarize this.\n\n" + LONG.strip("\n")
    split = split_message(sent)
    assert (split.lead, split.pasted) == ("Summarize this.", LONG.strip("\n"))
    # No typed words: the whole message folds, even if it opens with a short paragraph
    # that is then shown above the fold (the paste's own title).
    alone = split_message(join_draft("", [LONG]))
    assert (alone.lead, alone.pasted) == ("", LONG.strip("\n"))
    titled = split_message("# Report\n\n" + LONG)
    assert (titled.lead, titled.pasted) == ("# Report", LONG)
    # A long first paragraph is not shown as typed words: all of it folds.
    wall = "word " * 400 + "\n\n" + LONG
    assert split_message(wall) == SplitMessage("", wall)


def test_two_pastes_and_the_label():
    sent = join_draft("", [LONG, "second " * 300])
    assert sent.count("\n\n") == 1
    assert fold_label(LONG, 1234) == "Pasted text · 1,234 tokens"
    assert fold_label(LONG, None) == f"Pasted text · {len(LONG):,} characters"
