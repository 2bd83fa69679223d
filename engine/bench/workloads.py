"""The ``folio bench`` workloads that put Folio next to transformers (and llama.cpp).

Each takes a ``BenchContext`` and returns a plain dict: ``workload``, ``setup``, ``rows`` (the
table), ``summary``, ``targets`` (each with ``met``) and ``notes``. Both sides are warmed up
once before anything is timed, run the same weights in float32 on the same thread count, and
see the same prompt token ids.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

from engine.bench.baselines import (
    HFCached,
    HFRecompute,
    LlamaCppChat,
    Reply,
    hf_candidates,
    hf_generate,
    median_rate,
)
from engine.bench.setup import (
    BenchContext,
    FolioChat,
    Target,
    filler_prompt,
    run_folio,
    user_messages,
)
from engine.outputs import FinishedEvent, TokenEvent
from engine.sampling_params import SamplingParams


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 1)


def _result(name: str, ctx: BenchContext, rows: list[dict], summary: dict,
            targets: list[Target], notes: list[str]) -> dict:
    return {"workload": name, "setup": ctx.describe(), "rows": rows, "summary": summary,
            "targets": [t.as_dict() for t in targets], "notes": notes}


def _warm_up(llm, ctx: BenchContext, llama: LlamaCppChat | None = None) -> None:
    """One short generation per side, so no timed call pays for first-call setup."""
    ids = filler_prompt(llm.tokenizer, 8, "Warm-up")
    llm.generate([ids], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    hf_generate(ctx.hf_model, ids, 4)
    if llama is not None:
        llama.reply(ids, 4)


# -------------------------------------------------------------------------------- chat
class _ByIds:
    """A baseline side fed the prompt ids that Folio's tokenizer makes of the messages."""

    def __init__(self, side, tokenizer, reply_tokens: int) -> None:
        self.side, self.tokenizer, self.reply_tokens = side, tokenizer, reply_tokens
        self.label = side.label

    def reply(self, messages: list[dict]) -> Reply:
        return self.side.reply(self.tokenizer.encode_chat(messages), self.reply_tokens)


def run_chat(side, tokenizer, texts: list[str]) -> list[Reply]:
    """One chat of len(texts) turns; each side keeps its own replies in its history."""
    messages: list[dict] = []
    replies = []
    for text in texts:
        messages.append({"role": "user", "content": text})
        reply = side.reply(messages)
        messages.append({"role": "assistant", "content": tokenizer.decode(reply.token_ids),
                         "token_ids": reply.token_ids})
        replies.append(reply)
    return replies


def bench_chat(ctx: BenchContext) -> dict:
    s = ctx.settings
    llm = ctx.new_llm()
    tok = llm.tokenizer
    texts = user_messages(tok, s.turns, s.user_tokens)
    sides = {"folio": FolioChat(llm, s.reply_tokens),
             "hf_recompute": _ByIds(HFRecompute(ctx.hf_model), tok, s.reply_tokens),
             "hf_cache": _ByIds(HFCached(ctx.hf_model), tok, s.reply_tokens)}
    notes = []
    llama = None
    note = ctx.llama_cpp_note()
    if note is None:
        context = 2 * s.turns * (s.user_tokens + s.reply_tokens + 64) + 256
        llama = LlamaCppChat(ctx.model_path, ctx.threads, context)
        sides["llama_cpp"] = _ByIds(llama, tok, s.reply_tokens)
    else:
        notes.append(note)
    _warm_up(llm, ctx, llama)
    results = {key: run_chat(side, tok, texts) for key, side in sides.items()}
    # Folio's turns take a few hundred ms, so one stall of the shared machine moves a
    # single run's ratio: repeat Folio's chat on fresh engines and take per-turn medians.
    folio_runs = [results["folio"]] + [
        run_chat(FolioChat(ctx.new_llm(), s.reply_tokens), tok, texts)
        for _ in range(s.chat_repeats - 1)]
    folio_ttft = [statistics.median(run[turn].ttft_s for run in folio_runs)
                  for turn in range(s.turns)]
    rows = []
    for turn in range(s.turns):
        row = {"turn": turn + 1, "prompt_tokens": results["folio"][turn].prompt_tokens}
        for key, replies in results.items():
            ttft = folio_ttft[turn] if key == "folio" else replies[turn].ttft_s
            row[f"{key}_ttft_ms"] = _ms(ttft)
            row[f"{key}_computed"] = replies[turn].computed_prompt_tokens
        rows.append(row)
    summary = {f"{key}_decode_tok_s": round(statistics.median(r.mean_tok_s for r in replies), 1)
               for key, replies in results.items()}
    summary["same_replies_as_folio"] = {
        key: [r.token_ids for r in replies] == [r.token_ids for r in results["folio"]]
        for key, replies in results.items() if key != "folio"}
    summary["folio_chat_runs"] = len(folio_runs)
    first, last = folio_ttft[0], folio_ttft[-1]
    recompute_last = results["hf_recompute"][-1].ttft_s
    targets = [
        Target(f"Folio turn-{s.turns} TTFT / turn-1 TTFT", round(last / first, 3), 1.3, "<="),
        Target(f"transformers-recompute / Folio TTFT at turn {s.turns}",
               round(recompute_last / last, 2), 5.0, ">="),
    ]
    return _result("chat", ctx, rows, summary, targets, notes)


