"""``folio bench moe``: Folio next to llama.cpp on the synthetic OLMoE-1B-7B-shaped Q4_K_M
file (``synthetic_moe.py``: 64 experts of which 8 per token, written once into the cache).

Each side runs ``sizes.worker`` in a fresh process, as ``folio bench sizes`` does: load,
a 512-token prompt (``sizes_prompt_tokens``) then a follow-up turn, ``sizes_tokens`` greedy
tokens each; the figures are the worker's (load, TTFT, decode tok/s, peak RSS). The
machine is shared, so the sides run ``moe_runs`` times, taking turns to go first, and
each figure is the side's best run (the fastest load and TTFT, the highest decode rate,
the lowest peak RSS): what the code can do when the machine leaves it alone.
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
    from engine.bench.probe import run_probe
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
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for r in range(s.moe_runs):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            sizes._read_through(path)  # both sides start with the file in the page cache
            kwargs = {"side": side, "model_path": str(path), "threads": ctx.threads,
                      "prompt": prompt, "follow_up": follow_up, "warmup": warm,
                      "tokens": s.sizes_tokens, "n_ctx": n_ctx,
                      "activation_bits": s.cpu_activation_bits}
            got = run_probe("engine.bench.sizes:worker", kwargs, s.sizes_timeout_s)
            if "error" in got:
                notes.append(f"run {r + 1} {side}: {got['error']}")
            runs[side].append(got)
    best = {side: best_of(got) for side, got in runs.items()}
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
               "prompt_tokens": s.sizes_prompt_tokens, "decode_tokens": s.sizes_tokens}
    result = bench_result("moe", ctx, rows, summary, targets, notes)
    result["setup"]["model"] = f"synthetic {shape.label} Q4_K_M"
    result["group_rows_by"] = "size"
    return result


def best_of(runs: list[dict]) -> dict:
    """Each figure's best over a side's runs (the highest decode rate, the lowest of the
    rest); runs that failed are skipped, a figure no run measured is left out."""
    best: dict = {}
    for got in runs:
        for metric, value in got.items():
            if not isinstance(value, int | float) or isinstance(value, bool):
                best.setdefault(metric, value)
                continue
            if metric not in best or not isinstance(best[metric], int | float):
                best[metric] = value
            elif metric == "decode_tok_s":
                best[metric] = max(best[metric], value)
            elif metric.endswith(("_s", "_bytes")):
                best[metric] = min(best[metric], value)
    return best
