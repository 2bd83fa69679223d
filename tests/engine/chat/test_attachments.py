"""The prompt builder's attachments without a model: file parts lifted out of their turns
(each document once), whole documents after the system prompt, a document past the
context searched into the last user turn, other parts (an image) left where they are."""

from __future__ import annotations

import pytest

from engine.chat.attachments import RETRIEVAL, WHOLE, Attachments
from engine.documents import DocumentStore, file_data_url


def part(text: str, name: str) -> dict:
    return {"type": "file", "file": {"file_data": file_data_url(text.encode(), "text/plain"),
                                     "filename": name}}


@pytest.fixture
def attachments(tmp_path):
    # One token per character, a 4,000-token context: room for the conversation 1,000.
    return Attachments(len, 4000, DocumentStore(tmp_path))


def test_each_document_is_lifted_once_in_order(attachments):
    a, b = part("alpha text", "a.txt"), part("beta text", "b.md")
    messages = [{"role": "user", "content": [a, {"type": "text", "text": "q1"}]},
                {"role": "assistant", "content": "r1"},
                {"role": "user", "content": [b, a, {"type": "text", "text": "q2"}]}]
    lifted, documents = attachments.lift(messages)
    assert [d.name for d in documents] == ["a.txt", "b.md"]
    assert lifted[0]["content"] == [{"type": "text", "text": "q1"}]
    assert lifted[2]["content"] == [{"type": "text", "text": "q2"}]
    assert lifted[1] is messages[1]


def test_whole_documents_join_the_system_prompt(attachments):
    _, documents = attachments.lift([{"role": "user", "content": [part("alpha", "a.txt")]}])
    placed, uses = attachments.place(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}],
        documents)
    assert placed[0]["content"] == ('Be brief.\n\nThe user attached these documents:\n\n'
                                    '<document name="a.txt">\nalpha\n</document>')
    assert placed[1] == {"role": "user", "content": "q"}
    assert [(u.mode, u.tokens) for u in uses] == [(WHOLE, len(
        '<document name="a.txt">\nalpha\n</document>'))]


def test_a_document_past_the_context_is_searched_into_the_last_turn(attachments):
    text = "\n\n".join(f"Paragraph {i} about filler words." for i in range(200))
    text += "\n\nThe vault code is 1234."
    _, documents = attachments.lift([{"role": "user", "content": [part(text, "big.txt")]}])
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    placed, uses = attachments.place(
        [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "ok"},
         {"role": "user", "content": [image, {"type": "text", "text": "vault code?"}]}],
        documents)
    assert uses[0].mode == RETRIEVAL and uses[0].tokens > 4000
    assert placed[0] == {"role": "user", "content": "earlier"}  # no system prompt added
    passages, kept_image, question = placed[2]["content"]
    assert "The vault code is 1234." in passages["text"]
    assert len(passages["text"]) <= 2000  # half of the context
    assert kept_image is image and question["text"] == "vault code?"


def test_a_searched_document_needs_a_question(attachments):
    _, documents = attachments.lift([{"role": "user", "content": [part("x " * 5000,
                                                                         "big.txt")]}])
    with pytest.raises(ValueError, match="there is none"):
        attachments.place([{"role": "system", "content": "s"}], documents)
