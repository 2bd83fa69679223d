"""The seam between the engine and the attention backends.

The engine describes each step's varlen batch with `AttentionMetadata`, allocates the KV
pool with `allocate_kv_cache` and calls the four `AttentionBackend` methods (documented in
`docs/INTERNALS.md`); the backends (`kernels.reference`, the C++ `kernels.cpu`,
`kernels.triton`) implement them.
This module imports nothing else from `kernels` but `kv_format` and `key_stage` (which
import nothing of `kernels` but `kv_format`, `kv_key_channels` and `kv_key_centers`), so
every backend can import it while `kernels.get_backend` imports the backends.
"""

from __future__ import annotations

import math
import mmap
import numbers
from dataclasses import dataclass
from typing import Protocol

import torch

from kernels.key_stage import KeyStages
from kernels.kv_format import format_stored_as

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "allocate_kv_cache",
    "check_attention_options",
    "check_sinks",
    "effective_window",
]


@dataclass(slots=True)
class AttentionMetadata:
    """The varlen batch of one step; see docs/INTERNALS.md for each field."""

    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]
    seq_lens: torch.Tensor  # int32 [num_seqs]
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks]
    slot_mapping: torch.Tensor  # int64 [num_tokens]
    max_query_len: int
    max_seq_len: int
    # None: causal. Else int32 [num_tokens]: row t sees keys < key_ends[t], which lies in
    # [its position + 1, its seq_len] (a bidirectional run, Gemma 3's image tokens,
    # sees the run's end; those keys are the step's own tokens, written first). A
    # sliding window still starts at the row's own position - W + 1.
    key_ends: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


class AttentionBackend(Protocol):
    name: str
    # How the pool this backend reads best is laid out in memory (allocate_kv_cache).
    head_major_kv: bool
    # The stages through which write_kv writes an int4 pool's keys (kernels/key_stage.py).
    key_stages: KeyStages

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None: ...

    def attention(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        logit_softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

    def copy_blocks(self, kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None: ...

    def swap_blocks(
        self,
        src_cache: torch.Tensor,
        dst_cache: torch.Tensor,
        src_ids: torch.Tensor,
        dst_ids: torch.Tensor,
    ) -> None: ...


def check_attention_options(sliding_window: int | None, logit_softcap: float | None) -> None:
    """The ValueError for a window or soft-cap no backend can honour.

    sliding_window W: the query at position p sees keys p - W + 1 .. p (W keys, its own
    included), as transformers' masking_utils.sliding_window_overlay (kv_idx > q_idx - W)
    and flash-attn's window_size=(W - 1, 0). logit_softcap c: scores become
    c * tanh(score / c) after the scale and before the mask (Gemma 2's eager attention)."""
    if sliding_window is not None and (isinstance(sliding_window, bool)
                                       or not isinstance(sliding_window, numbers.Integral)
                                       or sliding_window < 1):
        raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window!r}")
    if logit_softcap is not None and not logit_softcap > 0:
        raise ValueError(f"logit_softcap must be > 0 or None, got {logit_softcap!r}")


def check_sinks(sinks: torch.Tensor | None, num_q_heads: int) -> None:
    """The ValueError for attention sinks no backend can honour.

    sinks [nq]: one learned logit per query head that joins the softmax's denominator
    and weighs no value (gpt-oss): a row's weights are e^s_j / (e^sink + sum_k e^s_k),
    its scores taken after the scale and the soft-cap, the sink as it is, seen by every
    query whatever its window. So a row may give less than all its weight to its keys."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
        raise ValueError(f"sinks must be a float tensor or None, got {type(sinks).__name__}")
    if tuple(sinks.shape) != (num_q_heads,):
        raise ValueError(f"sinks must have shape ({num_q_heads},) (one logit per query "
                         f"head), got {tuple(sinks.shape)}")


def effective_window(sliding_window: int | None, max_seq_len: int) -> int | None:
    """The window, or None when it hides nothing: a query at position p < max_seq_len
    with W >= max_seq_len already sees every key 0..p, so the backends take their plain
    (unwindowed) path."""
    if sliding_window is None or sliding_window >= max_seq_len:
        return None
    return sliding_window


def allocate_kv_cache(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
    head_major: bool,
    pin_memory: bool = False,
) -> torch.Tensor:
    """A zeroed KV pool, always indexed [num_layers, 2, num_blocks, block_size, nkv, row]:
    row is ``head_size`` values, or a quantized format's row of bytes when ``dtype`` is
    its storage dtype (kernels/kv_format.py).

    Memory order is the backend's choice. Block-contiguous (head_major=False) keeps each
    block in one piece, which the Triton block-copy kernel needs. Head-major stores each KV
    head of a layer as one run of slots over the whole pool, so a sequence whose blocks
    are consecutive reads every head's keys as one contiguous [seq_len, hd] matrix (the
    layout the CPU attention streams fastest) and a gather yields [nkv, seq_len, hd].

    On the CPU the pool is an anonymous memory map: zeroed pages the OS backs on first
    write, so a pool costs resident memory only for the blocks that hold tokens, where
    torch.zeros writes every page up front."""
    row = format_stored_as(dtype).row_len(head_size)
    if head_major:
        shape = (num_layers, 2, num_kv_heads, num_blocks, block_size, row)
    else:
        shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, row)
    if torch.device(device).type == "cpu" and not pin_memory:
        storage = _lazy_zeros(shape, dtype)
    else:
        storage = torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin_memory)
    return storage.permute(0, 1, 3, 4, 2, 5) if head_major else storage


def _lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros in an anonymous mapping (the tensor keeps the mapping alive). Transparent huge
    pages are turned off for it: with them one token written per KV head would commit
    2 MiB per head and layer, which for a small model is the whole pool."""
    count = math.prod(shape) * dtype.itemsize
    if count == 0:
        return torch.zeros(shape, dtype=dtype)
    # Private where the OS has the flag (Unix): Python's anonymous map is shared otherwise,
    # and a shared (shmem) page's first write costs about twice a private one's.
    if hasattr(mmap, "MAP_PRIVATE"):
        buffer = mmap.mmap(-1, count, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    else:
        buffer = mmap.mmap(-1, count)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux
        buffer.madvise(mmap.MADV_NOHUGEPAGE)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).view(shape)
