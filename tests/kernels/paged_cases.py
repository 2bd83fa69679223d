"""Random paged-attention batches for the Triton kernel tests, and their oracle.

A case is a paged K/V pool filled with random values, block tables pointing into it
(shuffled, or with physical blocks shared between sequences), and the metadata of one
step. The oracle is the PyTorch reference backend, which gathers through the same
block tables.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy
import torch

from kernels import AttentionMetadata
from kernels.reference import TorchBackend

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
              seed: int = 0) -> PagedCase:
    """q_lens[i] new tokens at the end of a context of seq_lens[i] tokens."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + spare_blocks
    tables = build_tables(seq_lens, block_size, num_blocks, shared, gen)
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    k_cache = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    v_cache = torch.randn(shape, generator=gen).to(DEVICE, dtype)
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


def reference_attention(case: PagedCase) -> torch.Tensor:
    return TorchBackend().attention(case.query, case.k_cache, case.v_cache, case.meta,
                                    case.scale)


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
        elif name == "qk_scale":
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
    model (group 4, head 128) and the starter (group 3, head 64); returns their names."""
    from kernels.triton import cache as triton_cache
    from kernels.triton import decode as triton_decode
    from kernels.triton import prefill as triton_prefill
    from kernels.triton import shared_prefix as triton_shared_prefix

    bf16 = "bf16"
    attn = dict(q_ptr=bf16, k_ptr=bf16, v_ptr=bf16, bt_ptr="i32", out_ptr=bf16,
                part_out_ptr="fp32", part_lse_ptr="fp32")
    built = []
    for group, head in ((4, 128), (3, 64)):
        shape = dict(G=group, HEAD_SIZE=head, BLOCK_SIZE=16, HEAD_PAD=head,
                     DOT_PRECISION="tf32")
        for final in (True, False):
            compile_for_hopper(
                triton_decode._decode_kernel, dict(attn, seq_lens_ptr="i32", start_ptr="i32"),
                dict(shape, G_PAD=16, BLOCK_N=64, HAS_START=not final, WRITE_FINAL=final))
        compile_for_hopper(
            triton_decode._merge_kernel, attn,
            dict(G=group, HEAD_SIZE=head, G_PAD=4, HEAD_PAD=head, SLOT_PAD=64))
        g_pad, block_q, block_n = triton_prefill.tile_shape(group, head)
        compile_for_hopper(
            triton_prefill._prefill_kernel, dict(attn, seq_lens_ptr="i32", qsl_ptr="i32"),
            dict(shape, G_PAD=g_pad, BLOCK_Q=block_q, BLOCK_N=block_n),
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
