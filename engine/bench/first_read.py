"""A document's first read, Folio next to llama.cpp (``folio bench documents``): the same
prompt ids (the 4-page PDF's first question, as Folio built it) prefilled by each side in a
process of its own, the best of ``runs``. The first read is all prefill: Folio's time to its
first token (prefix caching off, so every run reads the whole prompt) against llama.cpp's
``eval`` of the ids (its logits for the last position: the first token's), with flash
attention off and on, the faster kept.

Nothing heavy is imported at the top: the llama.cpp side runs under an interpreter with
llama-cpp-python and without torch.
"""

from __future__ import annotations

import time

from engine.bench.probe import emit, run_probe

RUNS = 3
TIMEOUT_S = 900.0


def first_read_row(model_path: str, threads: int, weights: str, cpu_activation_bits: int,
                   ids: list[int], notes: list[str]) -> dict:
    """The row of both sides' best prefill of ``ids``; a side that cannot run is noted and
    its cells left out (the ratio with them)."""
    from engine.bench.kv import llama_python

    row: dict = {"case": "4-page PDF, first read", "prompt_tokens": len(ids)}
    folio = run_probe("engine.bench.first_read:folio_prefill", {
        "model_path": model_path, "threads": threads, "weights": weights,
        "cpu_activation_bits": cpu_activation_bits, "ids": ids, "runs": RUNS}, TIMEOUT_S)
    if "error" in folio:
        notes.append(f"the first read, Folio: {folio['error']}")
    python, why = llama_python()
    if why is None and not model_path.lower().endswith(".gguf"):
        why = "llama.cpp skipped: it needs a .gguf file, the model is a folder"
    llama: dict = {}
    if why:
        notes.append(f"the first read: {why}")
    else:
        llama = run_probe("engine.bench.first_read:llama_prefill", {
            "model_path": model_path, "threads": threads, "ids": ids, "runs": RUNS},
            TIMEOUT_S, python=python)
        if "error" in llama:
            notes.append(f"the first read, llama.cpp: {llama['error']}")
    if "prefill_s" in folio:
        row["folio_ms"] = round(folio["prefill_s"] * 1e3, 1)
    if "prefill_s" in llama:
        row["llama_cpp_ms"] = round(llama["prefill_s"] * 1e3, 1)
        row["llama_cpp_flash_attn"] = llama["flash_attn"]
    if "folio_ms" in row and "llama_cpp_ms" in row:
        row["folio_over_llama_cpp"] = round(row["folio_ms"] / row["llama_cpp_ms"], 4)
    return row


def folio_prefill(model_path: str, threads: int, weights: str, cpu_activation_bits: int,
                  ids: list[int], runs: int) -> None:
    """Folio's time to the first token of ``ids`` (one generated token), best of ``runs``,
    after a short warm-up; emits ``prefill_s``."""
    from engine.bench.setup import folio_config
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    llm = LLM(model_path, folio_config(threads, weights, enable_prefix_caching=False,
                                       cpu_activation_bits=cpu_activation_bits))
    one = SamplingParams(max_tokens=1, temperature=0)
    llm.generate([ids[:16]], one)
    best = None
    for _ in range(runs):
        out = llm.generate([ids], one)[0]
        ttft = out.metrics.ttft_s
        best = ttft if best is None else min(best, ttft)
        emit({"prefill_s": best})


def llama_prefill(model_path: str, threads: int, ids: list[int], runs: int) -> None:
    """llama.cpp's ``eval`` of ``ids`` from an empty cache, best of ``runs`` with flash
    attention off and on (its faster one is the bar), after a short warm-up; emits
    ``prefill_s`` and ``flash_attn``."""
    from engine.bench.baselines import LlamaCppChat

    best = None
    for flash_attn in (False, True):
        llm = LlamaCppChat(model_path, threads, len(ids) + 16, flash_attn=flash_attn).llm
        llm.eval(ids[:16])
        for _ in range(runs):
            llm.reset()
            start = time.perf_counter()
            llm.eval(ids)
            elapsed = time.perf_counter() - start
            if best is None or elapsed < best:
                best = elapsed
                emit({"prefill_s": best, "flash_attn": flash_attn})
        del llm
