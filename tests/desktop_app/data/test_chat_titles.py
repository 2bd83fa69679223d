"""Chat titles from the first message: the first line that says something, one short line."""

from __future__ import annotations

import pytest

from desktop_app.data.chat_titles import DEFAULT_TITLE, TITLE_LENGTH, title_from


@pytest.mark.parametrize("text, title", [
    ("What is the capital of France?", "What is the capital of France?"),
    ("  hello   there  \n", "hello there"),
    ("\n\n   \n# Release notes\n\nBody text", "Release notes"),
    ("## **Bold** heading with `code`", "Bold heading with code"),
    ("> quoted question?", "quoted question?"),
    ("- first item\n- second item", "first item"),
    ("1. step one", "step one"),
    ("* [ ] a task", "a task"),
    ("See [the docs](https://example.com) please", "See the docs please"),
    ("```python\nprint('hi')\n```", "print('hi')"),
    ("#hashtag stays", "#hashtag stays"),
    ("3.14 is pi", "3.14 is pi"),
    ("", DEFAULT_TITLE),
    ("  \n\t\n", DEFAULT_TITLE),
    ("# \n***\n", DEFAULT_TITLE),
])
def test_title_is_the_first_line_without_markdown(text, title):
    assert title_from(text) == title


def test_a_long_line_is_cut_at_a_word_boundary():
    text = "Please summarise the following very long document about paged attention " \
           "engines and their block tables"
    title = title_from(text)
    assert title.endswith("…") and len(title) <= TITLE_LENGTH
    assert text.startswith(title[:-1])
    assert text[len(title) - 1] == " "  # the cut fell between two words


def test_one_very_long_word_is_cut_inside_it():
    title = title_from("x" * 200)
    assert title == "x" * (TITLE_LENGTH - 1) + "…"


def test_a_pasted_markdown_document_titles_by_its_heading():
    doc = "# Folio design notes\n\n" + "Lorem ipsum dolor sit amet. " * 500
    assert title_from(doc) == "Folio design notes"
