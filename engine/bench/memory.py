"""``folio bench memory``: peak resident memory after one short chat with an 8,192-token
context (``memory_context``), for Folio keeping the GGUF quantized (``weights="stored"``),
Folio dequantized to float32 (the old path, for comparison) and llama.cpp (``n_ctx``).

Each side runs in a fresh process (``probe.run_probe``): a process's peak (VmHWM) never goes
down, so sides sharing one would hide each other. Folio's KV pool holds exactly one full
context (``max_model_len`` and ``num_gpu_blocks``), as llama.cpp's ``n_ctx`` does, so the
two pay for the same context. Folio also reports its resident weight bytes, compared with
the bytes of the GGUF's tensors: a stored model should be little more than its file.
"""

from __future__ import annotations

from engine.bench.common import bench_result
from engine.bench.probe import run_probe
from engine.bench.setup import USER_TEXTS, BenchContext, Target

PROBE_TIMEOUT_S = 600.0
SIDES = ("folio_stored", "folio_float32", "llama_cpp")


def bench_memory(ctx: BenchContext) -> dict:
    s = ctx.settings
    notes = []
    sides = list(SIDES)
    llama_note = ctx.llama_cpp_note()
    if llama_note is not None:
        sides.remove("llama_cpp")
        notes.append(llama_note)
    gguf_bytes = gguf_tensor_bytes(ctx.model_path)
    rows, by_side = [], {}
    for side in sides:
        kwargs = {"side": side, "model_path": str(ctx.model_path), "threads": ctx.threads,
                  "n_ctx": s.memory_context,
                  "reply_tokens": s.reply_tokens,
                  "texts": [USER_TEXTS[t % len(USER_TEXTS)] for t in range(s.memory_turns)]}
        got = run_probe("engine.bench.sides:chat_peak_rss", kwargs, PROBE_TIMEOUT_S)
        by_side[side] = got
        if "error" in got:
            notes.append(f"{side}: {got['error']}")
        rows.append(_row(side, got, gguf_bytes))
    summary = {"context": s.memory_context, "chat_turns": s.memory_turns,
               "gguf_tensor_bytes": gguf_bytes,
               "peak": "VmHWM of a fresh process after loading and one chat"}
    return bench_result("memory", ctx, rows, summary, _targets(by_side, gguf_bytes), notes)


def _row(side: str, got: dict, gguf_bytes: int | None) -> dict:
    row = {"side": side, "peak_rss_mib": _mib(got.get("peak_rss_bytes")),
           "load_s": round(got["load_s"], 2) if "load_s" in got else "",
           "chat_s": round(got["chat_s"], 2) if "chat_s" in got else "",
           "weights_mib": _mib(got.get("weights_bytes")),
           "kv_mib": _mib(got.get("kv_bytes"))}
    if got.get("weights_bytes") and gguf_bytes:
        row["weights_per_gguf_byte"] = round(got["weights_bytes"] / gguf_bytes, 3)
    return row


def _targets(by_side: dict[str, dict], gguf_bytes: int | None) -> list[Target]:
    stored = by_side.get("folio_stored", {})
    llama = by_side.get("llama_cpp", {})
    targets = []
    if stored.get("peak_rss_bytes") and llama.get("peak_rss_bytes"):
        targets.append(Target(RSS_TARGET, round(stored["peak_rss_bytes"] /
                                                llama["peak_rss_bytes"], 3), 2.0, "<="))
    if stored.get("weights_bytes") and gguf_bytes:
        targets.append(Target(WEIGHTS_TARGET, round(stored["weights_bytes"] / gguf_bytes, 3),
                              1.1, "<="))
    return targets


RSS_TARGET = "Folio (stored) / llama.cpp peak RSS after one chat"
WEIGHTS_TARGET = "Folio (stored) resident weight bytes / GGUF tensor bytes"


def _mib(value: int | None) -> float | str:
    return round(value / 2**20, 1) if value else ""


def gguf_tensor_bytes(path) -> int | None:
    """The bytes of every tensor in a GGUF file (None for a model folder)."""
    from pathlib import Path

    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from engine.loaders.gguf.header import parse_gguf_header

    if Path(path).suffix.lower() != ".gguf":
        return None
    total = 0
    for tensor in parse_gguf_header(Path(path)).tensors:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.qtype)]
        count = 1
        for dim in tensor.shape:
            count *= dim
        total += count // block * block_bytes
    return total
