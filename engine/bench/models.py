"""``folio bench models``: several models in one process (engine/hosting's ModelHost).

Model A is the bench's model (the starter), model B the synthetic Llama-3.2-1B-shaped
Q4_K_M file (``models_second``; the model again under a second name when empty), both in
one ModelHost on the CPU with the bench's threads, each the median of ``models_repeats``
runs:

- switch: a chat's follow-up on A right after a turn on B, time to first token over the
  same follow-up with no turn on B in between (both chats are new to the prefix cache,
  each run with its own tag). The host keeps A loaded while B runs, so A's prefix cache
  of the chat survives. Beside it, the same follow-up after A was unloaded (one model
  at a time, as a server of one model is), which reloads A and recomputes the history.
- cold: a first request to a model that is not loaded, time to first token from the
  request (the host estimates it, loads it, runs it) over that model's load time plus
  the request's own time to first token, both measured in that same request: what the
  host adds to loading the model yourself. The first load of a file in this process
  pays one-time costs (imports, kernels); each model is loaded once before timing.
"""

from __future__ import annotations

import statistics
import threading
import time

from engine.bench.common import bench_result, ms
from engine.bench.setup import BenchContext, Target, filler_prompt, folio_config
from engine.outputs import ErrorEvent, FinishedEvent, TokenEvent
from engine.sampling_params import SamplingParams

TURN_TOKENS = 128  # each user turn's length
FOLLOWUP = "And what would you do next, in one sentence?"


def bench_models(ctx: BenchContext) -> dict:
    s = ctx.settings
    paths = {"A": str(ctx.model_path), "B": second_model_path(ctx)}
    loads: dict[str, list[float]] = {"A": [], "B": []}

    def load(name: str):
        from engine.llm import LLM
        from engine.worker import EngineWorker

        start = time.perf_counter()
        llm = LLM(paths[name], folio_config(ctx.threads, s.weights, num_gpu_blocks=s.kv_blocks,
                                            cpu_activation_bits=s.cpu_activation_bits))
        loads[name].append(time.perf_counter() - start)
        return EngineWorker(llm).start()

    from engine.hosting import ModelHost

    host = ModelHost(folio_config(ctx.threads, s.weights), None, keep_alive_s=None,
                     load=load, estimate=lambda name: 0)
    params = SamplingParams(max_tokens=s.reply_tokens, temperature=0, ignore_eos=True)
    try:
        for name in paths:  # the one-time costs of a first load and first run, untimed
            with host.lease(name) as lease:
                _run(lease.worker, _chat(lease.worker, "Warm-up", []), params)
        switch = _switch(host, params, s.models_repeats)
        cold = _cold(host, params, loads, s.models_repeats)
    finally:
        host.shutdown()
    rows = [*switch["rows"], *cold["rows"]]
    targets = [
        Target("follow-up on model A after a turn on model B, TTFT / the same follow-up "
               "without the switch", switch["ratio"], 1.1, "<="),
        *[Target(f"first request to model {name} not loaded: TTFT / its load time + its "
                 "TTFT", ratio, 1.1, "<=") for name, ratio in cold["ratios"].items()],
    ]
    notes = [f"A: {paths['A']}", f"B: {paths['B']}",
             "one ModelHost in this process, no memory budget (both models fit); the "
             "'A unloaded' row unloads A before its follow-up, as a one-model server must"]
    summary = {"repeats": s.models_repeats, "turn_tokens": TURN_TOKENS}
    return bench_result("models", ctx, rows, summary, targets, notes)


def second_model_path(ctx: BenchContext) -> str:
    """Model B of this bench and of ``folio bench compare``."""
    size = ctx.settings.models_second
    if not size:
        return str(ctx.model_path)
    from engine.bench import synthetic
    from engine.loaders.catalog import starter_path

    return str(synthetic.ensure_synthetic_gguf(starter_path(), synthetic.SIZES[size])[0])


def _switch(host, params, repeats: int) -> dict:
    cases: dict[str, list[float]] = {"stay": [], "switch": [], "unloaded": []}
    cached: dict[str, list[int]] = {key: [] for key in cases}
    for run in range(repeats):
        for case in cases:  # taking turns, so a load spike hits them alike
            tag = f"Hosting {case} {run}"
            with host.lease("A") as lease:
                messages = _chat(lease.worker, tag, [])
                messages = _reply(lease.worker, messages, params)
            if case != "stay":
                with host.lease("B") as lease:
                    _reply(lease.worker, _chat(lease.worker, f"{tag} on B", []), params)
            if case == "unloaded":
                host.unload("A")
            messages.append({"role": "user", "content": FOLLOWUP})
            start = time.perf_counter()
            with host.lease("A") as lease:
                first, output = _run(lease.worker, messages, params)
            cases[case].append(first - start)
            cached[case].append(output.metrics.num_cached_tokens)
    ttft = {case: statistics.median(values) for case, values in cases.items()}
    rows = [{"case": f"follow-up on A: {label}", "ttft_ms": ms(ttft[case]),
             "cached_tokens": statistics.median(cached[case])}
            for case, label in (("stay", "no switch"), ("switch", "after a turn on B"),
                                ("unloaded", "after a turn on B, A unloaded"))]
    return {"rows": rows, "ratio": round(ttft["switch"] / ttft["stay"], 3)}


def _cold(host, params, loads: dict[str, list[float]], repeats: int) -> dict:
    rows, ratios = [], {}
    for name in ("A", "B"):
        firsts, shares = [], []
        for run in range(repeats):
            host.unload(name)
            tag = f"Cold {name} {run}"
            start = time.perf_counter()
            with host.lease(name) as lease:
                messages = _chat(lease.worker, tag, [])
                first, output = _run(lease.worker, messages, params)
            firsts.append(first - start)
            shares.append(loads[name][-1] + output.metrics.ttft_s)
        first, alone = statistics.median(firsts), statistics.median(shares)
        ratios[name] = round(first / alone, 3)
        rows.append({"case": f"first request to {name}, not loaded",
                     "ttft_ms": ms(first), "load_ms": ms(statistics.median(loads[name][1:])),
                     "load_plus_ttft_ms": ms(alone)})
    return {"rows": rows, "ratios": ratios}


def _chat(worker, tag: str, messages: list[dict]) -> list[dict]:
    tok = worker.llm.tokenizer
    return [*messages, {"role": "user",
                        "content": tok.decode(filler_prompt(tok, TURN_TOKENS, tag))}]


def _reply(worker, messages: list[dict], params) -> list[dict]:
    _, output = _run(worker, messages, params)
    reply = output.outputs[0]
    return [*messages, {"role": "assistant", "content": reply.text,
                        "token_ids": list(reply.token_ids)}]


def _run(worker, prompt, params):
    """The moment of the first token (perf_counter) and the finished output."""
    done, got = threading.Event(), {}

    def on_event(event) -> None:
        if isinstance(event, TokenEvent) and "first" not in got:
            got["first"] = time.perf_counter()
        elif isinstance(event, FinishedEvent | ErrorEvent):
            got["end"] = event
            done.set()

    worker.submit(prompt, params, on_event, label="bench")
    if not done.wait(600):
        raise TimeoutError("a bench request did not finish in 600 s")
    if isinstance(got["end"], ErrorEvent):
        raise RuntimeError(got["end"].message)
    return got["first"], got["end"].output
