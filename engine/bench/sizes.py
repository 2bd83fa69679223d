"""``folio bench sizes``: Folio next to llama.cpp on synthetic Llama-3.2-1B-, Llama-3.2-3B-
and Llama-3-8B-shaped Q4_K_M files (``synthetic.SIZES``, ``--sizes 1b,3b,8b``), each
written once into the cache and reused.

Per size, each side (Folio with ``weights="stored"``, and llama.cpp when it imports) runs
in a fresh process (``probe.run_probe`` of ``worker``), so its load time and peak RSS are
its own; ``sizes_runs`` times (2), the sides taking turns to go first, each figure the
side's best run (``best_of``): the machine is shared, and one run in a few lost 20-30%
of a 512-token prefill to it. The summary keeps every run's figures too (``each_run``).
The worker loads the model, runs a short warm-up (8 tokens, 2 generated) so no timed
call pays for first-call setup, then two turns of plain token-id prompts (no chat
template), the same ids on both sides (random but fixed, drawn from the vocabulary with
``seed``):

- turn 1: a ``sizes_prompt_tokens``-token prompt (512), ``sizes_tokens`` greedy tokens (64);
- turn 2, the follow-up: turn 1's prompt + its reply + ``sizes_followup_tokens`` new ids
  (64), ``sizes_tokens`` greedy tokens. Both sides find the earlier turn in their own cache
  (Folio's prefix cache, its last partial block copied; llama.cpp's context by longest
  common prefix), so each computes the new ids and the reply's last token.

The worker emits one JSON line: ``import_s`` (torch, the engine and transformers' config
classes, or llama_cpp),
``load_s`` (the model's constructor, from the start of loading to ready), ``ttft_s`` and
``followup_ttft_s`` (from handing over the prompt to the first token), ``decode_tok_s``
(1 / the median gap between consecutive tokens after the first, over both turns) and
``peak_rss_bytes`` (the process's VmHWM, or ru_maxrss). Ratios are Folio / llama.cpp.

Nothing heavy is imported at the top of this module: a llama.cpp worker loads llama.cpp
alone (no torch, no Folio), so its load time and peak are llama.cpp's.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

from engine.bench.probe import emit, peak_rss_bytes

SIDES = ("folio", "llama_cpp")
WARMUP_TOKENS = 8
# The bars per measured figure (Folio / llama.cpp): (op, bar, sizes it applies to).
BARS: dict[str, tuple[str, float, tuple[str, ...]]] = {
    "decode_tok_s": (">=", 1.1, ("1b", "3b", "8b")),
    "ttft_s": ("<=", 0.9, ("1b", "3b")),
    "followup_ttft_s": ("<=", 0.9, ("1b", "3b")),
    "load_s": ("<=", 1.5, ("1b", "3b")),
    "peak_rss_bytes": ("<=", 1.1, ("1b", "3b")),
}
# How each figure reads in a table row and a target's name.
METRICS = {
    "load_s": "load s",
    "ttft_s": "TTFT of the prompt, ms",
    "followup_ttft_s": "follow-up TTFT, ms",
    "decode_tok_s": "decode tok/s",
    "peak_rss_bytes": "peak RSS MiB",
    "followup_computed_tokens": "follow-up tokens computed",
    "import_s": "import s",
}


def size_target(size: str, metric: str) -> str:
    """The name of ``size``'s target on ``metric`` (a key of ``BARS``) in the result."""
    what = {"decode_tok_s": "decode tok/s", "ttft_s": "TTFT of the prompt",
            "followup_ttft_s": "follow-up TTFT", "load_s": "load time",
            "peak_rss_bytes": "peak RSS"}[metric]
    return f"{size.upper()} {what}, Folio / llama.cpp"


# --------------------------------------------------------------------------- the workload
def bench_sizes(ctx) -> dict:
    from engine.bench import synthetic
    from engine.bench.baselines import llama_cpp_status
    from engine.bench.common import bench_result
    from engine.loaders.catalog import starter_path

    s = ctx.settings
    rows, targets, notes = [], [], []
    notes.append(f"each figure is the best of {s.sizes_runs} runs per side (a shared machine)")
    summary: dict = {"sizes": list(s.sizes), "prompt_tokens": s.sizes_prompt_tokens,
                     "decode_tokens": s.sizes_tokens, "runs": s.sizes_runs,
                     "followup_new_tokens": s.sizes_followup_tokens}
    n_ctx = max(1024, s.sizes_prompt_tokens + 2 * s.sizes_tokens + s.sizes_followup_tokens)
    for size in s.sizes:
        shape = synthetic.SIZES[size]  # looked up now, so a test can shrink it
        start = time.perf_counter()
        path, written = synthetic.ensure_synthetic_gguf(starter_path(), shape)
        write_s = time.perf_counter() - start
        notes.append(f"{size}: {path} ({'written now' if written else 'reused'}, "
                     f"{path.stat().st_size / 2**30:.2f} GiB)")
        prompt, follow_up, warm = prompt_ids(_vocab(path), s.sizes_prompt_tokens,
                                             s.sizes_followup_tokens, s.seed)
        sides = ["folio"]
        llama_note = llama_cpp_status(path)
        if llama_note is None:
            sides.append("llama_cpp")
        elif llama_note not in notes:
            notes.append(llama_note)
        runs = run_sides(ctx, path, sides, s.sizes_runs, (prompt, follow_up, warm), n_ctx,
                         notes, size)
        got = {side: best_of(side_runs) for side, side_runs in runs.items()}
        rows += size_rows(size, got)
        targets += size_targets(size, got)
        summary[size] = {"shape": shape.label, "file_bytes": path.stat().st_size,
                         "file_write_s": round(write_s, 1) if written else 0.0,
                         "each_run": each_run(runs)}
    result = bench_result("sizes", ctx, rows, summary, targets, notes)
    result["setup"]["model"] = f"synthetic Q4_K_M {','.join(s.sizes)}"
    result["group_rows_by"] = "size"  # one table per size on the terminal
    return result


