"""``folio bench reopen``: a chat reopened after a restart, its history found in the KV
cache's disk tier.

Per model (the bench's, then each synthetic size of ``reopen_sizes``: the
Llama-3.2-1B-shaped Q4_K_M of ``synthetic.py`` by default), a 12-turn chat of about
``reopen_tokens`` tokens (filler user turns, greedy replies of ``reply_tokens``) on an
engine with the disk tier on, in a fresh temporary cache folder; the history goes to
disk as the app quits (``LLMEngine.close``). Then turn 13's time to first token, each the
median of ``reopen_repeats`` runs, in one run:

- kept open: the first engine (the history in memory), between the restarts;

each repeat's turn 13 a message of its own (so the kept-open engine never finds the
previous repeat's turn 13 in memory), the same for every case of that repeat;
- restart, sent at once: the engine closed (its cached blocks written to disk), a new
  engine on the same folder, turn 13 sent as soon as it is loaded: the history is read
  from disk inside the request;
- restart, opened then sent: a new engine, the chat opened first (``LLMEngine.preload``
  of the history, as the app does when a chat is selected), then turn 13 sent. The
  target uses this case: it is what the app does, the user opening a chat before typing;
- restart, warmed up: as "sent at once" on an engine built with the load-time warm-up
  forward (``EngineConfig.warm_up``, off by default), to show what it saves here (in
  one process, little: the first engine paid the one-time costs for the others);
- recompute: a new engine with the tier off (once: it is the slow one).

Each restart is a new engine in this process, so the block files are in the page cache
(an app reopened soon after it closed; after a reboot the first read is the disk's).
Also decode tokens/s while the chat's blocks are being written (the writer thread busy)
over decode with the tier off; decode tokens/s of a running request while another
request's history is read from disk (the reader thread busy, the loading request waiting
in the scheduler) over the same request's decode just before, on the same engine; and a
block file's bytes over its KV bytes.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from engine.bench.common import bench_result, ms
from engine.bench.setup import BenchContext, Target, filler_prompt, folio_config
from engine.core.sequence import common_prefix
from engine.sampling_params import SamplingParams

TURNS = 12
FINAL_MESSAGE = "Sum the whole conversation up."  # turn 13
DISK_BYTES = 4 << 30
# Restart TTFTs, each a fresh engine on the same folder: (row key, engine options, preload).
RESTARTS = (("restart", {}, False), ("opened", {}, True),
            ("warm_up", {"warm_up": True}, False))


def bench_reopen(ctx: BenchContext) -> dict:
    s = ctx.settings
    params = SamplingParams(max_tokens=s.reply_tokens, temperature=0, ignore_eos=True)
    user_tokens = max(8, s.reopen_tokens // TURNS - s.reply_tokens)
    rows, targets, notes = [], [], []
    shapes = ("model", *s.reopen_sizes)
    for shape in shapes:
        path = _shape_path(ctx, shape, notes)
        row, decode = _in_fresh_folder(ctx, path, params, user_tokens)
        if shape == "model":
            shape = s.model
        rows.append({"model": shape, **row})
        targets += [
            Target(f"{shape}: restart (opened, then sent) / kept-open TTFT of turn 13",
                   row["opened_over_open"], 1.5, "<="),
            Target(f"{shape}: restart / recompute TTFT of turn 13",
                   row["opened_over_recompute"], 0.2, "<="),
            Target(f"{shape}: decode tok/s while another request's blocks load / alone",
                   row["decode_while_loading_over_alone"], 0.97, ">="),
        ]
        if len(rows) == 1:
            targets += [
                Target("decode tok/s while writing blocks / tier off", decode, 0.97, ">="),
                Target("disk bytes / KV bytes per block", row["disk_over_kv_bytes"], 1.05,
                       "<="),
            ]
    notes.append("the 'restart' figures are medians of fresh engines on the same folder "
                 "in this process: the block files are in the page cache")
    summary = {"turns": TURNS, "user_tokens": user_tokens, "repeats": s.reopen_repeats}
    return bench_result("reopen", ctx, rows, summary, targets, notes)


def _shape_path(ctx: BenchContext, shape: str, notes: list[str]) -> Path:
    """The model file of ``shape``: "model" is the bench's model, else a synthetic size."""
    if shape == "model":
        return ctx.model_path
    from engine.bench import synthetic
    from engine.loaders.catalog import starter_path

    path, written = synthetic.ensure_synthetic_gguf(starter_path(), synthetic.SIZES[shape])
    notes.append(f"{shape}: {path.name} ({'written now' if written else 'reused'})")
    return path


