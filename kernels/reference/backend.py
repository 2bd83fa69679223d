"""PyTorch paged attention: the CPU backend of the engine and the oracle of the Triton kernels.

Every function here reads the cache only through block tables and slot mappings, exactly as
docs/INTERNALS.md lays out the seam, so a kernel that agrees with these functions agrees
with the engine. Clarity comes first; the concessions to speed (the engine runs on this
backend on CPU) are that single-token (decode) sequences run as one batched SDPA call
instead of a Python loop over sequences, gathers use index_select (or a view, when a
sequence's blocks are consecutive) and yield each KV head's tokens as one matrix, and
TorchBackend plans a step (what depends on the metadata alone) once instead of once per
layer (kernels/reference/step_plan.py). Any pool layout works
(kernels.interface.allocate_kv_cache); TorchBackend asks for the head-major one, which its
attention reads fastest.

Two options of `attention` (kernels.interface.check_attention_options has the exact rules):
a sliding window trims what is read to the window's blocks (blocks wholly before a
query's window are never read, not even through their block-table entry), and a logit
soft-cap, which SDPA lacks, switches to an explicit fp32 softmax (`_explicit_attention`).
So do attention sinks (`check_sinks`: a per-head logit in the softmax's denominator),
which that softmax takes as one more column of scores that weighs no value.

A quantized pool (int8, int4, fp8: kernels/kv_format.py, told by the pool's dtype) is
written through its format's `encode` and read by decoding only the blocks a step
gathers (`heads_of_blocks`); over a rotated format the query is rotated before
attention and the output rotated back, so the result is what a float pool holding the
decoded values, unrotated, would give. An int4 pool's keys are written a block at a time
through the pool's `KeyStage` (kernels/key_stage.py), which the backend finds in
`key_stages`. Block copies and swaps move rows as they are
(a 1-byte pool as bytes: torch has no CPU index_copy_ for float8).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.interface import AttentionMetadata, check_attention_options, check_sinks
from kernels.key_stage import KeyStages
from kernels.kv_format import format_of
from kernels.reference.block_reads import heads_of_blocks
from kernels.reference.shared_prefix import shared_prefix_decode
from kernels.reference.step_plan import DecodePlan, StepPlan


def write_kv_ref(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter each token's K/V [num_tokens, nkv, hd] to its slot; slot -1 is skipped.
    Rows only: an int8 or int4 pool's keys are written a block at a time through its
    stage (`TorchBackend.write_kv`)."""
    if format_of(k_cache).keys_by_block:
        raise ValueError("an int8 or int4 pool's keys are written through the KeyStage of "
                         "its pool (kernels/key_stage.py): use a backend's write_kv")
    _write_kv(key, value, k_cache, v_cache, _valid_slots(slot_mapping, k_cache.device))