def run_sides(ctx, path, sides: list[str], runs: int,
              ids: tuple[list[int], list[int], list[int]], n_ctx: int, notes: list[str],
              label: str) -> dict[str, list[dict]]:
    """Each side's runs on the file at `path`, in order: `worker` in a fresh process per
    run, `runs` runs per side taking turns to go first (the machine is shared: one run can
    lose a core for seconds, so callers take each figure's best_of).
    `ids`: prompt_ids' (prompt, follow-up, warm-up); a failed run's error goes to notes."""
    from engine.bench.probe import run_probe

    s = ctx.settings
    prompt, follow_up, warm = ids
    got: dict[str, list[dict]] = {side: [] for side in sides}
    for r in range(runs):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            _recache(path)  # both sides start with the file freshly in the page cache
            kwargs = {"side": side, "model_path": str(path), "threads": ctx.threads,
                      "prompt": prompt, "follow_up": follow_up, "warmup": warm,
                      "tokens": s.sizes_tokens, "n_ctx": n_ctx,
                      "activation_bits": s.cpu_activation_bits}
            run = run_probe("engine.bench.sizes:worker", kwargs, s.sizes_timeout_s)
            if "error" in run:
                notes.append(f"{label} {side}, run {r + 1}: {run['error']}")
            got[side].append(run)
    return got


