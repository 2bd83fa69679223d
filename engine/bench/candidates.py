"""``folio bench candidates``: n sampled candidates (default n = 1, 2, 4, 8) of one prompt;
wall time, tokens/s and KV bytes.

Each run gets a fresh filler prompt (a new tag, so no run finds the previous one in the
prefix cache); Folio runs each n ``candidate_runs`` times and keeps the fastest (a shared
machine: one run can lose a core for a moment, and the n=4 / n=1 target is a ratio of two
single walls). Folio runs it as one request with ``SamplingParams(n=...)``, its candidates
sharing the prompt's blocks; its KV bytes are the peak of blocks in use (read through the
step hook after every engine step) times the block size in bytes. transformers uses
``num_return_sequences`` and holds n x (prompt + new) tokens; "separate copies" is n times
Folio's n=1 bytes.
"""

from __future__ import annotations

from engine.bench.baselines import hf_candidates, median_rate
from engine.bench.common import bench_result, ms, warm_up
from engine.bench.setup import BenchContext, Target, filler_prompt, run_folio
from engine.sampling_params import SamplingParams


def bench_candidates(ctx: BenchContext) -> dict:
    s = ctx.settings
    llm = ctx.new_llm()
    warm_up(llm, ctx)
    per_block = llm.kv_stats(with_blocks=False).bytes_per_block
    per_token = per_block // llm.engine.config.block_size
    rows, walls = [], {}
    for n in s.candidate_ns:
        params = SamplingParams(n=n, temperature=0.8, seed=s.seed, max_tokens=s.candidate_tokens,
                                ignore_eos=True)
        runs = []
        for r in range(s.candidate_runs):
            # A new tag per run: none finds an earlier run's prompt in the prefix cache.
            prompt = filler_prompt(llm.tokenizer, s.candidate_prompt_tokens,
                                   f"Candidates {n}.{r + 1}")
            runs.append(run_folio(llm, prompt, params, sample_kv=True))
        run = min(runs, key=lambda got: got.token_times[-1] - got.start)
        folio_wall = run.token_times[-1] - run.start
        walls[n] = folio_wall  # the target's ratio, unrounded (a tiny model's wall is ms)
        hf_wall = hf_candidates(ctx.hf_model, prompt, n, s.candidate_tokens, s.seed)
        tokens = n * s.candidate_tokens
        rows.append({
            "n": n,
            "folio_wall_s": round(folio_wall, 2),
            "folio_tok_s": round(tokens / folio_wall, 1),
            "folio_prefill_s": round(run.token_times[0] - run.start, 2),
            "folio_step_ms": ms(1 / median_rate(run.token_times)),
            "folio_kv_bytes": run.peak_used_blocks * per_block,
            "folio_cached_prompt_tokens": run.output.metrics.num_cached_tokens,
            "hf_wall_s": round(hf_wall, 2),
            "hf_tok_s": round(tokens / hf_wall, 1),
            "hf_kv_bytes": n * (len(prompt) + s.candidate_tokens) * per_token,
        })
    summary = {"prompt_tokens": s.candidate_prompt_tokens, "new_tokens": s.candidate_tokens,
               "kv_bytes_per_token": per_token}
    return bench_result("candidates", ctx, rows, summary, _targets(rows, walls), [])


def _targets(rows: list[dict], walls: dict[int, float]) -> list[Target]:
    """Adds ``separate_copies_kv_bytes`` to each row when n=1 ran; targets need n=1 and n=4."""
    by_n = {row["n"]: row for row in rows}
    if 1 not in by_n:
        return []
    one = by_n[1]
    for row in rows:
        row["separate_copies_kv_bytes"] = row["n"] * one["folio_kv_bytes"]
    if 4 not in by_n:
        return []
    four = by_n[4]
    return [
        Target("Folio n=4 wall / n=1 wall",
               round(walls[4] / walls[1], 3), 1.4, "<="),
        Target("Folio n=4 KV / four separate copies",
               round(four["folio_kv_bytes"] / four["separate_copies_kv_bytes"], 3),
               0.35, "<="),
    ]
