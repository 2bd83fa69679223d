"""OpenAI ``file`` content parts in /v1/chat/completions: the document read whole after the
system prompt, the next request with it reporting the reuse in ``cached_tokens``; a bad
file a 400 in OpenAI's error shape with the reason; a malformed part refused by name."""

from __future__ import annotations

import openai
import pytest

from engine.bench.pdf_writer import write_pdf
from engine.documents import file_data_url
from tests.engine.documents.docx_writer import write_docx

GREEDY = {"temperature": 0, "max_tokens": 4}
PDF = write_pdf([["The pump code is 4471."], ["Valve nine is red."]])


def file_part(data: bytes, name: str, media_type: str = "application/pdf") -> dict:
    return {"type": "file", "file": {"file_data": file_data_url(data, media_type),
                                     "filename": name}}


def ask(question: str, part: dict) -> list[dict]:
    return [{"role": "system", "content": "Answer from the document."},
            {"role": "user", "content": [part, {"type": "text", "text": question}]}]


def test_a_file_part_is_read_and_its_tokens_are_reused(tiny_served):
    client = tiny_served.client()
    first = client.chat.completions.create(
        model=tiny_served.model, messages=ask("What is the pump code?",
                                              file_part(PDF, "plant.pdf")), **GREEDY)
    # The document's tokens are in the prompt: more than the question and template.
    assert first.usage.prompt_tokens > 100
    second = client.chat.completions.create(
        model=tiny_served.model, messages=ask("Which valve is red?",
                                              file_part(PDF, "plant.pdf")), **GREEDY)
    block = tiny_served.llm.engine.config.block_size
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert second.usage.prompt_tokens - cached < 30 + block
    assert cached > 100


def test_a_docx_part_is_read_too(tiny_served):
    docx = write_docx([("h1", "Scope"), ("p", "Pumps only.")])
    reply = tiny_served.client().chat.completions.create(
        model=tiny_served.model, messages=ask("Scope?", file_part(docx, "scope.docx", "")),
        **GREEDY)
    assert reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize(("data", "name", "reason"), [
    (write_pdf([["x"]], user_password="pw"), "locked.pdf", "the PDF is encrypted"),
    (write_pdf([[]]), "scan.pdf", "the PDF has no text (scanned pages?); Folio does no OCR"),
    (write_docx([("p", "hi")], {"word/media/zeros.bin": bytes(8 << 20)}), "bomb.docx",
     "a zip bomb?"),
    (b"\x00\x01", "sheet.xlsx", "unknown type (.xlsx)"),
])
def test_a_bad_file_is_a_400_naming_it_and_why(tiny_served, data, name, reason):
    part = file_part(data, name, "application/octet-stream")
    with pytest.raises(openai.BadRequestError) as caught:
        tiny_served.client().chat.completions.create(
            model=tiny_served.model, messages=ask("q", part), **GREEDY)
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["message"].startswith(f"{name}: {reason}")
    assert error["type"] == "invalid_request_error" and error["param"] == "messages"


@pytest.mark.parametrize(("part", "param", "message"), [
    ({"type": "file"}, "messages.1.content.0.file", "a file part needs its file"),
    ({"type": "file", "file": {"file_data": "x"}, "detail": 1}, "messages.1.content.0.detail",
     "is not supported"),
    ({"type": "file", "file": {"file_id": "file-abc"}}, "messages",
     "Folio keeps no uploaded files"),
    ({"type": "file", "file": {"file_data": "data:application/pdf;base64,@@@",
                               "filename": "x.pdf"}}, "messages", "not valid base64"),
])
def test_a_malformed_file_part_is_refused_by_name(tiny_served, part, param, message):
    with pytest.raises(openai.BadRequestError) as caught:
        tiny_served.client().chat.completions.create(
            model=tiny_served.model, messages=ask("q", part), **GREEDY)
    assert caught.value.body["param"] == param
    assert message in caught.value.body["message"]