def each_run(runs: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Each side's runs reduced to the figures a size's table shows (METRICS), for the
    summary: how far apart a side's runs were says how much the machine moved them."""
    def figures(got: dict) -> dict:
        return {m: round(v, 3) if isinstance(v, float) else v
                for m in METRICS if (v := got.get(m)) is not None}

    return {side: [figures(got) for got in side_runs] for side, side_runs in runs.items()}


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


def prompt_ids(vocab: int, prompt_tokens: int, followup_tokens: int,
               seed: int) -> tuple[list[int], list[int], list[int]]:
    """The turn-1 prompt, the follow-up's new ids and the warm-up prompt: random ids of
    ordinary tokens (above the first 256, where a tokenizer keeps its special and byte
    tokens), the same for every side and run. The warm-up starts with an id the prompt
    does not, so neither side finds the prompt's start in its cache."""
    import numpy as np

    rng = np.random.default_rng(seed)
    low = min(256, vocab // 2)
    prompt = rng.integers(low, vocab, prompt_tokens).tolist()
    follow_up = rng.integers(low, vocab, followup_tokens).tolist()
    warm = rng.integers(low, vocab, WARMUP_TOKENS).tolist()
    if warm[0] == prompt[0]:
        warm[0] = low + (prompt[0] + 1 - low) % (vocab - low)
    return prompt, follow_up, warm


def size_rows(size: str, got: dict[str, dict]) -> list[dict]:
    """One row per figure: Folio's, llama.cpp's (n/a without it) and Folio / llama.cpp."""
    folio, llama = got.get("folio", {}), got.get("llama_cpp")
    rows = []
    for metric, label in METRICS.items():
        a = folio.get(metric)
        b = llama.get(metric) if llama is not None else None
        ratio = round(a / b, 3) if _num(a) and _num(b) else ""
        rows.append({"size": size, "figure": label, "folio": _show(metric, a),
                     "llama_cpp": _show(metric, b) if llama is not None else "n/a",
                     "folio/llama_cpp": ratio})
    return rows


def size_targets(size: str, got: dict[str, dict]) -> list:
    """``size``'s targets that both sides measured (none without llama.cpp)."""
    from engine.bench.setup import Target

    folio, llama = got.get("folio", {}), got.get("llama_cpp", {})
    targets = []
    for metric, (op, bar, sizes) in BARS.items():
        a, b = folio.get(metric), llama.get(metric)
        if size in sizes and _num(a) and _num(b):
            targets.append(Target(size_target(size, metric), round(a / b, 3), bar, op))
    return targets


def _num(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _show(metric: str, value):
    if not _num(value):
        return "" if value is None else value
    if metric.endswith("_bytes"):
        return round(value / 2**20, 1)
    if metric in ("ttft_s", "followup_ttft_s"):
        return round(value * 1e3, 1)
    if metric.endswith("_s"):
        return round(value, 2)
    return round(value, 2) if isinstance(value, float) else value


def _vocab(path) -> int:
    from engine.loaders.gguf.header import parse_gguf_header

    tokens = parse_gguf_header(path).metadata["tokenizer.ggml.tokens"]
    return tokens if isinstance(tokens, int) else len(tokens)


def _recache(path, chunk: int = 1 << 24) -> None:
    """Drop the file from the page cache and read it back once, so neither side's load time
    is the disk's and every run starts from the same cache: read back whole, the file sits
    in 2 MiB folios where memory allows, which a map reads through 2 MiB pages. A file
    cached in small folios stays so until it leaves the cache (a 1B's decode step there
    15.3-15.6 ms against 14.3-14.8; docs/CPU_PERFORMANCE.md)."""
    from engine.bench.synthetic import drop_cached_pages

    drop_cached_pages(Path(path))
    with open(path, "rb", buffering=0) as f:
        while f.read(chunk):
            pass


# ----------------------------------------------------------------------------- the worker
def worker(side: str, model_path: str, threads: int, prompt: list[int],
           follow_up: list[int], warmup: list[int], tokens: int, n_ctx: int,
           activation_bits: int = 16) -> None:
    """Run in a fresh process (``run_probe("engine.bench.sizes:worker", ...)``): load
    ``side`` ("folio" or "llama_cpp") on ``threads`` threads with an ``n_ctx`` context,
    warm up, answer ``prompt`` and then the follow-up (``prompt`` + reply + ``follow_up``)
    with ``tokens`` greedy tokens each, and emit every figure as one JSON line."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    start = time.perf_counter()
    if side == "folio":
        load, make_reply = _folio_side
        load = functools.partial(load, activation_bits=activation_bits)
    else:
        load, make_reply = _llama_side
    model, import_s, load_s = load(model_path, threads, n_ctx, start)
    from engine.bench.baselines import median_rate

    warm_start = time.perf_counter()
    make_reply(model, warmup, 2)
    warmup_s = time.perf_counter() - warm_start
    first = make_reply(model, prompt, tokens)
    second_prompt = prompt + first.token_ids + follow_up
    second = make_reply(model, second_prompt, tokens)
    out = {"side": side, "threads": threads, "n_ctx": n_ctx, "import_s": import_s,
           "load_s": load_s, "warmup_s": warmup_s, "ttft_s": first.ttft_s,
           "followup_ttft_s": second.ttft_s,
           "decode_tok_s": median_rate(first.token_times, second.token_times),
           "prompt_tokens": len(prompt), "followup_prompt_tokens": len(second_prompt),
           "followup_computed_tokens": second.computed_prompt_tokens,
           "generated_tokens": [len(first.token_ids), len(second.token_ids)],
           "peak_rss_bytes": _peak_rss()}
    if side == "folio":
        out["weights_bytes"] = model.memory_stats().weights_bytes
    emit(out)


def _load_folio(model_path: str, threads: int, n_ctx: int, start: float,
                activation_bits: int = 16):
    import torch

    from engine.bench.setup import folio_config
    from engine.llm import LLM

    torch.set_num_threads(threads)
    # What the app has imported by the time a user picks a model: transformers' config and
    # tokenizer machinery (its first config class pulls in torch.distributed, ~1 s once
    # per process), timed with the imports, as llama.cpp's library import is.
    import transformers

    transformers.AutoConfig.for_model("llama")
    loading = time.perf_counter()
    # A KV pool of exactly one n_ctx context, as llama.cpp's.
    config = folio_config(threads, "stored", max_model_len=n_ctx, block_size=16,
                          num_gpu_blocks=-(-n_ctx // 16), cpu_activation_bits=activation_bits)
    llm = LLM(model_path, config)
    return llm, loading - start, time.perf_counter() - loading


def _folio_reply(llm, prompt: list[int], tokens: int):
    from engine.bench.baselines import Reply
    from engine.bench.setup import run_folio
    from engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    run = run_folio(llm, prompt, params)
    return Reply(list(run.output.outputs[0].token_ids), run.token_times[0] - run.start,
                 run.output.metrics.num_computed_prompt_tokens, len(prompt), run.token_times)


def _load_llama(model_path: str, threads: int, n_ctx: int, start: float):
    import llama_cpp  # noqa: F401  (timed apart from the load)

    from engine.bench.baselines import LlamaCppChat

    loading = time.perf_counter()
    llama = LlamaCppChat(model_path, threads, n_ctx)  # n_batch=512, verbose=False
    return llama, loading - start, time.perf_counter() - loading


def _llama_reply(llama, prompt: list[int], tokens: int):
    return llama.reply(prompt, tokens)


_folio_side = (_load_folio, _folio_reply)
_llama_side = (_load_llama, _llama_reply)


def _peak_rss() -> int | None:
    peak = peak_rss_bytes()
    if peak is None:
        import resource
        import sys

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = rss if sys.platform == "darwin" else rss * 1024  # bytes there, KiB here
    return peak
