"""``folio bench WORKLOAD``: Folio's speed and memory next to transformers, on this machine.

Workloads, one module each in ``engine/bench/`` (``chat.py``, ``candidates.py``, ...), each
measured against Hugging Face transformers running the same float32 weights on the same
threads, in one run:

- ``chat``: an 8-turn chat (``--turns``); time to first token and prompt tokens computed
  per turn, for Folio, transformers recomputing the history and transformers on a cache.
- ``candidates``: n = 1, 2, 4, 8 sampled candidates for one 512-token prompt; wall time,
  tokens/s and KV bytes.
- ``decode``: single-stream decode tokens/s at contexts 128 and 2,048.
- ``concurrent``: 8 chats submitted at once to the EngineWorker.
- ``waste``: internal KV waste sampled during the chat.
- ``scheduler``: one schedule step plus the block bookkeeping with 64 running sequences,
  without a model.
- ``serve``: the OpenAI-compatible API through the openai client, 16 clients at once.
- ``reopen``: a 12-turn, ~4,000-token chat reopened after a restart, on the model and the
  synthetic 1B shape (``--reopen-sizes``): turn 13's TTFT with the history loaded from the
  KV cache's disk tier (sent at once, or after the chat was opened and loaded ahead), next
  to the app kept open and to recomputing the history; decode tok/s while blocks are
  written; disk bytes per block.
- ``documents``: a 4-page PDF read whole: the second question's, a new chat's and a new
  chat's after a restart (disk tier) TTFT over the first question's; a 60-page PDF
  searched: attach to first token with the extraction's and indexing's shares; the PDF
  readers compared (``documents.py``).
- ``memory``: peak RSS after one short chat with an 8,192-token context, each side in a
  fresh process (Folio stored, Folio float32, llama.cpp); Folio's weight bytes / GGUF bytes.
- ``8b``: a synthetic Llama-3-8B-shaped Q4_K_M file (written once into the cache): does it
  load, and decode tok/s next to llama.cpp.
- ``sizes``: synthetic 1B-, 3B- and 8B-shaped Q4_K_M files (``--sizes``), each side in a
  fresh process per size: load time, TTFT of a 512-token prompt and of a follow-up turn,
  decode tok/s and peak RSS, Folio next to llama.cpp.
- ``structured``: decode tok/s with a JSON-schema mask against without, a 20-field
  schema's mask compile time (first use, cached), and an agent's tool round trip through
  the API (its second request's cached tokens).
- ``models``: the model and the synthetic 1B shape in one ModelHost: a follow-up's TTFT
  after a turn on the other model over without the switch, and a first request to a model
  not loaded over its load time plus its TTFT.
- ``kv``: the 8- and 4-bit KV caches against the float16 cache and llama.cpp's q8_0 / q4_0
  caches (flash attention on), one run, the CPU named: bytes per token (the model and the
  1B shape), teacher-forced mean KL and greedy replies equal to float16's (the model),
  decode at 4,000 and 16,000 tokens of context and a 4,000-token prefill (the 1B shape),
  peak RSS at a 32,768-token context (the 3B shape); every target met / not met / n/a.
- ``speculative``: a code-edit chat and a free-prose chat, greedy, the same prompt ids on
  every side: Folio plain, with prompt-lookup drafts (``ngram``) and with Predicted Outputs
  (the plain reply or the prompt's code as the prediction), beside llama.cpp plain and with
  its prompt lookup; the exact prediction on the synthetic 1B / 3B shapes; decode tok/s
  (first token to last) and the drafts kept; every target met / not met / n/a.
- ``vision``: images in a chat on a SmolVLM-256M-shaped model (``vision.py``), and a
  Qwen3.5-9B-shaped tower's encode at 1,024 x 1,024 (``vision_qwen35.py``).
- ``all``: every one of the above, then the issue's targets in one table (``targets.py``);
  ``kernels``: the attention and quantized kernels (CUDA).

The table goes to stdout; ``--json PATH`` writes the results (with ``all``, the targets
table under ``"issue_targets"``), ``--plot DIR`` PNG charts.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import torch

from engine.bench.candidates import bench_candidates
from engine.bench.chat import bench_chat
from engine.bench.compare import bench_compare
from engine.bench.concurrent import bench_concurrent
from engine.bench.decode import bench_decode
from engine.bench.documents import bench_documents
from engine.bench.eight_b import bench_8b
from engine.bench.kv import bench_kv
from engine.bench.load import bench_load
from engine.bench.memory import bench_memory
from engine.bench.models import bench_models
from engine.bench.moe import bench_moe
from engine.bench.reopen import bench_reopen
from engine.bench.scheduler import bench_scheduler
from engine.bench.serve import bench_serve
from engine.bench.setup import BenchContext, BenchSettings, check_sizes
from engine.bench.sizes import bench_sizes
from engine.bench.speculative import bench_speculative
from engine.bench.structured import bench_structured
from engine.bench.targets import format_targets, llama_cpp_installed, targets_table
from engine.bench.vision import bench_vision
from engine.bench.waste import bench_waste

# Workload name -> function, in the order ``all`` runs them.
WORKLOADS: dict[str, Callable[[BenchContext], dict]] = {
    "chat": bench_chat,
    "candidates": bench_candidates,
    "decode": bench_decode,
    "concurrent": bench_concurrent,
    "waste": bench_waste,
    "scheduler": lambda ctx: bench_scheduler(),
    "serve": bench_serve,
    "reopen": bench_reopen,
    "documents": bench_documents,
    "memory": bench_memory,
    "8b": bench_8b,
    "sizes": bench_sizes,
    "structured": bench_structured,
    "moe": bench_moe,
    "models": bench_models,
    "compare": bench_compare,
    "load": bench_load,
    "kv": bench_kv,
    "speculative": bench_speculative,
    "vision": bench_vision,
}

EPILOG = """workloads:
  chat        TTFT and prompt tokens computed per turn of a multi-turn chat
  candidates  n = 1, 2, 4, 8 sampled candidates: wall time, tokens/s, KV bytes
  decode      single-stream decode tokens/s at contexts 128 and 2,048
  concurrent  8 chats at once through the EngineWorker: total tokens/s, each TTFT
  waste       internal KV waste sampled during the chat
  scheduler   one scheduling step with 64 running sequences, no model
  serve       the OpenAI API: 16 clients at once against one, TTFT across a 4-turn chat
  reopen      turn 13 of a ~4,000-token chat after a restart (the disk tier; the model
              and the 1B shape) against the app kept open and a recompute; decode
              while writing; disk bytes/block
  documents   a 4-page PDF read whole: TTFT of the next question, a new chat, a new chat
              after a restart over the first's; a 60-page PDF searched: attach to first
              token, extraction and indexing shares; the PDF readers' extraction times
  memory      peak RSS after one chat, 8,192-token context, each side in a fresh process
  8b          synthetic 8B Q4_K_M (written once to the cache): loads? decode tok/s
  sizes       synthetic 1B / 3B / 8B Q4_K_M (--sizes 1b,3b,8b), a fresh process per side:
              load, TTFT (512-token prompt, follow-up turn), decode tok/s, peak RSS
  structured  decode tok/s with a JSON-schema mask / without, mask compile time (first
              use, cached), a tool round trip's cached tokens through the API
  moe         synthetic OLMoE-1B-7B Q4_K_M (64 experts, 8 per token), as sizes, the best
              of two fresh-process runs per side
  models      several models in one process (the model and the 1B shape): a follow-up
              on A after a turn on B / without the switch (TTFT); a first request to a
              model not loaded / its load time + its TTFT
  compare     a chat compared across two models in one ModelHost: computed prompt
              tokens per model on turns 2-8 over the turn's new tokens
  load        synthetic 1B / 3B Q4_K_M, a fresh process per load, import included:
              Folio's first load (cache written) and later loads against llama.cpp's
              (its interpreter: FOLIO_BENCH_LLAMA_PYTHON)
  kv          8- and 4-bit KV caches against float16 and llama.cpp q8_0 / q4_0 (flash
              attention): bytes/token, KL and greedy agreement (the model), decode at
              4,000 / 16,000 tokens and prefill (1B shape), peak RSS at 32,768 (3B shape)
  speculative a code-edit and a free-prose chat, same prompt ids on every side: Folio
              plain / ngram drafts / Predicted Outputs (the exact reply, the prompt's
              code) against llama.cpp plain and prompt lookup (FOLIO_BENCH_LLAMA_PYTHON);
              the exact prediction on the 1B / 3B shapes (--sizes); drafts kept
  vision      a SmolVLM-256M-shaped model (random weights): tower encode time against
              transformers, a follow-up's TTFT with an image in the chat / without,
              the same image in a new chat (tokens cached, encoder runs); a
              Qwen3.5-shaped tower's encode at 1,024 x 1,024 against transformers
  all         all of the above, then the issue's targets table
  kernels     the attention and quantized kernels (CUDA only)
