"""The native CPU attention over quantized KV pools against float16, in one run: a decode
step's attention ops (every layer's own pool, so K/V stream from memory as in a step) at
4,000 and 16,000 tokens of context, and a 4,000-token prefill chunked 512 at a time (one
layer: each chunk's KV write and attention), for a Llama-3.2-1B shape (16 layers, 32 query
heads, 8 KV heads, head size 64), at each of the given block sizes (int8 and int4 from their
smallest, KVFormat.min_block_size: their keys are encoded a block at a time).
Pools of the given dtypes and block sizes alternate step by step (chunk by chunk); each
figure is the best of its rounds (a prefill the sum of its chunks' best).
Random K/V: timings only. On a shared, busy machine `--threads 1 --clock cpu` counts the
thread's own CPU time (time.thread_time), which other processes' load does not inflate.

    python scripts/bench_kv_attention_cpu.py --threads 2
    python scripts/bench_kv_attention_cpu.py --block-sizes 16,32,64 --no-prefill
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
from kernels.key_stage import KeyStage  # noqa: E402
from kernels.kv_format import format_named  # noqa: E402

LAYERS, NQ, NKV, HD = 16, 32, 8, 64
clock = time.perf_counter  # --clock cpu: time.thread_time


def filled_pool(fmt, layers: int, tokens: int, block: int, gen: torch.Generator
                ) -> torch.Tensor:
    """[layers, 2, blocks, block, nkv, row] head-major, every slot holding random K/V."""
    blocks = -(-tokens // block)
    pool = allocate_kv_cache(layers, blocks, block, NKV, HD, fmt.storage, "cpu", True)
    for layer in range(layers):
        keys, values = torch.randn(2, blocks, block, NKV, HD, generator=gen)
        pool[layer, 0].copy_(fmt.encode_keys(keys))
        pool[layer, 1].copy_(fmt.encode(values))
    return pool


def meta_for(context: int, q_len: int, block: int) -> AttentionMetadata:
    blocks = -(-context // block)
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
    """One layer's KV writes and attention over the chunks of a `tokens` prompt, per pool
    (an int8 or int4 pool's keys written a block at a time through a key stage, as the
    engine's are):
    each chunk timed `rounds` times, the pools alternating chunk by chunk (a busy machine
    slows a stretch of time, not a dtype), the best of each chunk summed."""
    totals = dict.fromkeys(pools, 0.0)
    for begin in range(0, tokens, chunk):
        n = min(chunk, tokens - begin)
        query = torch.randn(n, NQ, HD, generator=gen)
        key, value = torch.randn(2, n, NKV, HD, generator=gen)
        best = dict.fromkeys(pools, float("inf"))
        for _ in range(rounds):
            for label, pool in pools.items():
                meta = meta_for(begin + n, n, pool.shape[3])
                start = clock()
                backend.write_kv(key, value, pool[0, 0], pool[0, 1], meta.slot_mapping)
                backend.attention(query, pool[0, 0], pool[0, 1], meta, HD**-0.5)
                best[label] = min(best[label], clock() - start)
        for label in pools:
            totals[label] += best[label]
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtypes", default="float16,int8,int4")
    parser.add_argument("--block-sizes", default="16")
    parser.add_argument("--contexts", default="4000,16000")
    parser.add_argument("--no-prefill", action="store_true")
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
    # (label, format, block size): int8 and int4 below their smallest block at it.
    kinds = {}
    for name in args.dtypes.split(","):
        fmt = format_named(name)
        for bs in (int(b) for b in args.block_sizes.split(",")):
            bs = max(bs, fmt.min_block_size)
            kinds[f"{name}/{bs}"] = (fmt, bs)
    query = torch.randn(1, NQ, HD, generator=gen)
    results: dict[tuple[str, str], float] = {}
    for context in (int(c) for c in args.contexts.split(",")):
        pools = {label: filled_pool(fmt, LAYERS, context, bs, gen)
                 for label, (fmt, bs) in kinds.items()}
        metas = {label: meta_for(context, 1, bs) for label, (_, bs) in kinds.items()}
        for _ in range(3 * args.rounds):  # step by step, the pools alternating
            for label in kinds:
                t = decode_step(backend, pools[label], metas[label], query)
                key = (f"decode {context}", label)
                results[key] = min(results.get(key, float("inf")), t)
        del pools
    if not args.no_prefill:
        prefill_tokens = 4000
        pools = {label: filled_pool(fmt, 1, prefill_tokens, bs, gen)
                 for label, (fmt, bs) in kinds.items()}
        for label, pool in pools.items():
            if kinds[label][0].keys_by_block:
                backend.key_stages.attach(KeyStage(pool, 1))
        totals = prefill(backend, pools, prefill_tokens, 512, max(2, args.rounds // 2), gen)
        for label, t in totals.items():
            results[("prefill 4000 / 512", label)] = t
    print(f"{torch.get_num_threads()} threads, ISA {torch.ops.folio_cpu.isa()}, {args.clock} "
          "clock; best of rounds, "
          "ms (decode: 16 layers' attention ops; prefill: one layer's writes + attention); "
          "dtype/block size")
    for case in dict.fromkeys(k[0] for k in results):
        base = results.get((case, "float16/16"))
        cells = []
        for label in kinds:
            t = results[(case, label)]
            ratio = f" ({base / t:.2f}x f16/16)" if base and label != "float16/16" else ""
            cells.append(f"{label} {t * 1e3:.2f}{ratio}")
        print(f"{case:>20}: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
