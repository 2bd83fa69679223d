"""``folio bench reopen``: a chat reopened after a restart, its history found in the KV
cache's disk tier.

A 12-turn chat of about ``reopen_tokens`` tokens (filler user turns, greedy replies of
``reply_tokens``) on an engine with the disk tier on, in a fresh temporary cache folder.
Then turn 13's time to first token three ways, in one run: the app kept open (the history
in memory), after a restart (the engine closed, its cached blocks written to disk, a new
engine on the same folder: the history loaded from disk) and recomputing the whole
history (a new engine, the tier off). Also decode tokens/s while the chat's blocks are
being written (the writer thread busy) over decode with the tier off, and a block file's
bytes over its KV bytes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from engine.bench.common import bench_result, ms
from engine.bench.setup import BenchContext, Target, filler_prompt, folio_config
from engine.sampling_params import SamplingParams

TURNS = 12
DISK_BYTES = 4 << 30


def bench_reopen(ctx: BenchContext) -> dict:
    s = ctx.settings
    params = SamplingParams(max_tokens=s.reply_tokens, temperature=0, ignore_eos=True)
    user_tokens = max(8, s.reopen_tokens // TURNS - s.reply_tokens)
    saved = os.environ.get("FOLIO_KV_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="folio-reopen-") as folder:
        os.environ["FOLIO_KV_CACHE_DIR"] = folder
        try:
            row, decode = _measure(ctx, params, user_tokens, Path(folder))
        finally:
            if saved is None:
                os.environ.pop("FOLIO_KV_CACHE_DIR", None)
            else:
                os.environ["FOLIO_KV_CACHE_DIR"] = saved
    targets = [
        Target("restart / kept-open TTFT of turn 13", row["restart_over_open"], 1.5, "<="),
        Target("restart / recompute TTFT of turn 13", row["restart_over_recompute"], 0.2,
               "<="),
        Target("decode tok/s while writing blocks / tier off", decode, 0.97, ">="),
        Target("disk bytes / KV bytes per block", row["disk_over_kv_bytes"], 1.05, "<="),
    ]
    notes = ["the 1B shape is not run here: its synthetic GGUF prefills a 4,000-token "
             "history for minutes on this machine (folio bench sizes has it)"]
    return bench_result("reopen", ctx, [row], {"turns": TURNS, "user_tokens": user_tokens},
                        targets, notes)


def _llm(ctx: BenchContext, disk: bool):
    from engine.llm import LLM

    s = ctx.settings
    return LLM(str(ctx.model_path), folio_config(
        ctx.threads, s.weights, num_gpu_blocks=s.kv_blocks,
        cpu_activation_bits=s.cpu_activation_bits, kv_disk_bytes=DISK_BYTES if disk else 0))


def _chat(llm, params, user_tokens: int) -> list[dict]:
    tok = llm.tokenizer
    messages: list[dict] = []
    for turn in range(TURNS):
        text = tok.decode(filler_prompt(tok, user_tokens, f"Reopen turn {turn + 1}"))
        messages.append({"role": "user", "content": text})
        reply = llm.chat(messages, params).outputs[0]
        messages.append({"role": "assistant", "content": reply.text,
                         "token_ids": reply.token_ids})
    messages.append({"role": "user", "content": "Sum the whole conversation up."})
    return messages


def _measure(ctx: BenchContext, params, user_tokens: int, root: Path) -> tuple[dict, float]:
    llm = _llm(ctx, disk=True)
    messages = _chat(llm, params, user_tokens)
    kept = llm.chat(messages, params)  # turn 13, the app kept open
    llm.close()
    del llm
    reopened = _llm(ctx, disk=True)
    restart = reopened.chat(messages, params)
    recomputing = _llm(ctx, disk=False)
    recompute = recomputing.chat(messages, params)
    files = list(root.rglob("*.kvb"))
    per_block = reopened.engine.runner.block_payload_bytes(0)
    disk_bytes = sum(f.stat().st_size for f in files) / max(len(files), 1)
    decode = _decode_while_writing(reopened, recomputing, messages, params)
    m = restart.metrics
    row = {"prompt_tokens": m.num_prompt_tokens,
           "open_ttft_ms": ms(kept.metrics.ttft_s), "restart_ttft_ms": ms(m.ttft_s),
           "recompute_ttft_ms": ms(recompute.metrics.ttft_s),
           "restart_disk_tokens": m.num_disk_tokens,
           "restart_cached_tokens": m.num_cached_tokens,
           "same_reply": restart.outputs[0].token_ids == kept.outputs[0].token_ids,
           "restart_over_open": round(m.ttft_s / max(kept.metrics.ttft_s, 1e-9), 3),
           "restart_over_recompute": round(m.ttft_s / max(recompute.metrics.ttft_s, 1e-9), 3),
           "block_files": len(files),
           "disk_over_kv_bytes": round(disk_bytes / per_block, 4)}
    return row, decode


def _decode_while_writing(on, off, messages, params) -> float:
    """Decode tok/s of the tier-on engine while its cached blocks are being written (its
    folder cleared first, so every block is written again), over the tier-off engine's."""
    long = SamplingParams(max_tokens=max(32, 2 * params.max_tokens), temperature=0,
                          ignore_eos=True)
    on.engine.clear_disk()
    on.engine.runner.save_blocks(on.engine.kv_cache.unsaved_cached())  # queued, not waited
    writing = on.chat(messages, long).metrics.decode_tok_s
    on.engine.disk.flush()
    quiet = off.chat(messages, long).metrics.decode_tok_s
    return round(writing / max(quiet, 1e-9), 3)