def _valid_slots(slot_mapping: torch.Tensor,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The int64 slots to write and, when some tokens are skipped (-1), the rows to keep."""
    slots = slot_mapping.to(device=device, dtype=torch.int64)
    # Padding tokens exist only in some batches; skip the masking otherwise.
    if bool((slots < 0).any()):
        keep = slots >= 0
        return slots[keep], keep
    return slots, None


def _write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor, valid: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    """The rows of a step: values, and keys where the format keeps them as rows (an int8
    or int4 pool's keys are the caller's, through its stage)."""
    slots, keep = valid
    if keep is not None:
        key, value = key[keep], value[keep]
    num_blocks, block_size, num_kv_heads, row = k_cache.shape
    flat_shape = (num_blocks * block_size, num_kv_heads, row)
    fmt = format_of(k_cache)
    if fmt.quantized:  # [T, nkv, hd] -> [T, nkv, row] bytes (rotated first)
        value = fmt.encode(value)
        key = key if fmt.keys_by_block else fmt.encode(key)
    elif key.dtype != k_cache.dtype:
        key, value = key.to(k_cache.dtype), value.to(v_cache.dtype)
    if not fmt.keys_by_block:
        as_bytes(k_cache).view(flat_shape).index_copy_(0, slots, as_bytes(key))
    as_bytes(v_cache).view(flat_shape).index_copy_(0, slots, as_bytes(value))


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A 1-byte tensor (a quantized pool or its rows) as uint8, the same memory: CPU
    index_copy_ is not implemented for float8. Other tensors as they are."""
    return t.view(torch.uint8) if t.element_size() == 1 else t


def paged_attention_ref(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttentionMetadata, scale: float,
                        sliding_window: int | None = None,
                        logit_softcap: float | None = None,
                        sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of a varlen batch over the paged cache; returns [num_tokens, nq, hd].

    Sequence i's rows query_start_loc[i]:query_start_loc[i+1] are its newest tokens: they
    see every cached position before them and, causally, each other. K/V of the new tokens
    must already be in the cache (write_kv first). sliding_window W: the token at position
    p sees only keys p - W + 1 .. p. logit_softcap c: scores are c * tanh(score / c)
    (after the scale, before the mask). sinks [nq]: kernels.interface.check_sinks.
    """
    _check_heads(query, k_cache)
    check_attention_options(sliding_window, logit_softcap)
    check_sinks(sinks, query.shape[1])
    plan = StepPlan.build(meta, k_cache.shape[1], k_cache.device, sliding_window)
    return _attention(query, k_cache, v_cache, plan, scale, logit_softcap, sinks)


def _check_heads(query: torch.Tensor, k_cache: torch.Tensor) -> None:
    if query.dim() != 3:
        raise ValueError(f"query must be [num_tokens, nq, hd], got shape {tuple(query.shape)}")
    num_q_heads, num_kv_heads = query.shape[1], k_cache.shape[2]
    if num_q_heads % num_kv_heads != 0:
        raise ValueError(
            f"query heads ({num_q_heads}) must be a multiple of KV heads ({num_kv_heads})"
        )


def _attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               plan: StepPlan, scale: float, softcap: float | None = None,
               sinks: torch.Tensor | None = None) -> torch.Tensor:
    fmt = format_of(k_cache)
    if fmt.rotated:
        # rotate(q) . rotate(k) == q . k, and the output, a mix of rotated values, rotates
        # back (the transform is its own inverse).
        rotated = fmt.rotate(query.float()).to(query.dtype)
        out = _unrotated_attention(rotated, k_cache, v_cache, plan, scale, softcap, sinks)
        return fmt.rotate(out.float()).to(query.dtype)
    return _unrotated_attention(query, k_cache, v_cache, plan, scale, softcap, sinks)


def _unrotated_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         plan: StepPlan, scale: float, softcap: float | None = None,
                         sinks: torch.Tensor | None = None) -> torch.Tensor:
    if plan.decode is not None and plan.decode_rows is None:
        return _decode_attention(query, k_cache, v_cache, plan.decode, scale, softcap, sinks)
    out = torch.empty_like(query)
    if plan.decode is not None and plan.decode_rows is not None:
        rows = plan.decode_rows
        out[rows] = _decode_attention(query[rows], k_cache, v_cache, plan.decode, scale,
                                      softcap, sinks)
    for chunk in plan.chunks:
        # Batched 4-D inputs: with 3-D ones and enable_gqa, SDPA on CPU takes its unfused
        # math path, 3x slower on a 512-token chunk.
        keys, values = (heads_of_blocks(cache, chunk.ids, chunk.num_keys, chunk.skip,
                                        query.dtype, keys=is_k)[None]
                        for cache, is_k in ((k_cache, True), (v_cache, False)))
        chunk_query = query[None, chunk.start:chunk.end].transpose(1, 2)  # [1, nq, q_len, hd]
        if softcap is None and sinks is None:
            chunk_out = F.scaled_dot_product_attention(
                chunk_query, keys, values, attn_mask=chunk.mask, scale=scale, enable_gqa=True)
        else:
            mask = None if chunk.mask is None else chunk.mask[None, None]
            chunk_out = _explicit_attention(chunk_query, keys, values, mask, scale, softcap,
                                            sinks)
        out[chunk.start:chunk.end] = chunk_out[0].transpose(0, 1)
    return out


def _decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      plan: DecodePlan, scale: float, softcap: float | None = None,
                      sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One new token per sequence: every sequence's blocks, padded to the longest, in a
    single SDPA over the batch with a length mask."""
    num_seqs, num_q_heads, head_size = query.shape
    if plan.shared is not None:
        return shared_prefix_decode(query, k_cache, v_cache, plan.shared, scale, softcap,
                                    sinks)
    if plan.mask is None:  # one sequence: its exact context or window, [1, nkv, seq_len, hd]
        keys, values = (heads_of_blocks(cache, plan.ids, plan.seq_len, plan.skip,
                                        query.dtype, keys=is_k)[None]
                        for cache, is_k in ((k_cache, True), (v_cache, False)))
    else:  # [nkv, B * blocks * bs, hd] -> [B, nkv, blocks * bs, hd]
        num_kv_heads = k_cache.shape[2]
        keys, values = (heads_of_blocks(cache, plan.ids, dtype=query.dtype, keys=is_k).view(
            num_kv_heads, num_seqs, -1, head_size)
            for cache, is_k in ((k_cache, True), (v_cache, False)))
        keys, values = keys.transpose(0, 1), values.transpose(0, 1)
    if softcap is None and sinks is None:
        out = F.scaled_dot_product_attention(query.unsqueeze(2), keys, values,
                                             attn_mask=plan.mask_for(query.dtype), scale=scale,
                                             enable_gqa=True)
    else:
        out = _explicit_attention(query.unsqueeze(2), keys, values, plan.mask, scale, softcap,
                                  sinks)
    return out.view(num_seqs, num_q_heads, head_size)


def _explicit_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                        mask: torch.Tensor | None, scale: float, softcap: float | None,
                        sinks: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA's contract with a soft-cap or sinks, which SDPA lacks: query [B, nq, q_len,
    hd], keys and values [B, nkv, n, hd], mask bool broadcastable to [B, 1, q_len, n]
    (True = seen) or None. As Gemma 2's eager attention: scale, then c * tanh(score / c),
    then the mask, then softmax, all in fp32; with sinks [nq] (gpt-oss's eager attention)
    each head's sink logit is one more column of the softmax, dropped after it. Returns
    [B, nq, q_len, hd] in query's dtype."""
    batch, num_q_heads, q_len, head_size = query.shape
    num_kv_heads = keys.shape[1]
    group = num_q_heads // num_kv_heads
    # Query head h uses KV head h // group: heads split as (nkv, group).
    q = query.float().reshape(batch, num_kv_heads, group * q_len, head_size)
    scores = torch.matmul(q, keys.float().transpose(-1, -2)) * scale  # [B, nkv, G*q, n]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.view(batch, num_kv_heads, group, q_len, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask[:, :, None], float("-inf"))
    if sinks is None:
        probs = scores.softmax(-1)
    else:
        sink = sinks.float().view(1, num_kv_heads, group, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
    probs = probs.reshape(batch, num_kv_heads, group * q_len, -1)
    out = torch.matmul(probs, values.float())
    return out.view(batch, num_q_heads, q_len, head_size).to(query.dtype)


def copy_blocks_ref(kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy-on-write: kv_cache[:, :, dst] = kv_cache[:, :, src] on every layer at once."""
    if src.shape != dst.shape:
        raise ValueError(f"src and dst must have the same shape, got {src.shape}, {dst.shape}")
    if src.numel() == 0:
        return
    src = src.to(device=kv_cache.device, dtype=torch.int64)
    dst = dst.to(device=kv_cache.device, dtype=torch.int64)
    # index_select copies the sources first, so a block that is both a source and a
    # destination in one call is read before it is overwritten.
    pool = as_bytes(kv_cache)
    pool.index_copy_(2, dst, pool.index_select(2, src))


def swap_blocks_ref(src_cache: torch.Tensor, dst_cache: torch.Tensor, src_ids: torch.Tensor,
                    dst_ids: torch.Tensor) -> None:
    """Move whole blocks between the device pool and the host pool (same layout)."""
    if src_ids.shape != dst_ids.shape:
        raise ValueError(
            f"src_ids and dst_ids must have the same shape, got {src_ids.shape}, {dst_ids.shape}"
        )
    if src_cache.shape[:2] != dst_cache.shape[:2] or src_cache.shape[3:] != dst_cache.shape[3:]:
        raise ValueError(
            "src_cache and dst_cache differ beyond num_blocks: "
            f"{tuple(src_cache.shape)} vs {tuple(dst_cache.shape)}"
        )
    if src_ids.numel() == 0:
        return
    src_ids = src_ids.to(device=src_cache.device, dtype=torch.int64)
    dst_ids = dst_ids.to(device=dst_cache.device, dtype=torch.int64)
    if src_cache.dtype != dst_cache.dtype:
        raise ValueError(f"src_cache and dst_cache must hold the same KV format, got "
                         f"{src_cache.dtype} and {dst_cache.dtype}")
    blocks = as_bytes(src_cache).index_select(2, src_ids).to(dst_cache.device)
    as_bytes(dst_cache).index_copy_(2, dst_ids, blocks)


class TorchBackend:
    """The AttentionBackend protocol (kernels/interface.py) on plain PyTorch ops.

    A step calls write_kv and attention once per layer with the same metadata, so what
    depends on the metadata alone (valid slots, the StepPlan) is computed for the first
    layer and reused while the same metadata object comes back: build a new
    AttentionMetadata (and slot_mapping) per step rather than editing one in place.
    A model with KV groups passes one metadata per group (each window's layers one), so
    the plans are kept per window along with the metadata they were built for.
    """

    name = "torch"
    head_major_kv = True

    def __init__(self) -> None:
        # The stages of int4 pools, whose keys write_kv hands them (kernels/key_stage.py).
        self.key_stages = KeyStages()
        # The valid slots of the last slot mappings (one per KV group), holding each
        # mapping so that its id is not reused by a new tensor.
        self._slots: list[tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor | None]]] = []
        # One plan per window size: sliding and global layers alternate within a step;
        # each with the metadata, block size and device it was built for.
        self._plans: dict[int | None, tuple[tuple, StepPlan]] = {}

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        slots = next((valid for mapping, valid in self._slots if mapping is slot_mapping),
                     None)
        if slots is None:
            slots = _valid_slots(slot_mapping, k_cache.device)
            self._slots = [*self._slots[-3:], (slot_mapping, slots)]
        _write_kv(key, value, k_cache, v_cache, slots)
        if format_of(k_cache).keys_by_block:
            self.key_stages.write(key, k_cache, slot_mapping)

    def attention(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  meta: AttentionMetadata, scale: float, sliding_window: int | None = None,
                  logit_softcap: float | None = None, sinks: torch.Tensor | None = None
                  ) -> torch.Tensor:
        block_size, device = k_cache.shape[1], k_cache.device
        key = (meta, block_size, device)
        cached = self._plans.get(sliding_window)
        if cached is not None and cached[0][0] is meta and cached[0][1:] == key[1:]:
            plan = cached[1]
        else:
            # The first layer of a step (of this window): the checks and the plan hold
            # for the later layers.
            _check_heads(query, k_cache)
            check_attention_options(sliding_window, None)
            plan = StepPlan.build(meta, block_size, device, sliding_window)
            self._plans[sliding_window] = (key, plan)
        if logit_softcap is not None:
            check_attention_options(None, logit_softcap)
        check_sinks(sinks, query.shape[1])
        return _attention(query, k_cache, v_cache, plan, scale, logit_softcap, sinks)

    def copy_blocks(self, kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        copy_blocks_ref(kv_cache, src, dst)

    def swap_blocks(self, src_cache: torch.Tensor, dst_cache: torch.Tensor,
                    src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
        swap_blocks_ref(src_cache, dst_cache, src_ids, dst_ids)
