"""``folio bench kv``: what the 8- and 4-bit KV caches (``kv_cache_dtype`` "int8", "int4")
cost and save against the float16 cache, and Folio beside llama.cpp with its ``q8_0`` /
``q4_0`` caches (flash attention on), in one run; every figure's baseline measured in the
same run, the CPU named.

- **Bytes per token** on the model (the starter) and the synthetic 1B shape: the formats'
  row bytes (kernels.kv_format) over every KV layer and head; for the model also as the
  loaded engine counts them (its KV stats), where the format loads.
- **Quality** on the model (kv_quality): teacher-forced mean KL against the float16 cache
  over a ``text_tokens``-token text, and greedy ``reply_tokens``-token replies after
  ~``context_words`` words of context equal to float16's, of ``prompts``.
- **Speed** on the synthetic 1B shape (``speed_size``; written once into the cache with a
  context long enough): each side in a fresh process (kv_sides.speed), its formats taking
  turns in it: decode tok/s at each of ``contexts`` and the prefill of ``contexts[0]``
  tokens (its TTFT), Folio float16, int8 and int4, and llama.cpp q8_0 and q4_0 at
  ``contexts[0]``.
- **Memory** on the synthetic 3B shape (``rss_size``): peak RSS of a fresh process holding
  one ``rss_context``-token context after a ``rss_fill``-token prompt, Folio int8 and
  llama.cpp q8_0. Folio's pool takes memory only as blocks are written; llama.cpp clears
  its whole cache when it makes it.

``KVPlan`` holds the sizes (the issue's by default; ``QUICK`` for a test). A part whose size
is not among ``--sizes``, a format the engine refuses, or llama.cpp missing (its
interpreter: FOLIO_BENCH_LLAMA_PYTHON, else this one) leaves its rows n/a with the reason.
The table (kv_table) has every target with met / not met / n/a.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field, replace

from engine.bench.kv_table import KVFigures, kv_table

LLAMA_OF = {"float16": "f16", "int8": "q8_0", "int4": "q4_0"}
_LLAMA_PYTHON = "FOLIO_BENCH_LLAMA_PYTHON"


@dataclass(frozen=True, slots=True)
class KVPlan:
    text_tokens: int = 2048
    context_words: int = 1100
    prompts: int = 5
    reply_tokens: int = 48
    contexts: tuple[int, int] = (4000, 16000)
    decode_tokens: int = 32
    rss_context: int = 32768
    rss_fill: int = 2048
    speed_size: str = "1b"
    rss_size: str = "3b"
    timeout_s: float = 3600.0  # each fresh process's limit

    def __post_init__(self) -> None:
        for name in ("text_tokens", "context_words", "prompts", "reply_tokens",
                     "decode_tokens", "rss_context", "rss_fill"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 2:
                raise ValueError(f"KVPlan.{name} must be an integer >= 2, got {value!r}")
        if len(self.contexts) != 2 or not 0 < self.contexts[0] < self.contexts[1]:
            raise ValueError(f"KVPlan.contexts must be two growing lengths, got "
                             f"{self.contexts!r}")
        if self.rss_fill >= self.rss_context:
            raise ValueError(f"KVPlan.rss_fill must be below rss_context ({self.rss_context}),"
                             f" got {self.rss_fill}")


QUICK = KVPlan(text_tokens=24, context_words=30, prompts=2, reply_tokens=4, contexts=(40, 80),
               decode_tokens=4, rss_context=128, rss_fill=32, timeout_s=600.0)


@dataclass(slots=True)
class _Run:
    plan: KVPlan
    threads: int
    figures: KVFigures = field(default_factory=KVFigures)
    notes: list[str] = field(default_factory=list)


def bench_kv(ctx, plan: KVPlan | None = None) -> dict:
    from engine.bench.common import bench_result

    run = _Run(plan or KVPlan(), ctx.threads)
    fig, sizes = run.figures, ctx.settings.sizes
    fig.model_name, fig.model_bytes = _model_bytes(ctx.model_path)
    fig.speed_shape = shape_bytes_of(run.plan.speed_size)
    _quality(run, str(ctx.model_path), ctx.settings.weights)
    python, why = llama_python()
    if why:
        run.notes.append(why)
    for part, size in (("speed", run.plan.speed_size), ("rss", run.plan.rss_size)):
        if size not in sizes:
            fig.why[part] = f"{size} not run (--sizes)"
    if "speed" not in fig.why:
        _speed(run, python)
    if "rss" not in fig.why:
        _rss(run, python)
    rows, targets = kv_table(fig, run.plan)
    summary = {"cpu": cpu_name(), "threads": ctx.threads, "plan": _plan_text(run.plan)}
    result = bench_result("kv", ctx, rows, summary, targets, run.notes)
    result["setup"]["cpu"] = summary["cpu"]
    result["figures"] = fig.as_dict()
    return result


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo; the platform's words elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def llama_python() -> tuple[str | None, str | None]:
    """(the interpreter that runs llama.cpp, None) or (None, why llama.cpp is skipped)."""
    python = os.environ.get(_LLAMA_PYTHON) or sys.executable
    try:
        done = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"llama.cpp skipped: {python} does not run ({exc})"
    if done.returncode:
        return None, (f"llama.cpp skipped: {python} cannot import llama_cpp (set "
                      f"{_LLAMA_PYTHON} to an interpreter that can)")
    return python, None


def shape_bytes(layers: int, kv_heads: int, head_dim: int) -> dict[str, int]:
    """KV bytes per token of each format for a model shape (kernels.kv_format's rows)."""
    from engine.models.spec import kv_bytes_per_token

    return {name: kv_bytes_per_token(layers, kv_heads, head_dim, name)
            for name in ("float16", "int8", "int4")}


def _model_bytes(path) -> tuple[str, dict[str, int]]:
    from engine.loaders.catalog import model_info, starter_path

    info = model_info(path)
    name = "starter" if path == starter_path() else info.name
    return name, shape_bytes(info.kv_layers, info.num_kv_heads, info.head_dim)


def _quality(run: _Run, model_path: str, weights: str) -> None:
    from engine.bench.kv_quality import quality

    p, fig = run.plan, run.figures
    _, ref, got = quality(model_path, run.threads, weights, ("int8", "int4"),
                          p.text_tokens, p.context_words, p.prompts, p.reply_tokens)
    fig.loaded_bytes[ref.name] = ref.bytes_per_token
    for name, q in got.items():
        if q.error:
            fig.why[f"folio {name}"] = f"{name} did not load (see the notes)"
            run.notes.append(q.error)
            continue
        fig.loaded_bytes[name] = q.bytes_per_token
        if q.mean_kl is not None:
            fig.kl[name] = q.mean_kl
        if q.greedy_equal is not None:
            fig.greedy[name] = q.greedy_equal
            fig.partings[name] = q.partings


def _synthetic(size: str, context: int):
    """The synthetic ``size`` file, with a context of at least ``context`` tokens (rounded
    up to a power of two; written under ``bench/context-N`` of the cache, apart from the
    default file, whose label does not name its context)."""
    from engine.bench import synthetic
    from engine.loaders.catalog import starter_path
    from engine.loaders.gguf.loader import cache_root

    shape = synthetic.SIZES[size]
    root = None
    if shape.context < context:
        shape = replace(shape, context=1 << (context - 1).bit_length())
        root = cache_root() / "bench" / f"context-{shape.context}"
    path, _ = synthetic.ensure_synthetic_gguf(starter_path(), shape, root=root)
    return path


def _vocab(path) -> int:
    from engine.loaders.gguf.header import parse_gguf_header

    tokens = parse_gguf_header(path).metadata["tokenizer.ggml.tokens"]
    return tokens if isinstance(tokens, int) else len(tokens)


def _speed(run: _Run, python: str | None) -> None:
    from engine.bench.probe import run_probe

    p, fig = run.plan, run.figures
    path = _synthetic(p.speed_size, p.contexts[1] + p.decode_tokens + 16)
    base = {"model_path": str(path), "threads": run.threads, "tokens": p.decode_tokens,
            "vocab": _vocab(path), "seed": 47}
    # The formats the quality part loaded (a refused one has its reason there).
    names = [n for n in ("float16", "int8", "int4") if f"folio {n}" not in fig.why]
    sides = [("folio", "folio", names, list(p.contexts), None)]
    if python is not None:
        sides.append(("llama_cpp", "llama", [LLAMA_OF[n] for n in names if n != "float16"],
                      [p.contexts[0]], python))
    for side, who, kvs, contexts, interpreter in sides:
        got = run_probe("engine.bench.kv_sides:speed", {**base, "side": side, "kvs": kvs,
                                                         "contexts": contexts},
                        p.timeout_s, python=interpreter)
        if "error" in got:
            run.notes.append(f"speed, {who} {', '.join(kvs)}: {got.pop('error')}")
        for kv in kvs:
            fig.speed[f"{who} {kv}"] = {key.removeprefix(f"{kv} "): value
                                        for key, value in got.items()
                                        if key.startswith(f"{kv} ")}


def shape_bytes_of(size: str) -> dict[str, int]:
    from engine.bench import synthetic

    shape = synthetic.SIZES[size]
    return shape_bytes(shape.layers, shape.kv_heads, shape.head_dim)


def _rss(run: _Run, python: str | None) -> None:
    from engine.bench.probe import run_probe

    p, fig = run.plan, run.figures
    path = _synthetic(p.rss_size, p.rss_context)
    base = {"model_path": str(path), "threads": run.threads, "n_ctx": p.rss_context,
            "fill": p.rss_fill, "tokens": 4, "vocab": _vocab(path), "seed": 48}
    sides = [("folio", "int8", None)]
    if python is not None:
        sides.append(("llama_cpp", "q8_0", python))
    for side, kv, interpreter in sides:
        label = f"{'folio' if side == 'folio' else 'llama'} {kv}"
        if f"folio {kv}" in fig.why:
            continue
        got = run_probe("engine.bench.kv_sides:rss", {**base, "side": side, "kv": kv},
                        p.timeout_s, python=interpreter)
        if "error" in got:
            run.notes.append(f"memory, {label}: {got.pop('error')}")
        if got.get("peak_rss_bytes"):
            fig.rss[label] = got["peak_rss_bytes"]


def _plan_text(plan: KVPlan) -> str:
    return (f"text {plan.text_tokens} tokens; {plan.prompts} prompts of ~"
            f"{plan.context_words} words, {plan.reply_tokens}-token replies; "
            f"{plan.speed_size} at {plan.contexts[0]} and {plan.contexts[1]} tokens, "
            f"{plan.decode_tokens} decoded; {plan.rss_size} at {plan.rss_context} tokens "
            f"after {plan.rss_fill}")
