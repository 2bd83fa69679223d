"""The native CPU attention backend ("cpu"): the AttentionBackend protocol
(kernels/interface.py) on the C++ ops of kernels/cpu/csrc/attention.

`attention` is one op per layer: a varlen batch of prefill chunks and decode tokens read
in place from the paged pool through the block tables (causal, GQA, sliding window,
logit soft-cap, attention sinks and per-row key limits, AttentionMetadata.key_ends,
with the reference's exact semantics), split over
sequences, KV heads and,
when that leaves threads idle, block ranges of the keys. `write_kv` is one scatter op.
Float32 queries over float32, float16 and quantized (int8, fp8, int4: kernels/kv_format.py)
pools run natively, prefill chunks of any length included (their tasks score a block
through its keys transposed: faster than the reference's SDPA at 512 x 512 causal); a
float16 pool halves what a decode step reads, each block converted to float32 as it is
read; an int8 pool, the engine's default on this backend (engine/runner/device.py), halves
it again, its rows dequantized inside the block loop (its keys around each block's centers,
kernels/kv_key_centers.py), and an int4 pool's keys are decoded per channel from each
block's parameters (kernels/kv_key_channels.py); a quantized pool's rows are rotated, so
the op rotates the query before and the output after. The KV write quantizes float32 rows
into a quantized pool in the same op; an int8 or int4 pool's values only, since its key
rows hold a block's parameters and are written a block at a time from the exact keys
(kernels/key_stage.py; the op write_key_blocks). Any other dtype runs the PyTorch
reference; copy_blocks / swap_blocks (whole-block moves, not per step) move rows as bytes.

`rotary_write_kv` is an extra the attention layer uses when the backend offers it: the
rotary step on q and k in place and the KV write in one op.
"""

from __future__ import annotations

import torch

from kernels.cpu import available, ops, status
from kernels.interface import (
    AttentionMetadata,
    check_attention_options,
    check_sinks,
    effective_window,
)
from kernels.key_stage import KeyStages, StagePlan, write_keys
from kernels.kv_format import format_named
from kernels.reference.backend import TorchBackend, copy_blocks_ref, swap_blocks_ref

# The pool dtypes the kernels read and write (kernels/kv_format.py: float32, float16, and
# the int8, fp8 and int4 formats' storage); float32 rows go into any of them.
POOL_DTYPES = (torch.float32, torch.float16, torch.int8, torch.float8_e4m3fn, torch.uint8)
# The storage of the formats whose keys are written a block at a time through the pool's
# key stage (int8, int4).
BLOCK_KEY_STORAGE = tuple(format_named(name).storage for name in ("int8", "int4"))


