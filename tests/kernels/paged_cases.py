"""Random paged-attention batches for the Triton kernel tests, and their oracle.

A case is a paged K/V pool filled with random values, block tables pointing into it
(shuffled, or with physical blocks shared between sequences), and the metadata of one
step. The oracle is the PyTorch reference backend, which gathers through the same
block tables.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy
import torch

from kernels import AttentionMetadata, allocate_kv_cache
from kernels.reference.backend import TorchBackend

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# bf16 runs compiled on CUDA only: the interpreter's numpy has no bfloat16 matmul.
DTYPES = [torch.float32] + ([torch.bfloat16] if torch.cuda.is_available() else [])
# fp32 allows for another summation order (GPU reductions); a wrong mask or merge is off
# by 1e-1 or more.
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2)}


@dataclass(slots=True)
class PagedCase:
    query: torch.Tensor  # [num_tokens, nq, hd]
    k_cache: torch.Tensor  # [num_blocks, block_size, nkv, hd]
    v_cache: torch.Tensor
    meta: AttentionMetadata
    scale: float


def build_tables(seq_lens: list[int], block_size: int, num_blocks: int,
                 shared_prefix_blocks: dict[int, tuple[int, int]] | None,
                 generator: torch.Generator) -> torch.Tensor:
    """Block tables over shuffled physical blocks. shared_prefix_blocks maps a sequence to
    (earlier sequence, n): its first n blocks are that sequence's first n blocks."""
    shared = shared_prefix_blocks or {}
    counts = [-(-length // block_size) for length in seq_lens]
    free = torch.randperm(num_blocks, generator=generator).tolist()
    tables = torch.zeros((len(seq_lens), max(counts)), dtype=torch.int32)
    for i, count in enumerate(counts):
        source, n = shared.get(i, (i, 0))
        assert source < i and n <= min(count, counts[source]) or n == 0
        tables[i, :n] = tables[source, :n]
        for j in range(n, count):
            tables[i, j] = free.pop()
    return tables


def make_case(seq_lens: list[int], q_lens: list[int], *, num_kv_heads: int, group: int,
              head_size: int, block_size: int, dtype: torch.dtype = torch.float32,
              shared: dict[int, tuple[int, int]] | None = None, spare_blocks: int = 7,
              seed: int = 0, consecutive: bool = False, head_major: bool = False) -> PagedCase:
    """q_lens[i] new tokens at the end of a context of seq_lens[i] tokens.

    consecutive: each sequence's blocks are consecutive ids (the reference reads them in
    place); head_major: the pool in allocate_kv_cache's head-major memory order."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + spare_blocks
    tables = build_tables(seq_lens, block_size, num_blocks, shared, gen)
    if consecutive:
        assert not shared
        counts = [-(-n // block_size) for n in seq_lens]
        for i, count in enumerate(counts):
            first = spare_blocks // 2 + sum(counts[:i])
            tables[i, :count] = torch.arange(first, first + count, dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    k_cache = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    v_cache = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    if head_major:
        pools = allocate_kv_cache(1, num_blocks, block_size, num_kv_heads, head_size, dtype,
                                  DEVICE, head_major=True)[0]
        k_cache, v_cache = pools[0].copy_(k_cache), pools[1].copy_(v_cache)
    num_tokens = sum(q_lens)
    num_q_heads = num_kv_heads * group
    # As the attention layer passes it: a view of the fused q/k/v projection output.
    fused = torch.randn((num_tokens, num_q_heads + 2 * num_kv_heads, head_size), generator=gen)
    query = fused.to(DEVICE, dtype)[:, :num_q_heads]
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(q_lens).cumsum(0)
    meta = AttentionMetadata(
        query_start_loc=qsl.to(DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=tables.to(DEVICE),
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=DEVICE),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
    )
    return PagedCase(query, k_cache, v_cache, meta, head_size**-0.5)


def reference_attention(case: PagedCase, sliding_window: int | None = None,
                        logit_softcap: float | None = None,
                        sinks: torch.Tensor | None = None) -> torch.Tensor:
    return TorchBackend().attention(case.query, case.k_cache, case.v_cache, case.meta,
                                    case.scale, sliding_window=sliding_window,
                                    logit_softcap=logit_softcap, sinks=sinks)


def naive_attention(case: PagedCase, sliding_window: int | None = None,
                    logit_softcap: float | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The oracle of the options, in float64, one sequence at a time: K/V gathered token by
    token through the block table, the full [q_len, seq_len] score matrix, scale, then
    c * tanh(score / c), then an explicit mask (causal; with a window W, key k is seen by
    the query at position p iff p - W < k <= p, as transformers' sliding_window_overlay),
    then softmax; with sinks [nq], each head's sink logit appended to its scores as one
    more column before the softmax and that column dropped after it."""
    meta, block_size = case.meta, case.k_cache.shape[1]
    starts = meta.query_start_loc.tolist()
    outs = []
    for i, seq_len in enumerate(meta.seq_lens.tolist()):
        q_len = starts[i + 1] - starts[i]
        positions = torch.arange(seq_len, device=case.query.device)
        blocks = meta.block_tables[i].long()[positions // block_size]
        k = case.k_cache[blocks, positions % block_size].double()  # [seq_len, nkv, hd]
        v = case.v_cache[blocks, positions % block_size].double()
        group = case.query.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        query = case.query[starts[i]:starts[i + 1]].double()
        scores = torch.einsum("qhd,khd->hqk", query, k) * case.scale
        if logit_softcap is not None:
            scores = logit_softcap * torch.tanh(scores / logit_softcap)
        query_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)[:, None]
        if meta.key_ends is None:
            seen = positions[None, :] <= query_pos
        else:  # per-row key limits (a bidirectional run's rows see its end)
            ends = meta.key_ends[starts[i]:starts[i + 1]].long().to(query.device)
            seen = positions[None, :] < ends[:, None]
        if sliding_window is not None:
            seen &= positions[None, :] > query_pos - sliding_window
        scores = scores.masked_fill(~seen, float("-inf"))
        if sinks is None:
            probs = scores.softmax(-1)
        else:
            sink = sinks.double().to(scores.device).view(-1, 1, 1).expand(-1, q_len, 1)
            probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
        outs.append(torch.einsum("hqk,khd->qhd", probs, v))
    return torch.cat(outs).to(case.query.dtype)


def poison_before_window(case: PagedCase, window: int,
                         placeholder: int | None = None) -> tuple[PagedCase, int]:
    """A copy of the case in which every block wholly before its sequence's window (the
    window of the sequence's earliest new token) is filled with NaN and its block-table
    entry points at `placeholder`, standing for what the engine leaves there once it frees
    such blocks: by default a NaN block no sequence uses, so a kernel that reads any of
    them (a masked key still multiplies its NaN value) returns NaN; an id past the pool
    makes any gather of it raise. Returns the copy and how many entries were poisoned."""
    meta, block_size = case.meta, case.k_cache.shape[1]
    tables = meta.block_tables.cpu().clone()
    starts = meta.query_start_loc.tolist()
    seq_lens = meta.seq_lens.tolist()
    # Blocks before a window may still be inside another sequence's (shared blocks).
    needed: set[int] = set()
    before: list[tuple[int, int]] = []
    for i, seq_len in enumerate(seq_lens):
        first_pos = max(0, seq_len - (starts[i + 1] - starts[i]) - window + 1)
        count = -(-seq_len // block_size)
        before += [(i, j) for j in range(first_pos // block_size)]
        needed.update(tables[i, first_pos // block_size:count].tolist())
    if placeholder is None:
        placeholder = min(set(range(case.k_cache.shape[0])) - set(tables.flatten().tolist()))
    k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
    nan_blocks = {int(tables[i, j]) for i, j in before} - needed
    if placeholder < case.k_cache.shape[0]:
        nan_blocks.add(placeholder)
    for block in nan_blocks:
        k_cache[block] = float("nan")
        v_cache[block] = float("nan")
    for i, j in before:
        tables[i, j] = placeholder
    meta = dataclasses.replace(meta, block_tables=tables.to(meta.block_tables.device))
    return dataclasses.replace(case, k_cache=k_cache, v_cache=v_cache, meta=meta), len(before)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    atol, rtol = TOLERANCE[actual.dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)


def _openblas_thread_calls() -> tuple[object, object] | None:
    libs = glob.glob(os.path.join(os.path.dirname(numpy.__file__) + ".libs", "*openblas*"))
    for path in libs:
        lib = ctypes.CDLL(path)
        for suffix in ("64_", "_64_", ""):
            setter = getattr(lib, f"scipy_openblas_set_num_threads{suffix}", None)
            getter = getattr(lib, f"scipy_openblas_get_num_threads{suffix}", None)
            if setter is not None and getter is not None:
                return setter, getter
    return None


@contextlib.contextmanager
def single_thread_blas() -> Iterator[None]:
    """The interpreter runs tl.dot as numpy matmuls of tiny tiles; OpenBLAS threads then
    spin against each other on a busy 2-core machine (30 ms instead of 0.03 ms a tile)."""
    calls = _openblas_thread_calls()
    if calls is None:
        yield
        return
    setter, getter = calls
    previous = getter()
    setter(1)
    try:
        yield
    finally:
        setter(previous)




def compile_for_hopper(kernel, pointer_dtypes: dict[str, str], constants: dict[str, object],
                       num_warps: int = 4) -> bytes:
    """Compile a kernel to an sm_90 cubin without a GPU, as its launch on an H100/H200
    would (pointers and strides 16-divisible): catches what the interpreter lets through
    (types, dot shapes, layouts). Needs TRITON_INTERPRET unset. Returns the cubin."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constants:
            signature[name] = "constexpr"
        elif name in pointer_dtypes:
            signature[name] = "*" + pointer_dtypes[name]
        elif name in ("qk_scale", "softcap_log2"):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
        if name in pointer_dtypes or name.startswith("stride"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    constexprs = {(kernel.arg_names.index(n),): v for n, v in constants.items()}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = compile(source, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps, "num_stages": 2})
    return compiled.asm["cubin"]


def compile_every_kernel_for_hopper() -> list[str]:
    """bf16 builds of each kernel in the shapes the launchers pick for a Llama-8B-like
    model (group 4, head 128) and the starter (group 3, head 64), without the attention
    options; returns their names."""
    from kernels.triton import cache as triton_cache
    from kernels.triton import decode as triton_decode
    from kernels.triton import prefill as triton_prefill
    from kernels.triton import shared_prefix as triton_shared_prefix

    bf16 = "bf16"
    attn = dict(q_ptr=bf16, k_ptr=bf16, v_ptr=bf16, bt_ptr="i32", out_ptr=bf16,
                part_out_ptr="fp32", part_lse_ptr="fp32", sinks_ptr="fp32")
    built = []
    for group, head in ((4, 128), (3, 64)):
        shape = dict(G=group, HEAD_SIZE=head, BLOCK_SIZE=16, HEAD_PAD=head,
                     DOT_PRECISION="tf32", SOFTCAP=False, KV_FORMAT=0, GROUP=head)
        for final in (True, False):
            compile_for_hopper(
                triton_decode._decode_kernel, dict(attn, seq_lens_ptr="i32", start_ptr="i32"),
                dict(shape, G_PAD=16, BLOCK_N=64, HAS_START=not final, WRITE_FINAL=final,
                     SLIDING=False))
        compile_for_hopper(
            triton_decode._merge_kernel, attn,
            dict(G=group, HEAD_SIZE=head, G_PAD=4, HEAD_PAD=head, SLOT_PAD=64, HAS_SINKS=False))
        g_pad, block_q, block_n = triton_prefill.tile_shape(group, head)
        compile_for_hopper(
            triton_prefill._prefill_kernel, dict(attn, seq_lens_ptr="i32", qsl_ptr="i32"),
            dict(shape, G_PAD=g_pad, BLOCK_Q=block_q, BLOCK_N=block_n, SLIDING=False,
                 HAS_SINKS=False),
            num_warps=8 if head > 64 else 4)
        compile_for_hopper(
            triton_shared_prefix._shared_prefix_kernel,
            dict(attn, members_ptr="i32", shared_len_ptr="i32"),
            dict(shape, G_PAD=4, MEMBERS_PAD=4, BLOCK_N=64))
        compile_for_hopper(
            triton_cache._write_kv_kernel,
            dict(key_ptr=bf16, value_ptr=bf16, k_cache_ptr=bf16, v_cache_ptr=bf16,
                 slot_ptr="i64"),
            dict(NKV=8 // group * 2, HEAD_SIZE=head, BLOCK_SIZE=16, NKV_PAD=8, HEAD_PAD=head))
        built += [f"decode/merge/prefill/shared/write_kv g{group} h{head}"]
    compile_for_hopper(
        triton_cache._copy_blocks_kernel,
        dict(src_ptr=bf16, dst_ptr=bf16, src_ids_ptr="i64", dst_ids_ptr="i64"),
        dict(BLOCK_NUMEL=16 * 8 * 128, CHUNK=triton_cache.COPY_CHUNK))
    return built + ["copy_blocks"]


def compile_option_kernels_for_hopper() -> list[str]:
    """bf16 builds of the attention kernels with a sliding window, a logit soft-cap and
    attention sinks (SLIDING, SOFTCAP, HAS_SINKS) in a Gemma-2-like shape (group 2, head
    256); returns their names."""
    from kernels.triton import decode as triton_decode
    from kernels.triton import prefill as triton_prefill
    from kernels.triton import shared_prefix as triton_shared_prefix

    bf16 = "bf16"
    attn = dict(q_ptr=bf16, k_ptr=bf16, v_ptr=bf16, bt_ptr="i32", out_ptr=bf16,
                part_out_ptr="fp32", part_lse_ptr="fp32", sinks_ptr="fp32")
    shape = dict(G=2, HEAD_SIZE=256, BLOCK_SIZE=16, HEAD_PAD=256, DOT_PRECISION="tf32",
                 SOFTCAP=True, KV_FORMAT=0, GROUP=64)
    for final in (True, False):
        compile_for_hopper(
            triton_decode._decode_kernel, dict(attn, seq_lens_ptr="i32", start_ptr="i32"),
            dict(shape, G_PAD=16, BLOCK_N=32, HAS_START=not final, WRITE_FINAL=final,
                 SLIDING=True))
    g_pad, block_q, block_n = triton_prefill.tile_shape(2, 256)
    compile_for_hopper(
        triton_prefill._prefill_kernel, dict(attn, seq_lens_ptr="i32", qsl_ptr="i32"),
        dict(shape, G_PAD=g_pad, BLOCK_Q=block_q, BLOCK_N=block_n, SLIDING=True,
             HAS_SINKS=True), num_warps=8)
    compile_for_hopper(
        triton_decode._merge_kernel, attn,
        dict(G=2, HEAD_SIZE=256, G_PAD=2, HEAD_PAD=256, SLOT_PAD=64, HAS_SINKS=True))
    compile_for_hopper(
        triton_shared_prefix._shared_prefix_kernel,
        dict(attn, members_ptr="i32", shared_len_ptr="i32"),
        dict(shape, G_PAD=2, MEMBERS_PAD=8, BLOCK_N=32))
    return ["decode/merge/prefill/shared with sliding window, soft-cap and sinks g2 h256"]


def with_runs(case: PagedCase, runs: dict[int, list[tuple[int, int]]]) -> PagedCase:
    """The case with AttentionMetadata.key_ends: runs[i] lists sequence i's bidirectional
    runs [lo, hi) (positions among its new tokens), each of whose rows sees keys < hi;
    every other row is causal."""
    meta = case.meta
    starts = meta.query_start_loc.tolist()
    ends: list[int] = []
    for i, seq_len in enumerate(meta.seq_lens.tolist()):
        q_len = starts[i + 1] - starts[i]
        row_ends = list(range(seq_len - q_len + 1, seq_len + 1))
        for lo, hi in runs.get(i, []):  # a run may open among the cached tokens
            assert lo < hi <= seq_len and hi > seq_len - q_len
            for p in range(max(lo, seq_len - q_len), hi):
                row_ends[p - (seq_len - q_len)] = hi
        ends += row_ends
    key_ends = torch.tensor(ends, dtype=torch.int32, device=meta.seq_lens.device)
    return dataclasses.replace(case, meta=dataclasses.replace(meta, key_ends=key_ends))

