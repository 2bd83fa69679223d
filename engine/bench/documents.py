"""``folio bench documents``: chatting with an attached PDF (engine/documents,
engine/chat/attachments.py), on the bench's model, one run, in fresh temporary folders
for the KV disk tier and the document store.

- A 4-page PDF of about ``document_tokens`` tokens, read whole: the first question's time
  to first token; then, over it, the second question in the same chat, the first
  question of a new chat with the same file, and a new chat's first question after a
  restart (a new engine on the same disk tier). The replies after the restart are held
  to those of the first engine.
- The same first question's prompt ids prefilled by Folio and by llama.cpp, each in a
  process of its own (engine/bench/first_read.py): the first read against the CPU bar.
- A 60-page PDF, too long for the context, so searched: from attaching it to the first
  token of an answer (the prompt built: the text extracted and stored, the passages
  indexed; then the prefill), with the extraction's and the indexing's shares.
- Extracting that 60-page PDF with each reader Folio compared (``pypdfium2``, Folio's;
  ``pypdf`` and ``markitdown`` where installed).
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from contextlib import contextmanager

from engine.bench.common import bench_result, ms
from engine.bench.first_read import first_read_row
from engine.bench.pdf_writer import write_pdf
from engine.bench.setup import USER_TEXTS, BenchContext, Target, folio_config
from engine.sampling_params import SamplingParams

DISK_BYTES = 1 << 30
LONG_PAGES = 60
LINES_PER_PAGE = 40
SYSTEM = {"role": "system", "content": "Answer from the attached document."}
QUESTIONS = ("What does the document suggest for a rainy day?",
             "And how much does a simple dinner cost?",
             "Which parts of the plan suit a wheelchair?",
             "Is it normal to leave a tip?")


def bench_documents(ctx: BenchContext) -> dict:
    s = ctx.settings
    params = SamplingParams(max_tokens=s.reply_tokens, temperature=0, ignore_eos=True)
    notes = ["one run each; extraction and indexing are in the 60-page row's attach time"]
    with _fresh_folders():
        warm = _warm_rows(ctx, params, notes)
        long_row = _long_row(ctx, params)
        first_read = first_read_row(str(ctx.model_path), ctx.threads, s.weights,
                                    s.cpu_activation_bits, warm.pop("first_prompt_ids"),
                                    notes)
    readers = _reader_rows()
    rows = [warm, first_read, long_row, *readers]
    targets = [
        Target("4-page PDF: second question / first question TTFT",
               warm["same_chat_over_first"], 0.1, "<="),
        Target("4-page PDF: a new chat's first question / the first chat's first TTFT",
               warm["new_chat_over_first"], 0.15, "<="),
        Target("4-page PDF: a new chat after a restart / the first chat's first TTFT",
               warm["restart_over_first"], 0.2, "<="),
    ]
    if "folio_over_llama_cpp" in first_read:
        targets.append(Target("4-page PDF: the first read, Folio / llama.cpp prefill of the "
                              "same prompt ids", first_read["folio_over_llama_cpp"], 0.8,
                              "<="))
    summary = {"document_tokens": warm["document_tokens"], "long_pages": LONG_PAGES,
               "readers": [r["reader"] for r in readers]}
    return bench_result("documents", ctx, rows, summary, targets, notes)


def _warm_rows(ctx: BenchContext, params: SamplingParams, notes: list[str]) -> dict:
    first_llm = _llm(ctx)
    _warm_up(first_llm, params)
    pdf = _pdf_of_tokens(first_llm, ctx.settings.document_tokens)
    first = first_llm.chat(_ask(pdf, QUESTIONS[0]), params)
    reply = first.outputs[0]
    same_chat = [*_ask(pdf, QUESTIONS[0]),
                 {"role": "assistant", "content": reply.text, "token_ids": reply.token_ids},
                 {"role": "user", "content": QUESTIONS[1]}]
    same = first_llm.chat(same_chat, params)
    new = first_llm.chat(_ask(pdf, QUESTIONS[2]), params)
    built = first_llm.engine.prompts.build(_request(_ask(pdf, QUESTIONS[0])))
    document = built.documents[0]
    first_llm.close()  # the cached blocks to disk, as the app quits
    # Asked after the close, so the restart finds the document on disk but not this
    # question: it is the first engine's reply to hold the restart's to.
    kept_open = first_llm.chat(_ask(pdf, QUESTIONS[3]), params)
    del first_llm
    restarted = _llm(ctx)
    _warm_up(restarted, params)
    after = restarted.chat(_ask(pdf, QUESTIONS[3]), params)
    if after.outputs[0].token_ids != kept_open.outputs[0].token_ids:
        notes.append("the reply after the restart differs from the first engine's")
    base = first.metrics.ttft_s
    row = {"case": "4-page PDF, whole", "document_tokens": document.tokens,
           "mode": document.mode, "first_ttft_ms": ms(base)}
    for key, out in (("same_chat", same), ("new_chat", new), ("restart", after)):
        m = out.metrics
        row[f"{key}_ttft_ms"] = ms(m.ttft_s)
        row[f"{key}_computed_tokens"] = m.num_prompt_tokens - m.num_cached_tokens
        row[f"{key}_over_first"] = round(m.ttft_s / base, 4)
    row["restart_disk_tokens"] = after.metrics.num_disk_tokens
    row["first_prompt_ids"] = list(built.ids)  # for the first read next to llama.cpp
    return row


def _long_row(ctx: BenchContext, params: SamplingParams) -> dict:
    from engine.chat import ChatRequest
    from engine.documents import DocumentIndex, extract

    llm = _llm(ctx)
    _warm_up(llm, params)
    pdf = _pages_pdf(LONG_PAGES, seed=1)
    start = time.perf_counter()
    document = extract(pdf, "trip-60.pdf")
    extracted = time.perf_counter()
    DocumentIndex(document)
    indexed = time.perf_counter()
    start_attach = time.perf_counter()
    prompt = llm.engine.prompts.build(ChatRequest(_ask(pdf, QUESTIONS[0])))  # new store
    built = time.perf_counter() - start_attach
    out = llm.chat(prompt, params)
    total = built + out.metrics.ttft_s
    return {"case": f"{LONG_PAGES}-page PDF, searched", "document_tokens":
            prompt.documents[0].tokens, "mode": prompt.documents[0].mode,
            "prompt_tokens": out.metrics.num_prompt_tokens,
            "attach_to_first_token_ms": ms(total), "build_ms": ms(built),
            "extract_ms": ms(extracted - start), "index_ms": ms(indexed - extracted),
            "extract_share": round((extracted - start) / total, 4),
            "index_share": round((indexed - extracted) / total, 4),
            "prefill_ttft_ms": ms(out.metrics.ttft_s)}


def _reader_rows() -> list[dict]:
    """The 60-page PDF through each reader installed; one warm run each."""
    import io

    pdf = _pages_pdf(LONG_PAGES, seed=1)

    def pdfium(data):
        from engine.documents.extract_pdf import extract_pdf
        return extract_pdf(data, "x.pdf", "").text

    def pypdf(data):
        import pypdf
        return "\n".join(p.extract_text() for p in pypdf.PdfReader(io.BytesIO(data)).pages)

    def markitdown(data):
        from markitdown import MarkItDown
        return MarkItDown().convert_stream(io.BytesIO(data), file_extension=".pdf").text_content

    rows = []
    for name, read in (("pypdfium2", pdfium), ("pypdf", pypdf), ("markitdown", markitdown)):
        try:
            read(pdf)
        except ImportError:
            continue
        start = time.perf_counter()
        text = read(pdf)
        rows.append({"case": f"extract {LONG_PAGES} pages", "reader": name,
                     "extract_ms": ms(time.perf_counter() - start),
                     "words": len(text.split())})
    return rows


def _pdf_of_tokens(llm, tokens: int) -> bytes:
    """A 4-page PDF whose text is at least ``tokens`` tokens whole, by whole lines."""
    lines = 1
    while True:
        pdf = _pages_pdf(4, lines=lines)
        made = llm.engine.prompts.build(_request(_ask(pdf, "?"))).documents[0].tokens
        if made >= tokens or lines >= 400:
            return pdf
        lines = max(lines + 1, int(lines * tokens / made))


def _pages_pdf(pages: int, lines: int = LINES_PER_PAGE, seed: int = 0) -> bytes:
    """Pages of the bench's user texts' sentences, shuffled, about 90 characters a line."""
    rng = random.Random(seed)
    words = " ".join(USER_TEXTS).split()
    text = []
    for _ in range(pages):
        page = []
        for _ in range(lines):
            start = rng.randrange(len(words) - 16)
            page.append(" ".join(words[start:start + 15]))
        text.append(page)
    return write_pdf(text)


def _ask(pdf: bytes, question: str) -> list[dict]:
    from engine.documents import file_data_url

    part = {"type": "file", "file": {"file_data": file_data_url(pdf, "application/pdf"),
                                     "filename": "trip.pdf"}}
    return [SYSTEM, {"role": "user", "content": [part, {"type": "text", "text": question}]}]


def _request(messages: list[dict]):
    from engine.chat import ChatRequest

    return ChatRequest(messages)


def _warm_up(llm, params: SamplingParams) -> None:
    llm.chat([{"role": "user", "content": "Warm-up."}], params)


def _llm(ctx: BenchContext):
    from engine.llm import LLM

    s = ctx.settings
    return LLM(str(ctx.model_path), folio_config(
        ctx.threads, s.weights, num_gpu_blocks=s.kv_blocks,
        cpu_activation_bits=s.cpu_activation_bits, kv_disk_bytes=DISK_BYTES))


@contextmanager
def _fresh_folders():
    """The KV disk tier and the document store in a temporary folder, as a new user's."""
    names = ("FOLIO_KV_CACHE_DIR", "FOLIO_DOCUMENTS_DIR")
    saved = {name: os.environ.get(name) for name in names}
    with tempfile.TemporaryDirectory(prefix="folio-documents-") as folder:
        os.environ["FOLIO_KV_CACHE_DIR"] = os.path.join(folder, "kv")
        os.environ["FOLIO_DOCUMENTS_DIR"] = os.path.join(folder, "documents")
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
