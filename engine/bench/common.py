"""What several ``folio bench`` workloads share: the result dict, the warm-up and a chat run.

Each workload takes a ``BenchContext`` and returns a plain dict: ``workload``, ``setup``,
``rows`` (the table), ``summary``, ``targets`` (each with ``met``) and ``notes``. Both sides
are warmed up once before anything is timed, run the same weights in float32 on the same
thread count, and see the same prompt token ids.
"""

from __future__ import annotations

from engine.bench.baselines import LlamaCppChat, Reply, hf_generate
from engine.bench.setup import BenchContext, Target, filler_prompt
from engine.sampling_params import SamplingParams


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 1)


def bench_result(name: str, ctx: BenchContext, rows: list[dict], summary: dict,
                 targets: list[Target], notes: list[str]) -> dict:
    return {"workload": name, "setup": ctx.describe(), "rows": rows, "summary": summary,
            "targets": [t.as_dict() for t in targets], "notes": notes}


def warm_up(llm, ctx: BenchContext, llama: LlamaCppChat | None = None) -> None:
    """One short generation per side, so no timed call pays for first-call setup."""
    ids = filler_prompt(llm.tokenizer, 8, "Warm-up")
    llm.generate([ids], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    hf_generate(ctx.hf_model, ids, 4)
    if llama is not None:
        llama.reply(ids, 4)


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
