"""The native CPU attention over quantized KV pools against float16, in one run: a decode
step's attention ops (every layer's own pool, so K/V stream from memory as in a step) at
4,000 and 16,000 tokens of context, and a 4,000-token prefill chunked 512 at a time (one
layer: each chunk's KV write and attention), for a Llama-3.2-1B shape (16 layers, 32 query
heads, 8 KV heads, head size 64). Pools of the given dtypes alternate step by step (chunk
by chunk); each figure is the best of its rounds (a prefill the sum of its chunks' best).
Random K/V: timings only. On a shared, busy machine `--threads 1 --clock cpu` counts the
thread's own CPU time (time.thread_time), which other processes' load does not inflate.

    python scripts/bench_kv_attention_cpu.py --threads 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's Folio

from kernels import AttentionMetadata, allocate_kv_cache  # noqa: E402
from kernels.cpu.attention import CpuBackend  # noqa: E402
from kernels.kv_format import format_named  # noqa: E402

LAYERS, NQ, NKV, HD, BLOCK = 16, 32, 8, 64, 16
clock = time.perf_counter  # --clock cpu: time.thread_time


def filled_pool(fmt, layers: int, tokens: int, gen: torch.Generator) -> torch.Tensor:
    """[layers, 2, blocks, 16, nkv, row] head-major, every slot holding random K/V."""
    blocks = -(-tokens // BLOCK)
    pool = allocate_kv_cache(layers, blocks, BLOCK, NKV, HD, fmt.storage, "cpu", True)
    for layer in range(layers):
        for kv in range(2):
            rows = torch.randn(blocks, BLOCK, NKV, HD, generator=gen)
            pool[layer, kv].copy_(fmt.encode(rows))
    return pool


def meta_for(context: int, q_len: int) -> AttentionMetadata:
    blocks = -(-context // BLOCK)
    return AttentionMetadata(
        query_start_loc=torch.tensor([0, q_len], dtype=torch.int32),
        seq_lens=torch.tensor([context], dtype=torch.int32),
        block_tables=torch.arange(blocks, dtype=torch.int32)[None],
        slot_mapping=torch.arange(context - q_len, context, dtype=torch.int64),
        max_query_len=q_len, max_seq_len=context)


def decode_step(backend, pool, meta, query) -> float:
    start = clock()
    for layer in range(pool.shape[0]):
        backend.attention(query, pool[layer, 0], pool[layer, 1], meta, HD**-0.5)
    return clock() - start


def prefill(backend, pools, tokens: int, chunk: int, rounds: int,
            gen: torch.Generator) -> dict[str, float]:
    """One layer's KV writes and attention over the chunks of a `tokens` prompt, per pool:
    each chunk timed `rounds` times, the pools alternating chunk by chunk (a busy machine
    slows a stretch of time, not a dtype), the best of each chunk summed."""
    totals = dict.fromkeys(pools, 0.0)
    for begin in range(0, tokens, chunk):
        n = min(chunk, tokens - begin)
        meta = meta_for(begin + n, n)
        query = torch.randn(n, NQ, HD, generator=gen)
        key, value = torch.randn(2, n, NKV, HD, generator=gen)
        best = dict.fromkeys(pools, float("inf"))
        for _ in range(rounds):
            for name, pool in pools.items():
                start = clock()
                backend.write_kv(key, value, pool[0, 0], pool[0, 1], meta.slot_mapping)
                backend.attention(query, pool[0, 0], pool[0, 1], meta, HD**-0.5)
                best[name] = min(best[name], clock() - start)
        for name in pools:
            totals[name] += best[name]
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtypes", default="float16,int8,int4")
    parser.add_argument("--contexts", default="4000,16000")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    if args.clock == "cpu":
        if args.threads != 1:
            parser.error("--clock cpu counts the calling thread only: use --threads 1")
        global clock
        clock = time.thread_time
    torch.set_num_threads(args.threads)
    backend = CpuBackend()
    gen = torch.Generator().manual_seed(0)
    fmts = [format_named(name) for name in args.dtypes.split(",")]
    query = torch.randn(1, NQ, HD, generator=gen)
    results: dict[tuple[str, str], float] = {}
    for context in (int(c) for c in args.contexts.split(",")):
        pools = {fmt.name: filled_pool(fmt, LAYERS, context, gen) for fmt in fmts}
        meta = meta_for(context, 1)
        for _ in range(3 * args.rounds):  # step by step, the pools alternating
            for fmt in fmts:
                t = decode_step(backend, pools[fmt.name], meta, query)
                key = (f"decode {context}", fmt.name)
                results[key] = min(results.get(key, float("inf")), t)
        del pools
    prefill_tokens = 4000
    pools = {fmt.name: filled_pool(fmt, 1, prefill_tokens, gen) for fmt in fmts}
    totals = prefill(backend, pools, prefill_tokens, 512, max(2, args.rounds // 2), gen)
    for name, t in totals.items():
        results[("prefill 4000 / 512", name)] = t
    print(f"{torch.get_num_threads()} threads, ISA {torch.ops.folio_cpu.isa()}, {args.clock} "
          "clock; best of rounds, "
          "ms (decode: 16 layers' attention ops; prefill: one layer's writes + attention)")
    for case in dict.fromkeys(k[0] for k in results):
        base = results.get((case, "float16"))
        cells = []
        for fmt in fmts:
            t = results[(case, fmt.name)]
            ratio = f" (f16/{fmt.name} {base / t:.2f}x)" if base and fmt.name != "float16" else ""
            cells.append(f"{fmt.name} {t * 1e3:.2f}{ratio}")
        print(f"{case:>20}: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
