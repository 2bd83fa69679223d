"""Quantized versions of tests/kernels/paged_cases.py's random cases, and their oracles.

A case's float pools are encoded with a kernels/kv_format.py format (keys whole blocks at
a time, `encode_keys`: int8 keys are around their block's centers, int4 keys per channel
over a block's tokens); the oracle case
holds `format.decode_keys` / `format.decode` of those bytes (the values the kernels must
dequantize to) in the query's dtype, so the float kernels' oracles (the PyTorch
reference, the float64 naive attention) judge a quantized kernel's output. A quantized
pool's decoded rows are rotated: a kernel attending them with an unrotated query computes
what the oracle computes on the decoded pool with the same query.

`compile_quantized_for_hopper` builds the quantized kernel variants for sm_90 without a
GPU, as paged_cases.compile_every_kernel_for_hopper does for the float ones.
"""

from __future__ import annotations

import dataclasses

import torch

from kernels.kv_format import KVFormat, format_named
from tests.kernels.paged_cases import PagedCase, make_case

QUANTIZED = ("int8", "fp8", "int4")


def block_size_for(name: str, block_size: int) -> int:
    """block_size, or the smallest a pool of the format takes where it is smaller (int8:
    64, int4: 32; `KVFormat.min_block_size`)."""
    return max(block_size, format_named(name).min_block_size)


def quantize_case(case: PagedCase, fmt: KVFormat) -> tuple[PagedCase, PagedCase]:
    """(the case over fmt's pools, the oracle case over their decoded values). Every
    block's keys are encoded whole, as the key stage leaves a full block."""
    k_pool, v_pool = fmt.encode_keys(case.k_cache), fmt.encode(case.v_cache)
    dtype = case.query.dtype
    oracle = dataclasses.replace(case, k_cache=fmt.decode_keys(k_pool, dtype),
                                 v_cache=fmt.decode(v_pool, dtype))
    return dataclasses.replace(case, k_cache=k_pool, v_cache=v_pool), oracle


def quantized_case(name: str, seq_lens: list[int], q_lens: list[int], *,
                   key_offsets: float = 0.0, **kwargs) -> tuple[PagedCase, PagedCase]:
    """make_case's case, quantized with the format named `name`. key_offsets: each KV
    head's channels shifted by that times a normal draw (the same for every token, as a
    model's keys carry), so that a block's centers (int8) or midpoints (int4) are far from
    0 and a reader that drops them is far off."""
    case = make_case(seq_lens, q_lens, **kwargs)
    if key_offsets:
        gen = torch.Generator().manual_seed(kwargs.get("seed", 0) + 1000)
        shift = torch.randn(case.k_cache.shape[2:], generator=gen) * key_offsets
        case = dataclasses.replace(case, k_cache=case.k_cache + shift.to(case.k_cache))
    return quantize_case(case, format_named(name))


def compile_quantized_for_hopper() -> list[str]:
    """bf16-query builds of the attention kernels over each quantized format, and of the
    quantizing writes (values; int8 and int4 key blocks), at a Llama-8B-like shape (group
    4, head 128; int8 in 64-token blocks and int4 in 32-token ones, the fewest their keys
    take); returns their names. Needs TRITON_INTERPRET unset."""
    from kernels.triton import decode, kv_quant, prefill, shared_prefix
    from tests.kernels.paged_cases import compile_for_hopper

    attn = dict(q_ptr="bf16", k_ptr="u8", v_ptr="u8", bt_ptr="i32", out_ptr="bf16",
                part_out_ptr="fp32", part_lse_ptr="fp32", sinks_ptr="fp32")
    codes = {"int8": kv_quant.INT8, "fp8": kv_quant.FP8, "int4": kv_quant.INT4}
    built = []
    for name, code in codes.items():
        shape = dict(G=4, HEAD_SIZE=128, BLOCK_SIZE=block_size_for(name, 16), HEAD_PAD=128,
                     DOT_PRECISION="tf32", SOFTCAP=False, KV_FORMAT=code, GROUP=64)
        compile_for_hopper(decode._decode_kernel,
                           dict(attn, seq_lens_ptr="i32", start_ptr="i32"),
                           dict(shape, G_PAD=16, BLOCK_N=64, HAS_START=False,
                                WRITE_FINAL=True, SLIDING=False))
        built.append(f"decode {name}")
        compile_for_hopper(kv_quant._write_kv_quant_kernel,
                           dict(key_ptr="bf16", value_ptr="bf16", k_cache_ptr="u8",
                                v_cache_ptr="u8", slot_ptr="i64"),
                           dict(KV_FORMAT=code, HEAD_SIZE=128,
                                BLOCK_SIZE=block_size_for(name, 16), HEAD_PAD=128,
                                GROUP=64, HALF_PAD=64, GROUPS_PAD=2), num_warps=1)
        built.append(f"write_kv {name}")
    g_pad, block_q, block_n = prefill.tile_shape(4, 128)
    for name in ("int8", "fp8", "int4"):
        compile_for_hopper(prefill._prefill_kernel,
                           dict(attn, seq_lens_ptr="i32", qsl_ptr="i32"),
                           dict(G=4, HEAD_SIZE=128, BLOCK_SIZE=block_size_for(name, 16),
                                HEAD_PAD=128, DOT_PRECISION="tf32", SOFTCAP=False,
                                KV_FORMAT=codes[name], GROUP=64, G_PAD=g_pad,
                                BLOCK_Q=block_q, BLOCK_N=block_n, SLIDING=False,
                                HAS_SINKS=False), num_warps=8)
        built.append(f"prefill {name}")
    compile_for_hopper(shared_prefix._shared_prefix_kernel,
                       dict(attn, members_ptr="i32", shared_len_ptr="i32"),
                       dict(G=4, HEAD_SIZE=128, BLOCK_SIZE=32, HEAD_PAD=128,
                            DOT_PRECISION="tf32", SOFTCAP=False, KV_FORMAT=kv_quant.INT4,
                            GROUP=64, G_PAD=4, MEMBERS_PAD=4, BLOCK_N=64))
    built.append("shared-prefix int4")
    from kernels.triton import key_blocks
    compile_for_hopper(key_blocks._encode_key_block_kernel,
                       dict(key_ptr="bf16", filled_ptr="i64", block_ptr="i64", cache_ptr="u8"),
                       dict(HEAD_SIZE=128, BLOCK_SIZE=32, BS_PAD=32, G_PAD=16, SPARE_PAD=8))
    built.append("key blocks int4")
    compile_for_hopper(key_blocks._encode_int8_key_block_kernel,
                       dict(key_ptr="fp32", filled_ptr="i64", block_ptr="i64", cache_ptr="u8"),
                       dict(HEAD_SIZE=128, BLOCK_SIZE=64, HEAD_PAD=128, ROWS=32, SPARE_PAD=2))
    built.append("key blocks int8")
    return built
