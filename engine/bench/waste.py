"""``folio bench waste``: internal KV waste (allocated slots holding no token) after each
step of Folio's chat.

Folio runs the chat workload's turns once; a step hook on its step loop reads
``LLM.kv_stats`` after every engine step and keeps the waste fraction whenever any slots
are allocated (between requests nothing is). The summary holds the whole series for the
chart, its mean (the target) and its peak.
"""

from __future__ import annotations

import statistics

from engine.bench.common import bench_result, run_chat
from engine.bench.setup import BenchContext, FolioChat, Target, user_messages


def bench_waste(ctx: BenchContext) -> dict:
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
    return bench_result("waste", ctx, rows, summary, targets, [])
