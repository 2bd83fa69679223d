"""The sides of ``folio bench kv`` that run in a process of their own (``probe.run_probe``):
decode and prefill speed at long contexts (``speed``: one process per side, its cache
formats taking turns, so that each format's figures and its baseline's are measured seconds
apart on a shared machine), and the peak RSS at one long context (``rss``: one process per
side and format, so each one's memory is its own).

``side`` is "folio" (``kv`` a kv_cache_dtype name) or "llama_cpp" (``kv`` a llama.cpp cache
type, "q8_0" or "q4_0", flash attention on: without it llama.cpp's quantized V cache is
refused or saves nothing). Folio's pool holds exactly one ``n_ctx`` context, as llama.cpp's
does. Prompts are random ids of ordinary tokens drawn here from ``seed`` (the same on both
sides), a fresh prompt per context so no side finds one in its cache.

Nothing heavy is imported at the top: a llama.cpp side runs under an interpreter with
llama-cpp-python and without torch.
"""

from __future__ import annotations

import dataclasses

from engine.bench.probe import emit, peak_rss_bytes

SIDES = ("folio", "llama_cpp")
# llama.cpp's cache types by name: their GGML type ids (ggml.h's enum ggml_type).
LLAMA_TYPES = {"f16": 1, "q4_0": 2, "q8_0": 8}
WARMUP_TOKENS = 8
# Decodes timed per context and format, the fastest kept: the first after the prefill,
# then the same prompt again (cached, so only its decode costs). One decode of a few dozen
# tokens moved by 20-30% with other machines' load on a shared host, and whole runs of a
# format a few minutes apart by up to a quarter: so the formats take turns, round by round.
DECODE_ROUNDS = 3


def speed(side: str, model_path: str, threads: int, kvs: list[str], contexts: list[int],
          tokens: int, vocab: int, seed: int) -> None:
    """Load ``side`` once per cache format in ``kvs``, each with an ``n_ctx`` of the
    longest context, warm each up, then per context (ascending) let every format answer a
    fresh prompt of that many ids (the same ids for each) with ``tokens`` greedy tokens,
    one format after the other, and the same prompt again DECODE_ROUNDS - 1 rounds, the
    formats in turn; emit ``"{kv} ttft_s_{c}"`` (the first answer's prompt handed over to
    first token: the prefill) and ``"{kv} decode_tok_s_{c}"`` (1 / the median gap between
    tokens, the best of the rounds) as each context finishes."""
    from engine.bench.baselines import median_rate

    n_ctx = max(contexts) + tokens + 16
    models = {kv: _load(side, model_path, threads, kv, n_ctx) for kv in kvs}
    emit({"loaded": True})
    for model, reply in models.values():
        reply(model, prompt(vocab, WARMUP_TOKENS, seed - 1), 2)
    for context in sorted(contexts):
        ids = prompt(vocab, context, seed + context)
        ttft: dict[str, float] = {}
        rates: dict[str, list[float]] = {kv: [] for kv in kvs}
        for _ in range(DECODE_ROUNDS):
            for kv, (model, reply) in models.items():
                got = reply(model, ids, tokens)
                ttft.setdefault(kv, got.ttft_s)
                rates[kv].append(median_rate(got.token_times))
        for kv in kvs:
            emit({f"{kv} ttft_s_{context}": ttft[kv],
                  f"{kv} decode_tok_s_{context}": max(rates[kv])})


def rss(side: str, model_path: str, threads: int, kv: str, n_ctx: int, fill: int,
        tokens: int, vocab: int, seed: int) -> None:
    """Load ``side`` with an ``n_ctx`` context, answer a ``fill``-id prompt with ``tokens``
    greedy tokens, emit the process's peak RSS (and Folio's KV pool bytes)."""
    model, reply = _load(side, model_path, threads, kv, n_ctx)
    reply(model, prompt(vocab, fill, seed), tokens)
    out = {"peak_rss_bytes": peak_rss_bytes()}
    if side == "folio":
        out["kv_pool_bytes"] = model.memory_stats().kv_pool_bytes
    emit(out)


def prompt(vocab: int, length: int, seed: int) -> list[int]:
    """``length`` random ids above the first 256 (a tokenizer's special and byte tokens)."""
    import numpy as np

    low = min(256, vocab // 2)
    return np.random.default_rng(seed).integers(low, vocab, length).tolist()


def _load(side: str, model_path: str, threads: int, kv: str, n_ctx: int):
    if side == "folio":
        return _folio(model_path, threads, kv, n_ctx), _folio_reply
    if side == "llama_cpp":
        return _llama(model_path, threads, kv, n_ctx), _llama_reply
    raise ValueError(f"side must be one of {SIDES}, got {side!r}")


def _folio(model_path: str, threads: int, kv: str, n_ctx: int):
    import torch

    from engine.bench.setup import folio_config
    from engine.llm import LLM

    torch.set_num_threads(threads)
    config = folio_config(threads, "stored", max_model_len=n_ctx, kv_cache_dtype=kv)
    # The whole context's blocks, of the format's size (16, or int4's 32).
    config = dataclasses.replace(config, num_gpu_blocks=-(-n_ctx // config.block_size))
    return LLM(model_path, config)


def _folio_reply(llm, ids: list[int], tokens: int):
    from engine.bench.baselines import Reply
    from engine.bench.setup import run_folio
    from engine.sampling_params import SamplingParams

    run = run_folio(llm, ids, SamplingParams(max_tokens=tokens, temperature=0,
                                             ignore_eos=True))
    return Reply(list(run.output.outputs[0].token_ids), run.token_times[0] - run.start,
                 run.output.metrics.num_computed_prompt_tokens, len(ids), run.token_times)


def _llama(model_path: str, threads: int, kv: str, n_ctx: int):
    from engine.bench.baselines import LlamaCppChat

    if kv not in LLAMA_TYPES:
        raise ValueError(f"kv must be one of {tuple(LLAMA_TYPES)} for llama.cpp, got {kv!r}")
    return LlamaCppChat(model_path, threads, n_ctx, type_k=LLAMA_TYPES[kv],
                        type_v=LLAMA_TYPES[kv], flash_attn=True)


def _llama_reply(chat, ids: list[int], tokens: int):
    return chat.reply(ids, tokens)