llama.cpp joins chat, decode, memory, 8b, sizes, moe, kv and speculative when
llama-cpp-python is installed (pip install -e '.[bench]');
--plot needs matplotlib (pip install 'folio[plot]')."""

WORKLOAD_NAMES = tuple(WORKLOADS)


def run(names: list[str], settings: BenchSettings,
        report: Callable[[dict], None] | None = None) -> dict[str, dict]:
    """Run the named workloads in order; ``report`` hears each result as it is done."""
    unknown = [name for name in names if name not in WORKLOAD_NAMES]
    if unknown:
        raise ValueError(f"workload must be one of {WORKLOAD_NAMES}, got {unknown}")
    threads_before = torch.get_num_threads()
    ctx = BenchContext.create(settings)  # sets torch's thread count for both sides
    results = {}
    try:
        for name in names:
            results[name] = WORKLOADS[name](ctx)
            if report is not None:
                report(results[name])
    finally:
        torch.set_num_threads(threads_before)
    return results


# ------------------------------------------------------------------------------ output
def parse_sizes(text: str) -> tuple[str, ...]:
    """``--sizes 1b,3b``: the names, checked against ``synthetic.SIZES``."""
    sizes = tuple(part.strip().lower() for part in text.split(",") if part.strip())
    try:
        check_sizes(sizes)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return sizes


def parse_sizes_or_none(text: str) -> tuple[str, ...]:
    """``--reopen-sizes``: as ``--sizes``, or 'none' for no synthetic size."""
    return () if text.strip().lower() == "none" else parse_sizes(text)


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def format_table(rows: list[dict]) -> str:
    """Rows of dicts as aligned columns (the union of their keys, first-seen order)."""
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    cells = [[_cell(row.get(col, "")) for col in columns] for row in rows]
    widths = [max([len(col)] + [len(line[i]) for line in cells]) for i, col in
              enumerate(columns)]
    lines = ["  ".join(col.rjust(w) for col, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True))
              for line in cells]
    return "\n".join(lines)


def format_result(result: dict) -> str:
    setup = result["setup"]
    head = f"== {result['workload']}"
    if setup.get("model") != "none":
        head += f" ({setup['model']}, {setup['threads']} threads, {setup['dtype']})"
    lines = [head + " =="]
    group = result.get("group_rows_by")
    if group:  # a table per value of that column (sizes: one per size)
        for value in dict.fromkeys(row[group] for row in result["rows"]):
            lines.append(f"-- {group} {value} --")
            lines.append(format_table([{k: v for k, v in row.items() if k != group}
                                       for row in result["rows"] if row[group] == value]))
    else:
        lines.append(format_table(result["rows"]))
    for key, value in result["summary"].items():
        if isinstance(value, list):  # series are for JSON and charts, not the terminal
            continue
        lines.append(f"{key}: {value}")
    for target in result["targets"]:
        verdict = "met" if target["met"] else "NOT met"
        lines.append(f"target: {target['name']} = {target['value']:g} "
                     f"(want {target['op']} {target['limit']:g}): {verdict}")
    lines += [f"note: {note}" for note in result["notes"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="folio bench", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Folio's speed and memory next to transformers on the same weights.")
    parser.add_argument("workload", choices=[*WORKLOAD_NAMES, "all", "kernels"])
    parser.add_argument("--model", default="starter",
                        help="'starter', a model folder or a .gguf file")
    parser.add_argument("--turns", type=int, default=8, help="chat turns (chat, waste)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for every side (default: torch's)")
    parser.add_argument("--kv-blocks", type=int, default=None,
                        help="Folio's KV pool in blocks (default: the engine's memory budget)")
    parser.add_argument("--weights", choices=("stored", "float32"), default="stored",
                        help="Folio's weights: kept quantized (stored) or float32")
    parser.add_argument("--cpu-activation-bits", type=int, choices=(8, 16), default=16,
                        help="Folio's quantized CPU products: 16 (the default) or 8 "
                             "(llama.cpp's arithmetic); the memory and 8b sides keep 16")
    parser.add_argument("--sizes", type=parse_sizes, default=None, metavar="1b,3b,8b",
                        help="sizes (and all): the synthetic sizes to run, comma-separated "
                             "(default: all three)")
    parser.add_argument("--reopen-sizes", type=parse_sizes_or_none, default=None,
                        metavar="1b", help="reopen: the synthetic sizes to run after the "
                        "model, comma-separated, or 'none' (default: 1b)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--plot", metavar="DIR", help="also write PNG charts into DIR")
    args, rest = parser.parse_known_args(argv)
    if args.workload == "kernels":
        from kernels.bench import main as kernels_main

        return kernels_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        sizes = {"sizes": args.sizes} if args.sizes else {}
        if args.reopen_sizes is not None:
            sizes["reopen_sizes"] = args.reopen_sizes
        settings = BenchSettings(model=args.model, threads=args.threads, turns=args.turns,
                                 kv_blocks=args.kv_blocks, weights=args.weights,
                                 cpu_activation_bits=args.cpu_activation_bits, **sizes)
    except ValueError as exc:
        parser.error(str(exc))
    names = list(WORKLOAD_NAMES) if args.workload == "all" else [args.workload]
    results = run(names, settings, report=lambda r: print(format_result(r) + "\n",
                                                           flush=True))
    output: dict = dict(results)
    if args.workload == "all":
        table = targets_table(results, llama_cpp_installed())
        print(format_targets(table), flush=True)
        output["issue_targets"] = table
    if args.json:
        with open(args.json, "w") as f:
            json.dump(output, f, indent=2)
    if args.plot:
        from engine.bench.plot import plot_results

        try:
            written = plot_results(results, args.plot)
        except ImportError:
            print("charts skipped: matplotlib is not installed (pip install 'folio[plot]')")
        else:
            for path in written:
                print(f"chart: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
