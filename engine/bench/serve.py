"""``folio bench serve``: the OpenAI-compatible API under load, through the official
``openai`` client on loopback.

- One client alone, then ``serve_clients`` (default 16) at once, each streaming one chat
  reply of ``reply_tokens`` tokens (``ignore_eos``, so every reply has the same length):
  total tokens/s at once against alone, and each client's time to its first streamed
  token (p95).
- A ``serve_turns``-turn chat (default 4) sent as a whole conversation each turn, as an
  OpenAI client does: each turn's TTFT and its ``cached_tokens``, showing the prefix cache
  working across requests.

No transformers side: it has no server; the comparison is Folio alone against Folio busy.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from engine.bench.common import bench_result, ms, warm_up
from engine.bench.setup import BenchContext, Target, user_messages


def bench_serve(ctx: BenchContext) -> dict:
    from engine.serve.server import start_in_background
    from engine.worker import EngineWorker

    s = ctx.settings
    llm = ctx.new_llm()
    warm_up(llm, ctx)
    worker = EngineWorker(llm).start()
    server = start_in_background(worker)
    try:
        # Distinct texts for every client and turn: none finds another's in the cache.
        texts = user_messages(llm.tokenizer, s.serve_clients + 1 + s.serve_turns,
                              s.user_tokens)
        load_texts, chat_texts = texts[:s.serve_clients + 1], texts[s.serve_clients + 1:]
        clients = asyncio.run(_load(server.url, llm.model_name, load_texts, s.reply_tokens))
        turns = asyncio.run(_chat(server.url, llm.model_name, chat_texts, s.reply_tokens))
    finally:
        server.stop()
        worker.shutdown()
    alone, together, wall = clients
    ttfts = sorted(c[0] for c in together)
    p95 = ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))]
    alone_tok_s = alone[1] / alone[2]
    together_tok_s = sum(c[1] for c in together) / wall
    rows = [{"clients": 1, "total_tok_s": round(alone_tok_s, 1), "ttft_p95_ms": ms(alone[0])},
            {"clients": len(together), "total_tok_s": round(together_tok_s, 1),
             "ttft_p95_ms": ms(p95), "ttft_median_ms": ms(statistics.median(ttfts))}]
    rows += [{"turn": i + 1, "ttft_ms": ms(t), "prompt_tokens": p, "cached_tokens": c}
             for i, (t, p, c) in enumerate(turns)]
    targets = [
        Target(f"{len(together)} clients / 1 client total tokens/s",
               round(together_tok_s / alone_tok_s, 2), 3.0, ">="),
        Target(f"p95 TTFT with {len(together)} clients (s)", round(p95, 2), 2.0, "<="),
        Target(f"API chat turn-{len(turns)} TTFT / turn-1 TTFT",
               round(turns[-1][0] / turns[0][0], 3), 1.3, "<="),
    ]
    return bench_result("serve", ctx, rows, {"reply_tokens": s.reply_tokens}, targets,
                        ["through the openai client on loopback, streamed"])


async def _stream(client, model: str, messages: list[dict], tokens: int):
    """(TTFT, completion tokens, wall, prompt tokens, cached tokens, text) of one streamed
    reply."""
    start = time.perf_counter()
    first = None
    usage = None
    text = []
    stream = await client.chat.completions.create(
        model=model, messages=messages, max_tokens=tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    end = time.perf_counter()
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return ((first or end) - start, usage.completion_tokens, end - start,
            usage.prompt_tokens, cached, "".join(text))


async def _load(url: str, model: str, texts: list[str], tokens: int):
    import openai

    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="bench") as client:
        alone = await _stream(client, model, [{"role": "user", "content": texts[0]}], tokens)
        start = time.perf_counter()
        together = await asyncio.gather(*(
            _stream(client, model, [{"role": "user", "content": text}], tokens)
            for text in texts[1:]))
        return alone, together, time.perf_counter() - start


async def _chat(url: str, model: str, texts: list[str], tokens: int):
    import openai

    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="bench") as client:
        messages: list[dict] = []
        turns = []
        for text in texts:
            messages.append({"role": "user", "content": text})
            ttft, _, _, prompt, cached, reply = await _stream(client, model, messages, tokens)
            messages.append({"role": "assistant", "content": reply})
            turns.append((ttft, prompt, cached))
        return turns
