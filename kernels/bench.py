"""`folio bench kernels`: achieved memory bandwidth of paged decode attention (CUDA).

Decode attention is bound by reading K and V, so each kernel is scored as K/V bytes
read per second and as a share of the device's peak bandwidth. The L2 cache is flushed
(a 256 MB write) before every timed run so no run reads K/V left over from the last one.
Baselines: torch SDPA over contiguous K/V, and FlashInfer's or flash-attn's paged decode
when they import. With --window W (default Gemma 2's 4096; 0: off) a context longer than
the window also gets a "triton-wW" cell: the sliding-window decode, scored by the
window's K/V bytes, which is all it reads. With --kv FORMATS (e.g. int8,fp8: quantized
pools, kernels/kv_format.py) each format gets a "triton-<format>" cell: the same decode
over that format's pool of the same K/V, scored by the quantized bytes it reads (codes
and scales).

A second table (--quant, default Q4_K,Q6_K; "" skips it) times quant_matmul, the matmul
reading GGUF-quantized weights, at Llama-3-8B's projection shapes and batch 1: decode
is bound by reading the weight, so it is scored as quantized weight bytes per second.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels.interface import AttentionMetadata
from kernels.kv_format import KV_FORMAT_NAMES, format_named
from kernels.quant.formats import BY_NAME

# Peak HBM/GDDR bandwidth in GB/s by a substring of torch.cuda.get_device_name(),
# the more specific names first.
PEAK_GBPS = (
    ("H200", 4800.0), ("H100 PCIe", 2000.0), ("H100 NVL", 3900.0), ("H100", 3350.0),
    ("H800", 3350.0), ("GH200", 4000.0), ("A100-SXM4-80GB", 2039.0), ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0), ("A800", 2039.0), ("L40S", 864.0), ("L40", 864.0), ("L4", 300.0),
    ("A10G", 600.0), ("A10", 600.0), ("RTX 4090", 1008.0), ("RTX 3090", 936.0),
    ("RTX 6000 Ada", 960.0), ("V100", 900.0), ("T4", 320.0),
)
FLUSH_BYTES = 256 * 1024**2


@dataclass(slots=True)
class Shape:
    name: str
    num_q_heads: int
    num_kv_heads: int
    head_size: int


SHAPES = {
    "llama8b": Shape("llama-8B", 32, 8, 128),
    "starter": Shape("starter (SmolLM2-135M)", 9, 3, 64),
}


def peak_bandwidth_gbps(device: torch.device) -> tuple[float, str]:
    name = torch.cuda.get_device_name(device)
    for key, gbps in PEAK_GBPS:
        if key in name:
            return gbps, f"{name}: {gbps:.0f} GB/s (spec sheet)"
    # Unknown device: a large device-to-device copy reads and writes every byte once.
    src = torch.empty(1024**3, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = [_time_once(lambda: dst.copy_(src), None) for _ in range(5)]
    gbps = 2 * src.numel() / statistics.median(times) / 1e9
    return gbps, f"{name}: {gbps:.0f} GB/s (measured copy)"


def _time_once(fn: Callable[[], object], flush: torch.Tensor | None) -> float:
    if flush is not None:
        flush.zero_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def time_median(fn: Callable[[], object], flush: torch.Tensor, reps: int) -> float:
    for _ in range(3):  # compile / autotune / allocator warm-up
        fn()
    return statistics.median(_time_once(fn, flush) for _ in range(reps))


def _paged_inputs(shape: Shape, batch: int, context: int, block_size: int,
                  dtype: torch.dtype, device: torch.device):
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    cache_shape = (num_blocks, block_size, shape.num_kv_heads, shape.head_size)
    k_cache = torch.randn(cache_shape, dtype=dtype, device=device)
    v_cache = torch.randn(cache_shape, dtype=dtype, device=device)
    # Shuffled physical blocks, as a long-running pool ends up.
    tables = torch.randperm(num_blocks, device=device).to(torch.int32).view(batch, -1)
    query = torch.randn((batch, shape.num_q_heads, shape.head_size), dtype=dtype, device=device)
    meta = AttentionMetadata(
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=device),
        seq_lens=torch.full((batch,), context, dtype=torch.int32, device=device),
        block_tables=tables, slot_mapping=torch.full((batch,), -1, device=device),
        max_query_len=1, max_seq_len=context,
    )
    return query, k_cache, v_cache, meta


def _sdpa_runner(query, k_cache, v_cache, meta, shape: Shape, context: int):
    batch = query.shape[0]
    # The same K/V gathered into contiguous [batch, nkv, context, hd] tensors.
    flat = meta.block_tables.long().view(-1)
    k = k_cache[flat].view(batch, -1, shape.num_kv_heads, shape.head_size)[:, :context]
    v = v_cache[flat].view(batch, -1, shape.num_kv_heads, shape.head_size)[:, :context]
    k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    q = query.unsqueeze(2)
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def _flashinfer_runner(query, k_cache, v_cache, meta, shape: Shape, context: int):
    import flashinfer

    batch, block_size = query.shape[0], k_cache.shape[1]
    device = query.device
    workspace = torch.empty(128 * 1024**2, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    blocks = meta.block_tables.shape[1]
    indptr = torch.arange(batch + 1, dtype=torch.int32, device=device) * blocks
    last = torch.full((batch,), context - (blocks - 1) * block_size, dtype=torch.int32,
                      device=device)
    wrapper.plan(indptr, meta.block_tables.reshape(-1), last, shape.num_q_heads,
                 shape.num_kv_heads, shape.head_size, block_size, pos_encoding_mode="NONE",
                 q_data_type=query.dtype, kv_data_type=k_cache.dtype)
    return lambda: wrapper.run(query, (k_cache, v_cache))


def _flash_attn_runner(query, k_cache, v_cache, meta, shape: Shape, context: int):
    from flash_attn import flash_attn_with_kvcache

    # flash-attn's paged KV wants pages of a multiple of 256 tokens: re-page the pool.
    page = 256
    batch = query.shape[0]
    flat = meta.block_tables.long().view(-1)
    pages = -(-context // page)
    pad = pages * page
    k = k_cache[flat].view(batch, -1, shape.num_kv_heads, shape.head_size)[:, :context]
    v = v_cache[flat].view(batch, -1, shape.num_kv_heads, shape.head_size)[:, :context]
    k = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad - context)).reshape(
        batch * pages, page, shape.num_kv_heads, shape.head_size)
    v = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad - context)).reshape(
        batch * pages, page, shape.num_kv_heads, shape.head_size)
    table = torch.randperm(batch * pages, device=query.device).to(torch.int32).view(batch, -1)
    k, v = k[torch.argsort(table.view(-1).long())], v[torch.argsort(table.view(-1).long())]
    q = query.unsqueeze(1)
    lens = meta.seq_lens
    return lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table)


def _bench_config(shape: Shape, batch: int, context: int, args, flush, peak: float) -> None:
    from kernels.triton.decode import choose_num_splits, paged_decode

    device = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    elem = torch.finfo(dtype).bits // 8
    kv_bytes = 2 * batch * context * shape.num_kv_heads * shape.head_size * elem
    # The paged pool, a baseline's copy of it, and the transient gathers building that.
    free, _ = torch.cuda.mem_get_info(device)
    if 4 * kv_bytes > free:
        print(f"{shape.name:24} {batch:>5} {context:>7}  skipped: "
              f"{4 * kv_bytes / 1e9:.1f} GB needed, {free / 1e9:.1f} GB free")
        return
    query, k_cache, v_cache, meta = _paged_inputs(shape, batch, context, args.block_size,
                                                  dtype, device)
    scale = shape.head_size**-0.5
    splits = choose_num_splits(batch, shape.num_kv_heads, context, device)
    builders = [
        ("triton", lambda *_: lambda: paged_decode(query, k_cache, v_cache, meta, scale)),
        ("sdpa", _sdpa_runner), ("flashinfer", _flashinfer_runner),
        ("flash-attn", _flash_attn_runner),
    ]
    window = args.window
    if 0 < window < context:
        builders.insert(1, (f"triton-w{window}", lambda *_: lambda: paged_decode(
            query, k_cache, v_cache, meta, scale, sliding_window=window)))
    for position, name in enumerate(args.kv_formats, start=1):
        builders.insert(position, (f"triton-{name}", _quantized_runner(name, scale)))
    cells = []
    # One runner at a time: each baseline's own copy of K/V is freed before the next.
    for name, build in builders:
        try:
            fn = build(query, k_cache, v_cache, meta, shape, context)
        except Exception as exc:  # a missing or incompatible library: report, go on
            cells.append(f"{name}: n/a ({type(exc).__name__})")
            continue
        try:
            seconds = time_median(fn, flush, args.reps)
        except Exception as exc:
            cells.append(f"{name}: failed ({type(exc).__name__}: {str(exc)[:60]})")
            continue
        finally:
            del fn
            torch.cuda.empty_cache()
        read = kv_bytes * window // context if name.startswith("triton-w") else kv_bytes
        if name.removeprefix("triton-") in args.kv_formats:
            fmt = format_named(name.removeprefix("triton-"))
            read = kv_bytes // (shape.head_size * elem) * fmt.row_bytes(shape.head_size)
        gbps = read / seconds / 1e9
        cells.append(f"{name}: {seconds * 1e6:8.1f} us {gbps:7.0f} GB/s {100 * gbps / peak:5.1f}%")
    print(f"{shape.name:24} {batch:>5} {context:>7} {splits:>6}  " + " | ".join(cells), flush=True)


def _quantized_runner(name: str, scale: float):
    """A builder of the decode over the K/V pools encoded in the format named `name`
    (the runner holds them, so they are freed with it). An int4 pool is timed without
    the backend's query and output rotations: the kernel is what reads the pool."""
    from kernels.triton.decode import paged_decode

    def build(query, k_cache, v_cache, meta, shape: Shape, context: int):
        fmt = format_named(name)
        # int8's and int4's keys a block at a time: --block-size at least the format's
        # min_block_size (64 for an int8 column, 32 for int4).
        k_pool, v_pool = fmt.encode_keys(k_cache), fmt.encode(v_cache)
        return lambda: paged_decode(query, k_pool, v_pool, meta, scale)

    return build


