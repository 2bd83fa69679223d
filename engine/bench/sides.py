"""The bench sides that run in a process of their own (``probe.run_probe``): one short chat
for ``memory`` and the 8B load and decode for ``8b``.

Nothing heavy is imported at the top: a llama.cpp side loads llama.cpp alone (no torch, no
Folio), so its peak memory is llama.cpp's.
"""

from __future__ import annotations

import time

from engine.bench.probe import emit, peak_rss_bytes


def chat_peak_rss(side: str, model_path: str, threads: int, n_ctx: int, texts: list[str],
                  reply_tokens: int) -> None:
    """Load one side ("folio_stored", "folio_float32" or "llama_cpp") with an ``n_ctx``
    context, answer ``texts`` as a chat, then emit the process's peak RSS."""
    start = time.perf_counter()
    if side == "llama_cpp":
        llama = _llama(model_path, threads, n_ctx)
        emit({"load_s": time.perf_counter() - start})
        chat_start = time.perf_counter()
        messages: list[dict] = []
        for text in texts:  # llama.cpp's own chat path: its template and tokenizer
            messages.append({"role": "user", "content": text})
            out = llama.create_chat_completion(messages, max_tokens=reply_tokens,
                                               temperature=0.0)
            messages.append({"role": "assistant",
                             "content": out["choices"][0]["message"]["content"] or ""})
        emit({"peak_rss_bytes": peak_rss_bytes(), "chat_s": time.perf_counter() - chat_start})
        return
    from engine.sampling_params import SamplingParams

    llm = _folio(model_path, threads, side.removeprefix("folio_"), n_ctx)
    emit({"load_s": time.perf_counter() - start})
    params = SamplingParams(max_tokens=reply_tokens, temperature=0)
    chat_start = time.perf_counter()
    messages = []
    for text in texts:
        messages.append({"role": "user", "content": text})
        out = llm.chat(messages, params)
        messages.append({"role": "assistant", "content": out.outputs[0].text,
                         "token_ids": list(out.outputs[0].token_ids)})
    stats = llm.memory_stats()
    emit({"peak_rss_bytes": peak_rss_bytes(), "weights_bytes": stats.weights_bytes,
          "kv_bytes": stats.kv_pool_bytes, "chat_s": time.perf_counter() - chat_start})


def decode_8b(model_path: str, threads: int, prompt_tokens: int, tokens: int, rounds: int,
              with_llama: bool) -> None:
    """Load Folio (``weights="stored"``) and, with ``with_llama``, llama.cpp on the same
    file; emit each load's time, then decode ``tokens`` greedy tokens after a fresh
    ``prompt_tokens``-token prompt per round, the sides taking turns to go first. Each
    figure is emitted as soon as it exists, so a run cut short still reports the load."""
    from engine.bench.baselines import LlamaCppChat, median_rate
    from engine.bench.setup import filler_prompt
    from engine.sampling_params import SamplingParams

    n_ctx = prompt_tokens + tokens + 16
    start = time.perf_counter()
    llm = _folio(model_path, threads, "stored", n_ctx)
    emit({"folio_load_s": time.perf_counter() - start, "folio_loaded": True,
          "folio_weights_bytes": llm.memory_stats().weights_bytes,
          "folio_peak_rss_bytes": peak_rss_bytes()})
    sides = {"folio": lambda ids: _folio_times(llm, ids, tokens, SamplingParams)}
    if with_llama:
        start = time.perf_counter()
        llama = LlamaCppChat(model_path, threads, n_ctx)
        emit({"llama_cpp_load_s": time.perf_counter() - start})
        sides["llama_cpp"] = lambda ids: llama.reply(ids, tokens).token_times
    times: dict[str, list[list[float]]] = {name: [] for name in sides}
    for r in range(rounds):
        prompt = filler_prompt(llm.tokenizer, prompt_tokens, f"Eight B round {r}")
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            times[name].append(sides[name](prompt))
            emit({f"{name}_tok_s": median_rate(*times[name]), "rounds_done": r + 1})


def _folio_times(llm, prompt: list[int], tokens: int, params_cls) -> list[float]:
    from engine.bench.setup import run_folio

    params = params_cls(max_tokens=tokens, temperature=0, ignore_eos=True)
    return run_folio(llm, prompt, params).token_times


def _folio(model_path: str, threads: int, weights: str, n_ctx: int):
    """Folio on the CPU with a KV pool of exactly one ``n_ctx`` context (as llama.cpp's)."""
    import torch

    from engine.bench.setup import folio_config
    from engine.llm import LLM

    torch.set_num_threads(threads)
    config = folio_config(threads, weights, max_model_len=n_ctx, block_size=16,
                          num_gpu_blocks=-(-n_ctx // 16))
    return LLM(model_path, config)


def _llama(model_path: str, threads: int, n_ctx: int):
    from llama_cpp import Llama

    return Llama(model_path=model_path, n_ctx=n_ctx, n_threads=threads,
                 n_threads_batch=threads, verbose=False)
