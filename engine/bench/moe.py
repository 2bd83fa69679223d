"""``folio bench moe``: Folio next to llama.cpp on the synthetic OLMoE-1B-7B-shaped Q4_K_M
file (``synthetic_moe.py``: 64 experts of which 8 per token, written once into the cache).

Each side runs ``sizes.worker`` in a fresh process, as ``folio bench sizes`` does: load,
a 512-token prompt (``sizes_prompt_tokens``) then a follow-up turn, ``sizes_tokens`` greedy
tokens each; the figures are the worker's (load, TTFT, decode tok/s, peak RSS). The
machine is shared, so the sides run ``moe_runs`` times, taking turns to go first, and
each figure is the side's best run (``sizes.best_of``: the fastest load and TTFT, the
highest decode rate, the lowest peak RSS): what the code can do when the machine leaves
it alone. The summary keeps every run's figures too (``each_run``).
"""

from __future__ import annotations

import time

# The bars (Folio / llama.cpp) and whether a higher figure is better.
BARS: dict[str, tuple[str, float]] = {
    "decode_tok_s": (">=", 1.0),
    "ttft_s": ("<=", 1.0),
    "peak_rss_bytes": ("<=", 1.1),
}
LABEL = "olmoe-1b-7b"


def moe_target(metric: str) -> str:
    what = {"decode_tok_s": "decode tok/s", "ttft_s": "TTFT of the prompt",
            "peak_rss_bytes": "peak RSS"}[metric]
    return f"synthetic OLMoE-1B-7B Q4_K_M {what}, Folio / llama.cpp"


def bench_moe(ctx) -> dict:
    from engine.bench import sizes, synthetic_moe
    from engine.bench.baselines import llama_cpp_status
    from engine.bench.common import bench_result
    from engine.bench.setup import Target
    from engine.bench.synthetic import ensure_synthetic_gguf
    from engine.loaders.catalog import model_info, starter_path

    s = ctx.settings
    shape = synthetic_moe.OLMOE_1B_7B  # looked up now, so a test can shrink it
    start = time.perf_counter()
    path, written = ensure_synthetic_gguf(starter_path(), shape)
    write_s = time.perf_counter() - start
    info = model_info(path)
    notes = [f"model: {path} ({'written now' if written else 'reused'}, "
             f"{path.stat().st_size / 2**30:.2f} GiB, {info.num_parameters / 1e9:.2f}B "
             f"parameters, {info.active_parameters / 1e9:.2f}B active)",
             f"each figure is the best of {s.moe_runs} runs per side (a shared machine)"]
    prompt, follow_up, warm = sizes.prompt_ids(sizes._vocab(path), s.sizes_prompt_tokens,
                                               s.sizes_followup_tokens, s.seed)
    sides = ["folio"]
    llama_note = llama_cpp_status(path)
    if llama_note is None:
        sides.append("llama_cpp")
    else:
        notes.append(llama_note)
    n_ctx = max(1024, s.sizes_prompt_tokens + 2 * s.sizes_tokens + s.sizes_followup_tokens)
    runs = sizes.run_sides(ctx, path, sides, s.moe_runs, (prompt, follow_up, warm), n_ctx,
                           notes, LABEL)
    best = {side: sizes.best_of(side_runs) for side, side_runs in runs.items()}
    rows = sizes.size_rows(LABEL, best)
    targets = []
    folio, llama = best.get("folio", {}), best.get("llama_cpp", {})
    for metric, (op, bar) in BARS.items():
        a, b = folio.get(metric), llama.get(metric)
        if sizes._num(a) and sizes._num(b):
            targets.append(Target(moe_target(metric), round(a / b, 3), bar, op))
    summary = {"shape": shape.label, "file_bytes": path.stat().st_size,
               "file_write_s": round(write_s, 1) if written else 0.0,
               "num_parameters": info.num_parameters,
               "active_parameters": info.active_parameters, "runs": s.moe_runs,
               "prompt_tokens": s.sizes_prompt_tokens, "decode_tokens": s.sizes_tokens,
               "each_run": sizes.each_run(runs)}
    result = bench_result("moe", ctx, rows, summary, targets, notes)
    result["setup"]["model"] = f"synthetic {shape.label} Q4_K_M"
    result["group_rows_by"] = "size"
    return result

