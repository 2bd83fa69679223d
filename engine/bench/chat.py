"""``folio bench chat``: time to first token and prompt tokens computed per turn of a
multi-turn chat (``--turns``, default 8).

Fixed user messages, greedy replies of ``reply_tokens`` tokens (end of sequence ignored).
Folio answers through ``LLM.chat`` and finds the earlier turns in its prefix cache;
transformers answers twice, once with ``generate`` over the whole history each turn (what a
naive app does) and once continuing one ``DynamicCache`` (only the new tokens are fed);
llama.cpp joins when it can run the model. Every side is fed the prompt ids Folio's
tokenizer makes of the messages, and the summary says whether its greedy replies match
Folio's. Folio's chat is repeated on fresh engines and each turn's TTFT is the median.

Turns 2 on should compute only what is new: the ratio of the prompt tokens Folio computed
to the tokens new since the last turn's prompt and reply is a target. For a hybrid model
(Qwen3.5) the summary adds the state snapshot's bytes per cached block against the
full-attention KV bytes of that block, the snapshot interval, and what a snapshot's copy
costs against recomputing the block it stands for.
"""

from __future__ import annotations

import statistics
import time

from engine.bench.baselines import HFCached, HFRecompute, LlamaCppChat, Reply
from engine.bench.common import bench_result, ms, run_chat, warm_up
from engine.bench.setup import BenchContext, FolioChat, Target, user_messages


class _ByIds:
    """A baseline side fed the prompt ids that Folio's tokenizer makes of the messages."""

    def __init__(self, side, tokenizer, reply_tokens: int) -> None:
        self.side, self.tokenizer, self.reply_tokens = side, tokenizer, reply_tokens
        self.label = side.label

    def reply(self, messages: list[dict]) -> Reply:
        return self.side.reply(self.tokenizer.encode_chat(messages), self.reply_tokens)


def bench_chat(ctx: BenchContext) -> dict:
    s = ctx.settings
    llm = ctx.new_llm()
    tok = llm.tokenizer
    texts = user_messages(tok, s.turns, s.user_tokens)
    folio = FolioChat(llm, s.reply_tokens, track_kv=True)
    sides = {"folio": folio,
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
    warm_up(llm, ctx, llama)
    results = {key: run_chat(side, tok, texts) for key, side in sides.items()}
    # Folio's turns are short, so one stall of the shared machine moves a single run's
    # ratio: repeat Folio's chat on fresh engines and take per-turn medians.
    folio_runs = [results["folio"]] + [
        run_chat(FolioChat(ctx.new_llm(), s.reply_tokens), tok, texts)
        for _ in range(s.chat_repeats - 1)]
    folio_ttft = [statistics.median(run[turn].ttft_s for run in folio_runs)
                  for turn in range(s.turns)]
    rows = _rows(results, folio_ttft, s.turns)
    summary = _summary(results, len(folio_runs))
    # Per KV group for a model mixing sliding and global layers (Gemma 2 and 3).
    summary["folio_kv_peak_bytes"] = folio.kv_peak_bytes
    first, last = folio_ttft[0], folio_ttft[-1]
    recompute_last = results["hf_recompute"][-1].ttft_s
    targets = [
        Target(f"Folio turn-{s.turns} TTFT / turn-1 TTFT", round(last / first, 3), 1.3, "<="),
        Target(recompute_target(s.turns), round(recompute_last / last, 2), 10.0, ">="),
    ]
    computed_ratio = new_token_ratio(results["folio"])
    if computed_ratio is not None:
        targets.append(Target(f"Folio computed prompt tokens / new tokens, turns 2-{s.turns}",
                              round(computed_ratio, 3), 1.3, "<="))
    summary |= state_figures(llm, folio_ttft[0], results["folio"][0].prompt_tokens)
    return bench_result("chat", ctx, rows, summary, targets, notes)


def new_token_ratio(replies: list[Reply]) -> float | None:
    """Prompt tokens computed at turns 2.. over the tokens new at each (the prompt past
    the last turn's prompt and reply); None for a one-turn chat."""
    computed = new = 0
    for before, turn in zip(replies, replies[1:], strict=False):
        computed += turn.computed_prompt_tokens
        new += turn.prompt_tokens - before.prompt_tokens - len(before.token_ids)
    return computed / new if new > 0 else None


def state_figures(llm, turn1_ttft_s: float, turn1_prompt: int) -> dict:
    """A hybrid model's snapshot figures (empty for a model without linear layers): the
    bytes a cached block's snapshot adds over the block's KV bytes, the interval, and one
    snapshot copy against the time turn 1 spent per block of its prompt."""
    engine = llm.engine
    states = engine.runner.states
    if states is None:
        return {}
    manager = engine.kv_cache.managers[-1]
    kv_block = engine.kv_cache.pools[0].bytes_per_block
    copies = 20
    start = time.perf_counter()
    for _ in range(copies):
        states.move([], [], [(0, 1)])
    copy_s = (time.perf_counter() - start) / copies
    blocks = max(1, turn1_prompt // engine.config.block_size)
    return {"state_slot_bytes": states.slot_bytes, "snapshot_every_blocks":
            manager.snapshot_every,
            "snapshot_bytes_per_block / kv_bytes_per_block": round(
                states.slot_bytes / manager.snapshot_every / kv_block, 3),
            "snapshot_copy_ms": round(copy_s * 1e3, 3),
            "turn1_prefill_ms_per_block": round(turn1_ttft_s / blocks * 1e3, 3)}


def recompute_target(turns: int) -> str:
    return f"transformers-recompute / Folio TTFT at turn {turns}"


def _rows(results: dict[str, list[Reply]], folio_ttft: list[float], turns: int) -> list[dict]:
    rows = []
    for turn in range(turns):
        row = {"turn": turn + 1, "prompt_tokens": results["folio"][turn].prompt_tokens}
        for key, replies in results.items():
            ttft = folio_ttft[turn] if key == "folio" else replies[turn].ttft_s
            row[f"{key}_ttft_ms"] = ms(ttft)
            row[f"{key}_computed"] = replies[turn].computed_prompt_tokens
        rows.append(row)
    return rows


def _summary(results: dict[str, list[Reply]], folio_runs: int) -> dict:
    summary = {f"{key}_decode_tok_s": round(statistics.median(r.mean_tok_s for r in replies), 1)
               for key, replies in results.items()}
    summary["same_replies_as_folio"] = {
        key: [r.token_ids for r in replies] == [r.token_ids for r in results["folio"]]
        for key, replies in results.items() if key != "folio"}
    summary["folio_chat_runs"] = folio_runs
    return summary
