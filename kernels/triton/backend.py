"""The Triton attention backend: `kernels.interface.AttentionBackend` over the Triton kernels."""

from __future__ import annotations

import functools
import os

import torch

from kernels.interface import AttentionMetadata, check_attention_options, effective_window
from kernels.key_stage import KeyStages, encode_blocks, write_keys
from kernels.kv_format import format_of
from kernels.reference.backend import paged_attention_ref
from kernels.triton.cache import copy_blocks, swap_blocks, write_kv
from kernels.triton.decode import paged_decode
from kernels.triton.key_blocks import encode_key_blocks
from kernels.triton.prefill import paged_prefill
from kernels.triton.shared_prefix import (
    SharedPrefixGroup,
    find_shared_prefix_groups,
    shared_prefix_decode,
)

SHARED_PREFIX_ENV = "FOLIO_SHARED_PREFIX"


class TritonBackend:
    """Decode-only batches go to the split-K decode kernel (or the shared-prefix decode
    when enabled and some sequences share prompt blocks); any batch with a longer chunk
    goes to the varlen prefill kernel, which also handles its one-token rows.

    A sliding window that hides something (W < max_seq_len) always takes the plain
    decode kernel: it starts each sequence's loop at its window, whereas the cascade
    kernel reads the shared blocks whole, and those may lie before a member's window (and
    be freed); a window covering every context is dropped, so it keeps the cascade.
    So do attention sinks, which only the plain kernels' merge takes. A prefill step with
    per-row key limits (AttentionMetadata.key_ends: an image's bidirectional tokens) runs
    the PyTorch reference instead (the kernels here are causal).

    A quantized pool (int8, fp8, int4: its dtype tells; kernels/kv_format.py) goes to the
    same kernels, which read it in place. A quantized pool holds Hadamard-rotated rows:
    the query is rotated before the kernel and the output rotated back after it (the
    transform is orthogonal and its own inverse, so scores and the weighted sum of
    values come out as with unrotated rows), each one small torch matmul. An int8 or
    int4 pool's keys are encoded a block at a time (`KVFormat.keys_by_block`): its values
    go through the fused write, its keys through the key stage of its pool
    (`key_stages`).

    shared_prefix: None reads $FOLIO_SHARED_PREFIX ("1" turns it on).
    min_shared_blocks: the fewest shared blocks worth a group of their own.
    """

    name = "triton"
    head_major_kv = False  # the block-copy kernel moves each block as one piece

    def __init__(self, shared_prefix: bool | None = None, min_shared_blocks: int = 4) -> None:
        if shared_prefix is None:
            shared_prefix = os.environ.get(SHARED_PREFIX_ENV, "0") == "1"
        if min_shared_blocks < 1:
            raise ValueError(f"min_shared_blocks must be >= 1, got {min_shared_blocks}")
        self.shared_prefix = shared_prefix
        self.min_shared_blocks = min_shared_blocks
        # Every layer of a step gets the same metadata object: find the groups once per
        # step. (As with the reference backend, a step builds new metadata rather than
        # editing the last one in place; inference tensors have no version counter.)
        self._groups_meta: AttentionMetadata | None = None
        self._groups: list[SharedPrefixGroup] = []
        # An int8 or int4 pool's keys: through its stage (kernels/key_stage.py), its
        # blocks encoded by the Triton kernels (kernels/triton/key_blocks.py).
        self.key_stages = KeyStages(functools.partial(write_keys, encode=_encode_key_blocks))

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        write_kv(_heads_contiguous(key), _heads_contiguous(value), k_cache, v_cache,
                 slot_mapping)
        if format_of(k_cache).keys_by_block:
            self.key_stages.write(key, k_cache, slot_mapping)

    def attention(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  meta: AttentionMetadata, scale: float, sliding_window: int | None = None,
                  logit_softcap: float | None = None, sinks: torch.Tensor | None = None
                  ) -> torch.Tensor:
        if meta.key_ends is not None and not meta.is_decode_only:
            # A bidirectional run (Gemma 3's image, prefill only): the Triton kernels are
            # causal, so such a step takes the PyTorch reference on the device.
            return paged_attention_ref(query, k_cache, v_cache, meta, scale, sliding_window,
                                       logit_softcap, sinks)
        fmt = format_of(k_cache)
        if fmt.rotated:
            rotated = fmt.rotate(query.float()).to(query.dtype)
            out = self._attention(rotated, k_cache, v_cache, meta, scale, sliding_window,
                                  logit_softcap, sinks)
            return fmt.rotate(out.float()).to(out.dtype)
        return self._attention(query, k_cache, v_cache, meta, scale, sliding_window,
                               logit_softcap, sinks)

    def _attention(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   meta: AttentionMetadata, scale: float, sliding_window: int | None,
                   logit_softcap: float | None, sinks: torch.Tensor | None) -> torch.Tensor:
        query = _heads_contiguous(query)
        check_attention_options(sliding_window, logit_softcap)
        window = effective_window(sliding_window, meta.max_seq_len)
        options = dict(sliding_window=window, logit_softcap=logit_softcap)
        if sinks is not None:
            options["sinks"] = sinks
        if not meta.is_decode_only:
            return paged_prefill(query, k_cache, v_cache, meta, scale, **options)
        if self.shared_prefix and window is None and sinks is None:
            groups = self._shared_groups(meta, k_cache.shape[1])
            if groups:
                return shared_prefix_decode(query, k_cache, v_cache, meta, scale, groups,
                                            logit_softcap=logit_softcap)
        return paged_decode(query, k_cache, v_cache, meta, scale, **options)

    def copy_blocks(self, kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        copy_blocks(kv_cache, src, dst)

    def swap_blocks(self, src_cache: torch.Tensor, dst_cache: torch.Tensor,
                    src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
        swap_blocks(src_cache, dst_cache, src_ids, dst_ids)

    def _shared_groups(self, meta: AttentionMetadata, block_size: int
                       ) -> list[SharedPrefixGroup]:
        # Holding a reference keeps `is` meaningful: no new object can take its id.
        if meta is not self._groups_meta:
            self._groups = find_shared_prefix_groups(meta.block_tables, meta.seq_lens,
                                                     block_size, self.min_shared_blocks)
            self._groups_meta = meta
        return self._groups


def _heads_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The kernels read whole heads; the CPU small-batch matmul (engine/layers/linear.py)
    hands over transposed views whose head dimension is strided."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _encode_key_blocks(rows: torch.Tensor, filled: torch.Tensor, k_cache: torch.Tensor,
                       blocks: torch.Tensor) -> None:
    """The Triton encoders (int8: any head size), but for an int4 pool whose head size is
    no multiple of 8 (the int4 kernel's): PyTorch's."""
    if format_of(k_cache).bits == 4 and rows.shape[-1] % 8:
        encode_blocks(rows, filled, k_cache, blocks)
    else:
        encode_key_blocks(rows, filled, k_cache, blocks)
