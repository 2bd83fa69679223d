"""Attached documents through the engine: a document that fits goes whole after the
system prompt, rendered the same way every time, so the next question in the chat, the
first question of a new chat with the same file, and a new chat after a restart (disk
tier on) compute only their own tokens, with the replies of a fresh run; one too long for
the context is searched and its passages go into the question's turn."""

from __future__ import annotations

import pytest

from engine import SamplingParams
from engine.bench.pdf_writer import write_pdf
from engine.chat import ChatRequest
from engine.chat.attachments import RETRIEVAL, WHOLE
from engine.documents import extract, file_data_url, render_document, render_documents
from tests.engine import test_disk_tier_engine as disk_tests
from tests.engine.test_disk_tier_engine import new_llm

cache, tiny = disk_tests.cache, disk_tests.tiny  # a KV cache folder per test, the model
pytestmark = pytest.mark.usefixtures("single_torch_thread")

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
SYSTEM = {"role": "system", "content": "Answer from the document."}
PAGES = [["Folio keeps KV blocks.", "The pump code is 4471."],
         ["Page two lists the valves.", "Valve nine is red."]]


def file_part(data: bytes, name: str = "plant.pdf") -> dict:
    return {"type": "file", "file": {"file_data": file_data_url(data, "application/pdf"),
                                     "filename": name}}


def ask(question: str, data: bytes) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": [file_part(data),
                                                  {"type": "text", "text": question}]}]


def own_tokens(llm, earlier: list[int], prompt: list[int]) -> int:
    """Tokens of ``prompt`` past what it shares with ``earlier`` (a prompt and reply)."""
    shared = next((i for i, (a, b) in enumerate(zip(earlier, prompt, strict=False))
                   if a != b), min(len(earlier), len(prompt)))
    return len(prompt) - shared


def test_the_document_goes_whole_after_the_system_prompt(tiny, cache):
    llm = new_llm(tiny)
    pdf = write_pdf(PAGES)
    prompt = llm.engine.prompts.build(ChatRequest(
        ask("What is the pump code?", pdf)))
    block = render_documents([render_document(extract(pdf, "plant.pdf"))])
    expected = llm.tokenizer.encode_chat([
        {"role": "system", "content": f"{SYSTEM['content']}\n\n{block}"},
        {"role": "user", "content": "What is the pump code?"}])
    assert prompt.ids == expected
    assert "[page 2]\nPage two lists the valves." in block
    (use,) = prompt.documents
    assert (use.name, use.kind, use.mode) == ("plant.pdf", "pdf", WHOLE) and use.tokens > 100
    # Without a system prompt the documents are the system prompt.
    bare = llm.engine.prompts.build(ChatRequest(
        ask("q", pdf)[1:]))
    assert bare.ids == llm.tokenizer.encode_chat([{"role": "system", "content": block},
                                                  {"role": "user", "content": "q"}])


def test_later_questions_and_new_chats_compute_only_their_own_tokens(tiny, cache):
    pdf = write_pdf(PAGES)
    llm = new_llm(tiny)
    first = llm.chat(ask("What is the pump code?", pdf), GREEDY)
    reply = first.outputs[0]
    assert first.metrics.num_cached_tokens == 0
    same_chat = [*ask("What is the pump code?", pdf),
                 {"role": "assistant", "content": reply.text, "token_ids": reply.token_ids},
                 {"role": "user", "content": "And valve nine?"}]
    new_chat = ask("Which valve is red?", pdf)
    # What the cache holds: the prompt and the reply but its last token (never run).
    before = [*llm.engine.encode(ask("What is the pump code?", pdf)), *reply.token_ids[:-1]]
    second = llm.chat(same_chat, GREEDY)
    other = llm.chat(new_chat, GREEDY)
    for out, messages in ((second, same_chat), (other, new_chat)):
        computed = out.metrics.num_prompt_tokens - out.metrics.num_cached_tokens
        own = own_tokens(llm, before, llm.engine.encode(messages))
        # The cache holds full blocks (and a finished reply's last partial one): a prompt
        # that parts from the earlier one mid-block recomputes that block's head.
        assert 0 <= computed - own < llm.engine.config.block_size, (computed, own)
        assert computed < out.metrics.num_cached_tokens
    # A restart with the disk tier on: the new chat's document comes from disk.
    llm.close()
    restarted = new_llm(tiny)
    again = restarted.chat(new_chat, GREEDY)
    assert again.metrics.num_disk_tokens > 0
    assert again.metrics.num_prompt_tokens - again.metrics.num_cached_tokens < 40
    # The replies are those of a fresh run over the same prompts.
    fresh = new_llm(tiny, kv_disk_bytes=0, enable_prefix_caching=False)
    for out, messages in ((second, same_chat), (other, new_chat), (again, new_chat)):
        assert out.outputs[0].token_ids == fresh.chat(messages, GREEDY).outputs[0].token_ids


def test_a_document_too_long_for_the_context_is_searched(tiny, cache):
    # The tiny model reads 1024 tokens (bytes); 48 lines of 45 are past it.
    pages = [[f"Filler line {p}-{i} about nothing much at all." for i in range(6)]
             for p in range(8)]
    pages[3][5] = "The secret harbour password is marmalade."
    pdf = write_pdf(pages)
    llm = new_llm(tiny, kv_disk_bytes=0)
    prompt = llm.engine.prompts.build(ChatRequest(
        ask("What is the harbour password?", pdf)))
    (use,) = prompt.documents
    assert use.mode == RETRIEVAL and use.tokens > llm.engine.max_model_len
    text = llm.tokenizer.decode(prompt.ids)
    assert "[page 4]" in text and "marmalade" in text
    assert text.index("marmalade") < text.index("What is the harbour password?")
    assert len(prompt.ids) < llm.engine.max_model_len
    out = llm.chat(ask("What is the harbour password?", pdf), GREEDY)
    assert len(out.outputs[0].token_ids) == 8


def test_a_bad_file_is_a_value_error_naming_it(tiny, cache):
    llm = new_llm(tiny, kv_disk_bytes=0)
    with pytest.raises(ValueError, match=r"locked\.pdf: the PDF is encrypted"):
        llm.chat(ask("q", write_pdf([["x"]], user_password="pw"))[:1] + [
            {"role": "user", "content": [file_part(write_pdf([["x"]], "pw"), "locked.pdf"),
                                         {"type": "text", "text": "q"}]}], GREEDY)
    bad = {"type": "file", "file": {"file_data": "not a url", "filename": "x.pdf"}}
    with pytest.raises(ValueError, match=r"messages\[0\]\.content\[0\]\.file\.file_data"):
        llm.chat([{"role": "user", "content": [bad]}], GREEDY)