# Llama-3-8B's matmuls as (name, N, K).
QUANT_SHAPES = (
    ("q/o proj", 4096, 4096), ("k/v proj", 1024, 4096), ("gate/up", 14336, 4096),
    ("down", 4096, 14336), ("lm head", 128256, 4096),
)
NEEDS_CUDA = ("folio bench kernels needs a CUDA GPU: the Triton kernels only run compiled "
              "there (on CPU they run under TRITON_INTERPRET=1 in the tests).")


def bench_quant_matmul(type_names: tuple[str, ...] = ("Q4_K", "Q6_K"), reps: int = 20,
                       dtype: torch.dtype = torch.bfloat16, flush: torch.Tensor | None = None,
                       peak: float | None = None) -> int:
    """Prints quant_matmul's time and weight bandwidth at batch 1 per type and shape;
    returns 2 (after saying why) without CUDA."""
    unknown = [t for t in type_names if t not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown quant types {unknown}; choose from {', '.join(BY_NAME)}")
    if not torch.cuda.is_available():
        print(NEEDS_CUDA, file=sys.stderr)
        return 2
    from kernels.triton.quant_matmul import quant_matmul

    device = torch.device("cuda")
    if peak is None:
        peak, source = peak_bandwidth_gbps(device)
        print(f"peak bandwidth: {source}")
    if flush is None:
        flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    print(f"quant_matmul, batch 1, {dtype}: quantized weight bytes read per second, "
          f"median of {reps}, L2 flushed before each run")
    print(f"{'type':5} {'matmul':9} {'N':>6} {'K':>6} {'MB':>7} {'us':>8} {'GB/s':>6} {'peak':>6}")
    for name in type_names:
        fmt = BY_NAME[name]
        for label, n, k in QUANT_SHAPES:
            # Random bytes time like real blocks: the kernel never branches on values.
            qweight = torch.randint(0, 256, (n, fmt.row_bytes(k)), dtype=torch.uint8,
                                    device=device)
            x = torch.randn((1, k), dtype=dtype, device=device)
            run = functools.partial(quant_matmul, x, qweight, fmt.type_id, n, k)
            seconds = time_median(run, flush, reps)
            gbps = qweight.numel() / seconds / 1e9
            print(f"{name:5} {label:9} {n:>6} {k:>6} {qweight.numel() / 1e6:7.1f} "
                  f"{seconds * 1e6:8.1f} {gbps:6.0f} {100 * gbps / peak:5.1f}%", flush=True)
            del run, qweight  # the next shape's weight may need the room
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="folio bench kernels", description=__doc__)
    parser.add_argument("--shapes", default="llama8b,starter",
                        help=f"comma-separated, from {', '.join(SHAPES)} (\"\": none)")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--contexts", default="512,4096,32768")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--window", type=int, default=4096,
                        help="sliding window of the extra triton-wW cell (0: none)")
    parser.add_argument("--kv", default="",
                        help="quantized KV formats of extra triton-<format> cells "
                             "(comma-separated, from int8, fp8, int4; \"\": none)")
    parser.add_argument("--quant", default="Q4_K,Q6_K",
                        help="GGUF types of the quant_matmul table (\"\": no table)")
    args = parser.parse_args(argv)
    unknown = [s for s in args.shapes.split(",") if s and s not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; choose from {', '.join(SHAPES)}")
    if args.reps < 1 or args.block_size < 1:
        parser.error("--reps and --block-size must be >= 1")
    if args.window < 0:
        parser.error("--window must be >= 0")
    args.kv_formats = tuple(f for f in args.kv.split(",") if f)
    quantized = [n for n in KV_FORMAT_NAMES if format_named(n).quantized]
    if any(f not in quantized for f in args.kv_formats):
        parser.error(f"unknown --kv formats; choose from {', '.join(quantized)}")
    args.quant_types = tuple(t for t in args.quant.split(",") if t)
    if any(t not in BY_NAME for t in args.quant_types):
        parser.error(f"unknown --quant types; choose from {', '.join(BY_NAME)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(NEEDS_CUDA, file=sys.stderr)
        return 2
    device = torch.device("cuda")
    peak, source = peak_bandwidth_gbps(device)
    print(f"peak bandwidth: {source}")
    print(f"K/V bytes read per second; {args.dtype}, block size {args.block_size}, "
          f"median of {args.reps}, L2 flushed before each run")
    print(f"{'shape':24} {'batch':>5} {'context':>7} {'splits':>6}  kernels")
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    for key in filter(None, args.shapes.split(",")):  # --shapes "": quant table only
        for batch in (int(b) for b in args.batches.split(",")):
            for context in (int(c) for c in args.contexts.split(",")):
                _bench_config(SHAPES[key], batch, context, args, flush, peak)
    if args.quant_types:
        print()
        bench_quant_matmul(args.quant_types, args.reps, getattr(torch, args.dtype), flush, peak)
    return 0


if __name__ == "__main__":
    sys.exit(main())