def _in_fresh_folder(ctx, path: Path, params, user_tokens: int) -> tuple[dict, float]:
    saved = os.environ.get("FOLIO_KV_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="folio-reopen-") as folder:
        os.environ["FOLIO_KV_CACHE_DIR"] = folder
        try:
            return _measure(ctx, path, params, user_tokens, Path(folder))
        finally:
            if saved is None:
                os.environ.pop("FOLIO_KV_CACHE_DIR", None)
            else:
                os.environ["FOLIO_KV_CACHE_DIR"] = saved


def _llm(ctx: BenchContext, path: Path, disk: bool, **options):
    from engine.llm import LLM

    s = ctx.settings
    return LLM(str(path), folio_config(
        ctx.threads, s.weights, num_gpu_blocks=s.kv_blocks,
        cpu_activation_bits=s.cpu_activation_bits, kv_disk_bytes=DISK_BYTES if disk else 0,
        **options))


def _chat(llm, params, user_tokens: int) -> list[dict]:
    tok = llm.tokenizer
    messages: list[dict] = []
    for turn in range(TURNS):
        text = tok.decode(filler_prompt(tok, user_tokens, f"Reopen turn {turn + 1}"))
        messages.append({"role": "user", "content": text})
        reply = llm.chat(messages, params).outputs[0]
        messages.append({"role": "assistant", "content": reply.text,
                         "token_ids": reply.token_ids})
    messages.append({"role": "user", "content": FINAL_MESSAGE})
    return messages


def _measure(ctx, path: Path, params, user_tokens: int, root: Path) -> tuple[dict, float]:
    repeats = ctx.settings.reopen_repeats
    llm = _llm(ctx, path, disk=True)
    messages = _chat(llm, params, user_tokens)
    # The history to disk as the app quits; turn 13 kept open after that, so its own
    # blocks are not on disk for the restarts to find.
    llm.close()
    history = common_prefix(llm.engine.encode(messages[:-1]), llm.engine.encode(messages))
    outputs: dict[str, list] = {"open": []}
    preload_s = []
    same_reply = True
    for repeat in range(repeats):  # the cases take turns, so a load spike hits them alike
        # Each repeat's turn 13 is a message of its own: the kept-open engine would
        # otherwise find the blocks of its previous repeat's turn 13 in memory.
        turn = [*messages[:-1], {"role": "user", "content": f"{FINAL_MESSAGE} ({repeat + 1})"}]
        kept = llm.chat(turn, params)
        outputs["open"].append(kept)
        for key, options, opened in RESTARTS:
            reopened = _llm(ctx, path, disk=True, **options)
            if opened:
                start = time.perf_counter()
                reopened.engine.preload(messages[:-1])  # the chat as it was left
                preload_s.append(time.perf_counter() - start)
            output = reopened.chat(turn, params)
            outputs.setdefault(key, []).append(output)
            same_reply &= output.outputs[0].token_ids == kept.outputs[0].token_ids
            del reopened
    del llm
    ttft = {key: _median_ttft(runs) for key, runs in outputs.items()}
    recomputing = _llm(ctx, path, disk=False)
    ttft["recompute"] = recomputing.chat(messages, params).metrics.ttft_s
    reopened = _llm(ctx, path, disk=True)
    files = list(root.rglob("*.kvb"))
    per_block = reopened.engine.runner.block_payload_bytes(0)
    disk_bytes = sum(f.stat().st_size for f in files) / max(len(files), 1)
    decode = _decode_while_writing(reopened, recomputing, messages, params)
    loading = [_decode_while_loading(ctx, path, messages) for _ in range(repeats)]
    restart, opened = outputs["restart"][-1], outputs["opened"][-1]
    row = {"prompt_tokens": restart.metrics.num_prompt_tokens, "history_tokens": history,
           **{f"{key}_ttft_ms": ms(value) for key, value in ttft.items()},
           "preload_ms": ms(statistics.median(preload_s)),
           "restart_disk_tokens": restart.metrics.num_disk_tokens,
           "restart_cached_tokens": restart.metrics.num_cached_tokens,
           "opened_cached_tokens": opened.metrics.num_cached_tokens,
           "opened_disk_tokens": opened.metrics.num_disk_tokens,
           "same_reply": same_reply,
           **{f"{key}_over_open": _ratio(ttft[key], ttft["open"]) for key, _, _ in RESTARTS},
           "opened_over_recompute": _ratio(ttft["opened"], ttft["recompute"]),
           "restart_over_recompute": _ratio(ttft["restart"], ttft["recompute"]),
           "decode_while_loading_over_alone": statistics.median(r for r, _ in loading),
           "decode_steps_while_loading": statistics.median(n for _, n in loading),
           "block_files": len(files),
           "disk_over_kv_bytes": round(disk_bytes / per_block, 4)}
    return row, decode


def _median_ttft(outputs) -> float:
    return statistics.median(o.metrics.ttft_s for o in outputs)


def _ratio(a: float, b: float) -> float:
    return round(a / max(b, 1e-9), 3)


def _decode_while_loading(ctx, path: Path, messages) -> tuple[float, int]:
    """On a restarted engine: a request decoding alone for a few steps, then turn 13
    sent (its history read from disk in the background); the decode rate of the first
    request while the second waits for its blocks, over its rate alone, and the steps
    it took meanwhile."""
    engine = _llm(ctx, path, disk=True).engine
    long = SamplingParams(max_tokens=100_000, temperature=0, ignore_eos=True)
    engine.add_request("Tell me a long story about a lighthouse.", long, "running")
    while "running" not in engine.last_step_tokens:  # past its prefill
        engine.step()
    alone = _decode_rate(engine, lambda steps: steps < 16)
    engine.add_request(messages, SamplingParams(max_tokens=1, temperature=0), "reopened")
    engine.step()  # admits it: its reads start
    waiting = engine.scheduler.loading
    steps = [0]

    def loading(n: int) -> bool:  # one step at least: a short history loads at once
        steps[0] = n
        return n == 0 or bool(waiting)

    during = _decode_rate(engine, loading)
    engine.abort("running")
    while engine.has_unfinished_requests():
        engine.step()
    return round(during / max(alone, 1e-9), 3), steps[0]


def _decode_rate(engine, go_on) -> float:
    """Tokens/s of the running request over the steps while ``go_on(steps so far)``."""
    start, steps, tokens = time.perf_counter(), 0, 0
    while go_on(steps):
        engine.step()
        steps += 1
        tokens += engine.last_step_tokens.get("running", 0)
    return tokens / max(time.perf_counter() - start, 1e-9)


def _decode_while_writing(on, off, messages, params) -> float:
    """Decode tok/s of the tier-on engine while its cached blocks are being written (its
    folder cleared first, so every block is written again), over the tier-off engine's."""
    long = SamplingParams(max_tokens=max(32, 2 * params.max_tokens), temperature=0,
                          ignore_eos=True)
    on.chat(messages, params)  # the history into memory (from disk)
    on.engine.clear_disk()
    on.engine.disk.save_cached()  # queued, not waited
    writing = on.chat(messages, long).metrics.decode_tok_s
    on.engine.disk.flush()
    quiet = off.chat(messages, long).metrics.decode_tok_s
    return round(writing / max(quiet, 1e-9), 3)
