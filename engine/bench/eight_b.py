"""``folio bench 8b``: whether an 8B Q4_K_M model loads on this machine with Folio keeping
it quantized (``weights="stored"``), and how fast it then decodes next to llama.cpp.

The model is the synthetic Llama-3-8B-shaped file of ``synthetic.py`` (random weights, the
starter's tokenizer), written into the cache on the first run and reused after. Both sides
run in one fresh process (``sides.decode_8b``), so a load the kernel kills for memory ends
that process, not the bench, and is reported as "did not load". Per round each side decodes
``eightb_tokens`` greedy tokens after a fresh ``eightb_prompt_tokens``-token prompt, the
sides taking turns to go first; a rate is 1 / the median gap between tokens over the rounds.
"""

from __future__ import annotations

import time

from engine.bench.common import bench_result
from engine.bench.probe import run_probe
from engine.bench.setup import BenchContext, Target

LOADS_TARGET = "synthetic 8B Q4_K_M loads (1 = yes)"
DECODE_TARGET = "synthetic 8B decode tok/s, Folio / llama.cpp"


def bench_8b(ctx: BenchContext) -> dict:
    from engine.bench import synthetic
    from engine.loaders.catalog import starter_path

    s = ctx.settings
    shape = synthetic.LLAMA3_8B  # looked up now, so a test can shrink it
    start = time.perf_counter()
    path, written = synthetic.ensure_synthetic_gguf(starter_path(), shape)
    build_s = time.perf_counter() - start
    notes = [f"model: {path} ({'written now' if written else 'reused'}, "
             f"{path.stat().st_size / 2**30:.2f} GiB)"]
    llama_note = ctx.llama_cpp_note()
    if llama_note is not None:
        notes.append(llama_note)
    kwargs = {"model_path": str(path), "threads": ctx.threads,
              "prompt_tokens": s.eightb_prompt_tokens, "tokens": s.eightb_tokens,
              "rounds": s.eightb_rounds, "with_llama": llama_note is None}
    got = run_probe("engine.bench.sides:decode_8b", kwargs, s.eightb_timeout_s)
    if "error" in got:
        notes.append(f"8b probe: {got['error']}")
    rows = [_row("folio (stored)", got, "folio")]
    if llama_note is None:
        rows.append(_row("llama.cpp", got, "llama_cpp"))
    loaded = bool(got.get("folio_loaded"))
    targets = [Target(LOADS_TARGET, 1.0 if loaded else 0.0, 1.0, ">=")]
    if got.get("folio_tok_s") and got.get("llama_cpp_tok_s"):
        targets.append(Target(DECODE_TARGET,
                              round(got["folio_tok_s"] / got["llama_cpp_tok_s"], 3), 0.8, ">="))
    summary = {"shape": shape.label, "file_bytes": path.stat().st_size,
               "file_write_s": round(build_s, 1) if written else 0.0,
               "prompt_tokens": s.eightb_prompt_tokens, "decode_tokens": s.eightb_tokens,
               "rounds_done": got.get("rounds_done", 0)}
    result = bench_result("8b", ctx, rows, summary, targets, notes)
    result["setup"]["model"] = str(path)  # not --model: this workload has its own file
    return result


def _row(label: str, got: dict, key: str) -> dict:
    def num(name: str, digits: int):
        value = got.get(f"{key}_{name}")
        return round(value, digits) if isinstance(value, int | float) else ""

    row = {"side": label, "load_s": num("load_s", 1), "tok_s": num("tok_s", 2)}
    if key == "folio":
        weights = got.get("folio_weights_bytes")
        peak = got.get("folio_peak_rss_bytes")
        row["weights_gib"] = round(weights / 2**30, 2) if weights else ""
        row["peak_rss_after_load_gib"] = round(peak / 2**30, 2) if peak else ""
    return row
