"""``folio bench compare``: a chat compared across two models, as the app's compare view runs
it: per turn, each model answers from its own prefix cache; computed prompt tokens per
model on turns 2-8 over the turn's new tokens.

Two models in one ModelHost (engine.hosting), each its own EngineWorker with its own KV
pool: the bench's model and the second model of ``folio bench models`` (the synthetic
1B-shaped Q4_K_M, ``models_second``; the bench's model again when that is empty). Each turn both
answer at once (greedy, ``reply_tokens`` each); the reply kept alternates between them, as a
user's Keep would. Each model's prompt is what the app builds for it: the conversation with
the kept replies, the ones it wrote as its own ids and the other model's as text
(desktop_app.data.chat_store.messages_for_engine). A turn's "new tokens" for a model are
how much its prompt grew since its previous one (the kept reply and the new question, in its
tokens); "computed" are its prompt tokens not found in its cache.
"""

from __future__ import annotations

import threading

from engine.bench.common import bench_result
from engine.bench.models import second_model_path
from engine.bench.setup import BenchContext, Target, folio_config, user_messages
from engine.chat import ChatRequest
from engine.outputs import ErrorEvent, FinishedEvent
from engine.sampling_params import SamplingParams

TURNS = 8
COMPARE_TARGET = 1.3


def _answer(worker, prompt, params) -> object:
    """Submit and wait for the request's output (RequestOutput)."""
    done, box = threading.Event(), {}

    def on_event(event) -> None:
        if isinstance(event, FinishedEvent | ErrorEvent):
            box["event"] = event
            done.set()

    worker.submit(prompt, params, on_event)
    done.wait()
    event = box["event"]
    if isinstance(event, ErrorEvent):
        raise RuntimeError(event.message)
    return event.output


def _answer_all(workers: dict, prompts: dict, params) -> dict:
    """Every model answers its prompt at once, as a compare turn's columns do."""
    outputs: dict[str, object] = {}

    def run(name: str) -> None:
        outputs[name] = _answer(workers[name], prompts[name], params)

    threads = [threading.Thread(target=run, args=(name,)) for name in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outputs


def _messages_for(history: list[dict], name: str) -> list[dict]:
    """The conversation as ``name``'s prompt: its own replies as its ids, others' as text."""
    return [{k: v for k, v in m.items() if k not in ("token_ids", "model")}
            | ({"token_ids": m["token_ids"]} if m.get("model") == name else {})
            for m in history]


def bench_compare(ctx: BenchContext) -> dict:
    from engine.hosting.host import ModelHost
    from engine.llm import LLM
    from engine.worker import EngineWorker

    s = ctx.settings
    config = folio_config(ctx.threads, s.weights, num_gpu_blocks=s.kv_blocks)
    names = ("A", "B")
    files = {"A": str(ctx.model_path), "B": second_model_path(ctx)}
    host = ModelHost(config, None, keep_alive_s=None,
                     load=lambda name: EngineWorker(LLM(files[name], config)).start(),
                     estimate=lambda name: 0)
    leases = [host.lease(name) for name in names]
    try:
        workers = {lease.name: lease.worker for lease in leases}
        tokenizer = next(iter(workers.values())).llm.tokenizer
        texts = user_messages(tokenizer, TURNS, 64)
        params = SamplingParams(max_tokens=s.reply_tokens, temperature=0.0, ignore_eos=True)
        history: list[dict] = []
        last_len = dict.fromkeys(names, 0)
        rows = []
        for turn, text in enumerate(texts, start=1):
            history.append({"role": "user", "content": text})
            prompts = {name: worker.llm.prompts.build(ChatRequest(_messages_for(history, name)))
                       for name, worker in workers.items()}
            outputs = _answer_all(workers, prompts, params)
            for i, name in enumerate(names):
                metrics = outputs[name].metrics
                new = len(prompts[name].ids) - last_len[name]
                last_len[name] = len(prompts[name].ids)
                rows.append({"turn": turn, "model": f"model {'AB'[i]}",
                             "prompt_tokens": metrics.num_prompt_tokens,
                             "cached_tokens": metrics.num_cached_tokens,
                             "computed_tokens": metrics.num_prompt_tokens
                             - metrics.num_cached_tokens,
                             "new_tokens": new, "ttft_ms": round(metrics.ttft_s * 1000, 1)})
            kept = names[(turn - 1) % 2]  # Keep alternates between the two columns
            out = outputs[kept].outputs[0]
            history.append({"role": "assistant", "content": out.text,
                            "token_ids": list(out.token_ids), "model": kept})
    finally:
        for lease in leases:
            lease.release()
        host.shutdown()
    later = [r for r in rows if r["turn"] >= 2]
    ratios = {}
    for label in ("model A", "model B"):
        mine = [r for r in later if r["model"] == label]
        ratios[label] = round(sum(r["computed_tokens"] for r in mine)
                              / max(1, sum(r["new_tokens"] for r in mine)), 3)
    worst = max(ratios.values())
    # The baseline: an app that reads the whole conversation again for each model and turn.
    whole = round(sum(r["prompt_tokens"] for r in later)
                  / max(1, sum(r["new_tokens"] for r in later)), 3)
    summary = {"turns": TURNS, "reply_tokens": s.reply_tokens,
               "computed_over_new_turns_2_8": ratios,
               "whole_history_over_new_turns_2_8": whole}
    targets = [Target("compare turn, 2 models: computed prompt tokens per model on turns 2-8 "
                      "/ new tokens of the turn (the worse model)", worst, COMPARE_TARGET, "<=")]
    notes = [f"A: {files['A']}", f"B: {files['B']}",
             "one ModelHost (two workers, two KV pools); the kept reply alternates A, B, "
             "A, ...; a model's prompt holds its own kept replies as its ids and the "
             "other's as text."]
    return bench_result("compare", ctx, rows, summary, targets, notes)