def bench_waste(ctx: BenchContext) -> dict:
    """Internal KV waste (allocated slots holding no token) after each step of Folio's chat."""
    s = ctx.settings
    llm = ctx.new_llm()
    side = FolioChat(llm, s.reply_tokens, sample_waste=True)
    replies = run_chat(side, llm.tokenizer, user_messages(llm.tokenizer, s.turns, s.user_tokens))
    waste = side.waste
    mean, peak = statistics.fmean(waste), max(waste)
    rows = [{"turn": i + 1, "prompt_tokens": r.prompt_tokens,
             "computed": r.computed_prompt_tokens} for i, r in enumerate(replies)]
    summary = {"samples": len(waste), "mean_waste_pct": round(100 * mean, 2),
               "max_waste_pct": round(100 * peak, 2),
               "block_size": llm.engine.config.block_size, "waste_series": waste}
    targets = [Target("mean KV waste (%)", round(100 * mean, 2), 4.0, "<=")]
    return _result("waste", ctx, rows, summary, targets, [])


# -------------------------------------------------------------------------- candidates
def bench_candidates(ctx: BenchContext) -> dict:
    s = ctx.settings
    llm = ctx.new_llm()
    _warm_up(llm, ctx)
    per_block = llm.kv_stats(with_blocks=False).bytes_per_block
    per_token = per_block // llm.engine.config.block_size
    rows = []
    for n in s.candidate_ns:
        # A new tag per n: no run finds the previous run's prompt in the prefix cache.
        prompt = filler_prompt(llm.tokenizer, s.candidate_prompt_tokens, f"Candidates {n}")
        params = SamplingParams(n=n, temperature=0.8, seed=s.seed, max_tokens=s.candidate_tokens,
                                ignore_eos=True)
        run = run_folio(llm, prompt, params, sample_kv=True)
        folio_wall = run.token_times[-1] - run.start
        hf_wall = hf_candidates(ctx.hf_model, prompt, n, s.candidate_tokens, s.seed)
        tokens = n * s.candidate_tokens
        rows.append({
            "n": n,
            "folio_wall_s": round(folio_wall, 2),
            "folio_tok_s": round(tokens / folio_wall, 1),
            "folio_prefill_s": round(run.token_times[0] - run.start, 2),
            "folio_step_ms": _ms(1 / median_rate(run.token_times)),
            "folio_kv_bytes": run.peak_used_blocks * per_block,
            "folio_cached_prompt_tokens": run.output.metrics.num_cached_tokens,
            "hf_wall_s": round(hf_wall, 2),
            "hf_tok_s": round(tokens / hf_wall, 1),
            "hf_kv_bytes": n * (len(prompt) + s.candidate_tokens) * per_token,
        })
    by_n = {row["n"]: row for row in rows}
    targets = []
    if 1 in by_n:
        one = by_n[1]
        for row in rows:
            row["separate_copies_kv_bytes"] = row["n"] * one["folio_kv_bytes"]
        if 4 in by_n:
            four = by_n[4]
            targets = [
                Target("Folio n=4 wall / n=1 wall",
                       round(four["folio_wall_s"] / one["folio_wall_s"], 3), 1.6, "<="),
                Target("Folio n=4 KV / four separate copies",
                       round(four["folio_kv_bytes"] / four["separate_copies_kv_bytes"], 3),
                       0.35, "<="),
            ]
    summary = {"prompt_tokens": s.candidate_prompt_tokens, "new_tokens": s.candidate_tokens,
               "kv_bytes_per_token": per_token}
    return _result("candidates", ctx, rows, summary, targets, [])