class CpuBackend:
    name = "cpu"
    head_major_kv = True

    def __init__(self) -> None:
        if not available():  # loads the library on first use
            raise RuntimeError(f"the native CPU kernels are unavailable: {status()}")
        # Other dtypes (a bfloat16 model or pool) take the reference path.
        self._fallback = TorchBackend()
        # An int8 or int4 pool's keys go through its stage (kernels/key_stage.py), written
        # by the native op; the fallback's writes too, so that either path finds the stage.
        self.key_stages = KeyStages(write_key_blocks)
        self._fallback.key_stages = self.key_stages
        # Every layer of a step gets the same AttentionMetadata: its index tensors are
        # checked and converted for the kernels once, for the first layer, not 30 times.
        self._meta: AttentionMetadata | None = None
        self._meta_args: tuple[torch.Tensor, ...] = ()

    @staticmethod
    def _native(rows: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
        """Float32 rows (query, or the K/V written) over a POOL_DTYPES pool on the CPU:
        what the kernels take. Plain comparisons: it runs for every layer of
        every step."""
        return (rows.dtype == torch.float32 and rows.is_cpu and k_cache.is_cpu
                and k_cache.dtype in POOL_DTYPES and v_cache.dtype == k_cache.dtype)

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        if value.dtype != key.dtype or not self._native(key, k_cache, v_cache):
            self._fallback.write_kv(key, value, k_cache, v_cache, slot_mapping)
            return
        ops().write_kv(key, value, k_cache, v_cache, _int64(slot_mapping))
        if k_cache.dtype in BLOCK_KEY_STORAGE:
            self.key_stages.write(key, k_cache, slot_mapping)

    def rotary_write_kv(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Rotate query [T, nq, hd] and key [T, nkv, hd] in place (rotate-half over the
        first cos.shape[-1] dims, cos/sin as RotaryEmbedding.lookup gives them), then
        write key and value to their slots (quantized into a quantized pool; an int8 or
        int4 pool's value only, as write_kv). Float32 rows on the CPU, into a POOL_DTYPES
        pool."""
        ops().rotary_write_kv(query, key, value, cos, sin, k_cache, v_cache,
                              _int64(slot_mapping))
        if k_cache.dtype in BLOCK_KEY_STORAGE:  # the key, rotary-turned in place above
            self.key_stages.write(key, k_cache, slot_mapping)

    def kernel_args(self, meta: AttentionMetadata) -> tuple[torch.Tensor | None, ...]:
        """(slot_mapping as int64, query_start_loc, seq_lens, block_tables, key_ends as
        int32 or None), CPU tensors as the ops take them, kept for as long as the layers
        pass this same metadata."""
        if meta is not self._meta:
            self._meta_args = (_int64(meta.slot_mapping), _int32(meta.query_start_loc),
                               _int32(meta.seq_lens), _int32(meta.block_tables),
                               None if meta.key_ends is None else _int32(meta.key_ends))
            self._meta = meta
        return self._meta_args

    def attention(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  meta: AttentionMetadata, scale: float, sliding_window: int | None = None,
                  logit_softcap: float | None = None, sinks: torch.Tensor | None = None
                  ) -> torch.Tensor:
        if not self._native(query, k_cache, v_cache):
            return self._fallback.attention(query, k_cache, v_cache, meta, scale,
                                            sliding_window, logit_softcap, sinks)
        if query.dim() != 3:
            raise ValueError(f"query must be [num_tokens, nq, hd], got shape {tuple(query.shape)}")
        if query.shape[1] % k_cache.shape[2] != 0:
            raise ValueError(f"query heads ({query.shape[1]}) must be a multiple of KV heads "
                             f"({k_cache.shape[2]})")
        check_attention_options(sliding_window, logit_softcap)
        sinks = kernel_sinks(sinks, query.shape[1])
        window = effective_window(sliding_window, meta.max_seq_len) or 0
        if query.stride(2) != 1:
            query = query.contiguous()
        key_ends = None if meta.key_ends is None else self.kernel_args(meta)[4]
        return ops().paged_attention(
            query, k_cache, v_cache, *self.kernel_args(meta)[1:4], float(scale), int(window),
            float(logit_softcap or 0.0), sinks, key_ends)

    def copy_blocks(self, kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        copy_blocks_ref(_bytes(kv_cache), src, dst)

    def swap_blocks(self, src_cache: torch.Tensor, dst_cache: torch.Tensor,
                    src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
        if src_cache.dtype == dst_cache.dtype:
            src_cache, dst_cache = _bytes(src_cache), _bytes(dst_cache)
        swap_blocks_ref(src_cache, dst_cache, src_ids, dst_ids)


def write_key_blocks(exact: torch.Tensor, key: torch.Tensor, k_cache: torch.Tensor,
                     plan: StagePlan) -> None:
    """The backend's `KeyWriter` (kernels/key_stage.py): write_key_blocks, one op for what
    key_stage.write_keys does in about thirty (its blocks encoded to the same bytes; its
    own Hadamard rotation, which can move a code by one). Keys the op does not take (the
    fallback's bfloat16) as float32; a pool off the CPU through the PyTorch writer."""
    if not k_cache.is_cpu:
        write_keys(exact, key, k_cache, plan)
        return
    if key.dtype != torch.float32 or key.stride(-1) != 1:
        key = key.to(device="cpu", dtype=torch.float32).contiguous()
    ops().write_key_blocks(key, k_cache, exact, plan.tokens, plan.dest, plan.blocks,
                           plan.filled, plan.carry, plan.keep_slot)


def _bytes(pool: torch.Tensor) -> torch.Tensor:
    """A quantized pool as uint8 (its rows are bytes; index_copy_ has no float8 kernel on
    the CPU). A view: the last dim is a row of one-byte elements already."""
    if pool.dtype in (torch.int8, torch.float8_e4m3fn):
        return pool.view(torch.uint8)
    return pool


def kernel_sinks(sinks: torch.Tensor | None, num_q_heads: int) -> torch.Tensor | None:
    """Checked sinks (kernels.check_sinks) as the kernels read them: contiguous float32
    on the CPU, whatever the model's dtype."""
    check_sinks(sinks, num_q_heads)
    return None if sinks is None else sinks.to(device="cpu", dtype=torch.float32).contiguous()


def _int32(t: torch.Tensor) -> torch.Tensor:
    """The metadata as the kernel reads it; the engine's already is (no op then)."""
    if t.dtype == torch.int32 and t.device.type == "cpu" and t.is_contiguous():
        return t
    return t.to(device="cpu", dtype=torch.int32).contiguous()


def _int64(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.int64 and t.device.type == "cpu" and t.is_contiguous():
        return t
    return t.to(device="cpu", dtype=torch.int64).contiguous()
