"""``folio bench concurrent``: several one-message chats (default 8) submitted at once to
the ``EngineWorker`` (continuous batching), against transformers answering them one after
another, as a single-threaded app would.

Folio's TTFT per chat counts from that chat's submission to its first token event; its total
tokens/s is all generated tokens over the time from the first submission to the last
finish. transformers' TTFT counts from the moment all chats were submitted, so each chat
also waits for the ones answered before it.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

from engine.bench.baselines import hf_generate
from engine.bench.common import bench_result, ms, warm_up
from engine.bench.setup import BenchContext, user_messages
from engine.outputs import FinishedEvent, TokenEvent
from engine.sampling_params import SamplingParams


@dataclass(slots=True)
class _Chat:
    submitted: float = 0.0
    first: float | None = None
    finished: float | None = None
    tokens: int = 0


def bench_concurrent(ctx: BenchContext) -> dict:
    s = ctx.settings
    llm = ctx.new_llm()
    warm_up(llm, ctx)
    texts = user_messages(llm.tokenizer, s.concurrent_chats, s.user_tokens)
    params = SamplingParams(max_tokens=s.reply_tokens, temperature=0, ignore_eos=True)
    chats, folio_wall = _run_folio(llm, texts, params)
    hf_ttft, hf_wall = _run_hf_sequential(ctx, llm.tokenizer, texts, s.reply_tokens)
    rows = [{"chat": i + 1, "folio_ttft_ms": ms(c.first - c.submitted),
             "hf_sequential_ttft_ms": ms(hf_ttft[i])} for i, c in enumerate(chats)]
    total = sum(c.tokens for c in chats)
    summary = {"chats": len(chats), "tokens": total,
               "folio_total_tok_s": round(total / folio_wall, 1),
               "hf_sequential_total_tok_s": round(len(chats) * s.reply_tokens / hf_wall, 1),
               "folio_median_ttft_ms": ms(statistics.median(c.first - c.submitted
                                                            for c in chats))}
    notes = ["transformers answers the chats one after another, as a single-threaded app "
             "would; its TTFT counts from when all chats were submitted"]
    return bench_result("concurrent", ctx, rows, summary, [], notes)


def _run_folio(llm, texts: list[str], params: SamplingParams) -> tuple[list[_Chat], float]:
    """Submit every chat to an EngineWorker at once; the chats' timings and the wall time."""
    from engine.worker import EngineWorker

    chats = [_Chat() for _ in texts]
    all_done = threading.Event()
    remaining = [len(chats)]
    lock = threading.Lock()

    def on_event(chat: _Chat, event) -> None:  # runs on the worker thread
        now = time.perf_counter()
        if isinstance(event, TokenEvent | FinishedEvent) and chat.first is None:
            chat.first = now
        if isinstance(event, FinishedEvent):
            chat.finished = now
            chat.tokens = event.output.metrics.num_generated_tokens
            with lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    all_done.set()

    worker = EngineWorker(llm).start()
    try:
        start = time.perf_counter()
        for chat, text in zip(chats, texts, strict=True):
            chat.submitted = time.perf_counter()
            worker.submit([{"role": "user", "content": text}], params,
                          lambda event, chat=chat: on_event(chat, event))
        if not all_done.wait(timeout=600):
            raise RuntimeError("the concurrent chats did not finish within 10 minutes")
    finally:
        worker.shutdown()
    return chats, max(c.finished for c in chats) - start


def _run_hf_sequential(ctx: BenchContext, tokenizer, texts: list[str],
                       reply_tokens: int) -> tuple[list[float], float]:
    """transformers answers one chat after another: each TTFT from the common start, and the
    wall time of them all."""
    hf_start = time.perf_counter()
    hf_ttft = []
    for text in texts:
        ids = tokenizer.encode_chat([{"role": "user", "content": text}])
        began = time.perf_counter()
        reply = hf_generate(ctx.hf_model, ids, reply_tokens)
        hf_ttft.append(began - hf_start + reply.ttft_s)
    return hf_ttft, time.perf_counter() - hf_start