# ------------------------------------------------------------------------------ decode
def bench_decode(ctx: BenchContext) -> dict:
    s = ctx.settings
    llm = ctx.new_llm()
    llama = None
    notes = []
    note = ctx.llama_cpp_note()
    if note is None:
        llama = LlamaCppChat(ctx.model_path, ctx.threads, max(s.decode_contexts) +
                             s.decode_tokens + 16)
    else:
        notes.append(note)
    _warm_up(llm, ctx, llama)
    params = SamplingParams(max_tokens=s.decode_tokens, temperature=0, ignore_eos=True)
    sides = {"folio": lambda ids: _folio_reply(llm, ids, params),
             "hf": lambda ids: hf_generate(ctx.hf_model, ids, s.decode_tokens)}
    if llama is not None:
        sides["llama_cpp"] = lambda ids: llama.reply(ids, s.decode_tokens)
    rows, targets = [], []
    for context in s.decode_contexts:
        if context + s.decode_tokens > llm.max_model_len:
            notes.append(f"context {context} skipped: the model holds {llm.max_model_len} "
                         "tokens")
            continue
        replies: dict[str, list[Reply]] = {name: [] for name in sides}
        for r in range(s.decode_rounds):
            # A fresh prompt each round (no prefix-cache hit), and the sides take turns to
            # go first, so a slow spell of the shared machine falls on all of them.
            prompt = filler_prompt(llm.tokenizer, context, f"Decode {context} round {r}")
            for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                replies[name].append(sides[name](prompt))
        row: dict = {"context": context}
        for name, side_replies in replies.items():
            row[f"{name}_tok_s"] = round(median_rate(*(x.token_times for x in side_replies)), 1)
            row[f"{name}_ttft_ms"] = _ms(statistics.median(x.ttft_s for x in side_replies))
        rows.append(row)
        targets.append(Target(f"Folio / transformers tok/s at context {context}",
                              round(row["folio_tok_s"] / max(row["hf_tok_s"], 1e-9), 2),
                              1.5, ">="))
        if context == 128:
            targets.append(Target("Folio tok/s at context 128", row["folio_tok_s"], 20.0,
                                  ">="))
    summary = {"decode_tokens": s.decode_tokens, "rounds": s.decode_rounds,
               "rate": "1 / median gap between consecutive tokens, over all rounds"}
    return _result("decode", ctx, rows, summary, targets, notes)


def _folio_reply(llm, prompt: list[int], params: SamplingParams) -> Reply:
    run = run_folio(llm, prompt, params)
    return Reply(list(run.output.outputs[0].token_ids), run.token_times[0] - run.start,
                 run.output.metrics.num_computed_prompt_tokens, len(prompt), run.token_times)


# -------------------------------------------------------------------------- concurrent
@dataclass(slots=True)
class _Chat:
    submitted: float = 0.0
    first: float | None = None
    finished: float | None = None
    tokens: int = 0


def bench_concurrent(ctx: BenchContext) -> dict:
    """Several one-message chats submitted at once to the EngineWorker (continuous
    batching), against transformers answering them one after another."""
    from engine.worker import EngineWorker

    s = ctx.settings
    llm = ctx.new_llm()
    _warm_up(llm, ctx)
    texts = user_messages(llm.tokenizer, s.concurrent_chats, s.user_tokens)
    params = SamplingParams(max_tokens=s.reply_tokens, temperature=0, ignore_eos=True)
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
    folio_wall = max(c.finished for c in chats) - start
    hf_start = time.perf_counter()
    hf_ttft = []
    for text in texts:
        ids = llm.tokenizer.encode_chat([{"role": "user", "content": text}])
        began = time.perf_counter()
        reply = hf_generate(ctx.hf_model, ids, s.reply_tokens)
        hf_ttft.append(began - hf_start + reply.ttft_s)
    hf_wall = time.perf_counter() - hf_start
    rows = [{"chat": i + 1, "folio_ttft_ms": _ms(c.first - c.submitted),
             "hf_sequential_ttft_ms": _ms(hf_ttft[i])} for i, c in enumerate(chats)]
    total = sum(c.tokens for c in chats)
    summary = {"chats": len(chats), "tokens": total,
               "folio_total_tok_s": round(total / folio_wall, 1),
               "hf_sequential_total_tok_s": round(len(chats) * s.reply_tokens / hf_wall, 1),
               "folio_median_ttft_ms": _ms(statistics.median(c.first - c.submitted
                                                             for c in chats))}
    notes = ["transformers answers the chats one after another, as a single-threaded app "
             "would; its TTFT counts from when all chats were submitted"]
    return _result("concurrent", ctx, rows, summary, [], notes)
