"""``folio bench decode``: single-stream decode tokens/s at several contexts (default 128
and 2,048 tokens), next to transformers' ``generate`` and, when it can run the model,
llama.cpp.

Per context, ``decode_rounds`` rounds each decode ``decode_tokens`` greedy tokens (end of
sequence ignored) after a fresh filler prompt (no prefix-cache hit); the sides take turns to
go first, so a slow spell of the shared machine falls on all of them. A side's rate is
1 / the median gap between consecutive tokens, pooled over its rounds; its TTFT is the
median over rounds. Contexts the model cannot hold are skipped with a note.
"""

from __future__ import annotations

import statistics

from engine.bench.baselines import LlamaCppChat, Reply, hf_generate, median_rate
from engine.bench.common import bench_result, ms, warm_up
from engine.bench.setup import BenchContext, Target, filler_prompt, run_folio
from engine.sampling_params import SamplingParams


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
    warm_up(llm, ctx, llama)
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
        row = _decode_context(llm.tokenizer, sides, context, s.decode_rounds)
        rows.append(row)
        targets.append(Target(f"Folio / transformers tok/s at context {context}",
                              round(row["folio_tok_s"] / max(row["hf_tok_s"], 1e-9), 2),
                              1.5, ">="))
        if context == 128:
            targets.append(Target("Folio tok/s at context 128", row["folio_tok_s"], 20.0,
                                  ">="))
        targets += _llama_targets(row)
    summary = {"decode_tokens": s.decode_tokens, "rounds": s.decode_rounds,
               "rate": "1 / median gap between consecutive tokens, over all rounds"}
    return bench_result("decode", ctx, rows, summary, targets, notes)


def llama_decode_target(context: int) -> str:
    return f"Folio / llama.cpp decode tok/s at context {context}"


def llama_ttft_target(context: int) -> str:
    return f"Folio / llama.cpp TTFT of a {context}-token prompt"


# The bars against llama.cpp, per context: decode rate (Folio / llama.cpp at least
# this) and, for the long prompt, TTFT (Folio / llama.cpp at most this).
LLAMA_DECODE_LIMITS = {128: 1.0, 2048: 1.0}
LLAMA_TTFT_LIMITS = {2048: 0.5}


def _llama_targets(row: dict) -> list[Target]:
    context = row["context"]
    if "llama_cpp_tok_s" not in row or context not in LLAMA_DECODE_LIMITS:
        return []
    targets = [Target(llama_decode_target(context),
                      round(row["folio_tok_s"] / max(row["llama_cpp_tok_s"], 1e-9), 3),
                      LLAMA_DECODE_LIMITS[context], ">=")]
    if context in LLAMA_TTFT_LIMITS:
        targets.append(Target(llama_ttft_target(context),
                              round(row["folio_ttft_ms"] / max(row["llama_cpp_ttft_ms"], 1e-9),
                                    3), LLAMA_TTFT_LIMITS[context], "<="))
    return targets


def _decode_context(tokenizer, sides: dict, context: int, rounds: int) -> dict:
    """One table row: every side's pooled rate and median TTFT at ``context`` tokens."""
    replies: dict[str, list[Reply]] = {name: [] for name in sides}
    for r in range(rounds):
        # A fresh prompt each round (no prefix-cache hit), and the sides take turns to
        # go first, so a slow spell of the shared machine falls on all of them.
        prompt = filler_prompt(tokenizer, context, f"Decode {context} round {r}")
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            replies[name].append(sides[name](prompt))
    row: dict = {"context": context}
    for name, side_replies in replies.items():
        row[f"{name}_tok_s"] = round(median_rate(*(x.token_times for x in side_replies)), 1)
        row[f"{name}_ttft_ms"] = ms(statistics.median(x.ttft_s for x in side_replies))
    return row


def _folio_reply(llm, prompt: list[int], params: SamplingParams) -> Reply:
    run = run_folio(llm, prompt, params)
    return Reply(list(run.output.outputs[0].token_ids), run.token_times[0] - run.start,
                 run.output.metrics.num_computed_prompt_tokens, len(prompt), run.token_times)
