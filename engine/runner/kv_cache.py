"""The KV pool's shape and size: how many bytes a token and a block take, how many blocks
the engine allocates for a configuration and device, and the memory estimate the model
list shows (the same figures, from the same functions).

The sizing rule, first match wins (`num_blocks_for`):

1. ``num_gpu_blocks`` set: exactly that many blocks (tests, benchmarks).
2. ``kv_cache_memory_bytes`` set (the app's "Memory for chats"): the pool holds
   ``CONCURRENT_CONTEXTS`` full contexts (``max_model_len`` tokens each), bounded by the
   budget. A budget smaller than one full context is a `KVBudgetError` (a ValueError)
   naming the setting and what one context needs. ``gpu_memory_utilization`` is ignored.
3. ``gpu_memory_utilization`` set, on CUDA (server-style sizing, e.g. ``folio serve`` on a
   card of its own): the pool fills that share of the card's total memory, less what is
   already in use (weights, other processes); no cap in contexts.
4. Neither (the default on every device): ``CONCURRENT_CONTEXTS`` full contexts, capped at
   ``DEFAULT_KV_BUDGET_BYTES`` but never below one full context, so any model loads with its
   whole context usable.

On CUDA every result of 2-4 is then capped by the memory still free after the weights,
less ``CUDA_RESERVE_BYTES`` for activations; when that cannot hold one full context the
engine refuses to start (a `KVBudgetError` naming ``max_model_len``) instead of failing on
the first long chat.

With several KV groups (engine/core/kv_cache_manager.py: Gemma's global and sliding layers) the
pool's bytes, ``num_blocks * bytes_per_block`` of the rule above, split between them
(`group_blocks`): a sliding group (window W) gets what ``max_num_seqs`` sequences can hold
at once, ``ceil((W + max_num_batched_tokens) / block_size) + 1`` blocks each (the window,
one step's chunk, the partial block), but never more than ``num_blocks`` (as many as the
single pool had: the whole context); the full-attention group gets every byte left, so
it holds at least ``num_blocks`` blocks and more contexts fit than with one pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.dtypes import kv_format_of, resolve_dtype
from engine.models.spec import kv_bytes_per_token
from engine.runner.device import block_size_for, estimate_dtype, estimate_kv_dtype
from engine.runner.state_pool import state_slots
from kernels.kv_format import KVFormat

# Full contexts the pool holds by default: a chat and its candidates (they share the
# prompt's blocks) beside a few other chats streaming at once. When more is asked, the
# scheduler preempts and recomputes; nothing fails.
CONCURRENT_CONTEXTS = 4
# Without a budget the pool stays under this (unless one context needs more): a desktop
# shares memory with everything else, and 2 GiB holds four 8k contexts of the starter in
# fp32 (360 MiB each) or two of an 8B Llama 3 in bf16 (1 GiB each).
DEFAULT_KV_BUDGET_BYTES = 2 << 30
# Left free on CUDA for activations, logits and allocator slack: a 512-token prefill step of
# an 8B model needs well under this.
CUDA_RESERVE_BYTES = 512 << 20
MIB = 1 << 20


class KVBudgetError(ValueError):
    """The pool cannot hold one full context. `setting` names what to change:
    ``kv_cache_memory_bytes``, ``gpu_memory_utilization`` or ``max_model_len``."""

    def __init__(self, setting: str, available: int, needed: int, tokens: int) -> None:
        self.setting, self.available, self.needed, self.tokens = setting, available, needed, tokens
        if setting == "max_model_len":
            what = f"only {available / MIB:.0f} MiB of device memory is free for it"
            fix = "lower max_model_len or free memory on the device"
        else:
            what = f"{setting} leaves {available / MIB:.0f} MiB for it"
            fix = f"raise {setting} or lower max_model_len"
        super().__init__(f"EngineConfig.{setting}: one full context ({tokens} tokens) needs "
                         f"{needed / MIB:.0f} MiB of KV cache, but {what}; {fix}")


@dataclass(slots=True, frozen=True)
class KVShape:
    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int
    # The pool's storage dtype: a float dtype, or a quantized format's (int8, uint8 for
    # int4, float8_e4m3fn), which tags the format (`format`) and so its row bytes.
    dtype: torch.dtype
    # (num_kv_heads, head_size) per KV layer where layers differ (Gemma 4's global layers
    # have wider heads than its sliding ones); empty: every layer has the two fields above.
    layer_heads: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_spec(cls, spec, block_size: int, dtype: torch.dtype) -> KVShape:
        """From the model's DecoderSpec, which already resolved the config's head sizes.
        A hybrid model's linear-attention layers hold no KV (``num_kv_layers``)."""
        return cls(getattr(spec, "num_kv_layers", spec.num_layers), spec.num_kv_heads,
                   spec.head_dim, block_size, dtype)

    @classmethod
    def of_model(cls, model, block_size: int, dtype: torch.dtype) -> KVShape:
        """From a built model: its KV layers' heads (``kv_heads``), one entry per layer
        that keeps K/V (a layer reading another's K/V keeps none; a hybrid model's
        linear-attention layers keep a state slot instead)."""
        linear = set(model.linear_layers())
        heads = tuple(h for layer, h in enumerate(model.kv_heads()) if layer not in linear)
        spec = model.spec
        uniform = all(h == (spec.num_kv_heads, spec.head_dim) for h in heads)
        return cls(len(heads), spec.num_kv_heads, spec.head_dim, block_size, dtype,
                   () if uniform else heads)

    def heads(self, layer: int) -> tuple[int, int]:
        """(num_kv_heads, head_size) of KV layer ``layer``."""
        return self.layer_heads[layer] if self.layer_heads else (self.num_kv_heads,
                                                                 self.head_size)

    @property
    def format(self) -> KVFormat:
        """What a row holds (kernels/kv_format.py): its values, and a quantized format's
        scales."""
        return kv_format_of(self.dtype)

    def block_bytes(self, layers) -> int:
        """Bytes of one block across ``layers`` (KV layer indices), each layer's rows as
        `format` lays out its head size."""
        return sum(kv_bytes_per_token(1, *self.heads(i), self.dtype)
                   for i in layers) * self.block_size

    @property
    def bytes_per_token(self) -> int:
        return self.block_bytes(range(self.num_layers)) // self.block_size

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    def context_blocks(self, max_model_len: int) -> int:
        """Blocks one full context takes."""
        return -(-max_model_len // self.block_size)


def planned_blocks(config: EngineConfig, shape: KVShape, max_model_len: int) -> int:
    """The pool by rules 1, 2 and 4 of the module doc: what the engine allocates on the CPU,
    and on CUDA before the free-memory cap. The model list's estimate reads it too."""
    if config.num_gpu_blocks is not None:
        return config.num_gpu_blocks
    per_block = shape.bytes_per_block
    one = shape.context_blocks(max_model_len)
    want = CONCURRENT_CONTEXTS * one
    budget = config.kv_cache_memory_bytes
    if budget is None:
        return max(one, min(want, DEFAULT_KV_BUDGET_BYTES // per_block))
    if budget // per_block < one:
        raise KVBudgetError("kv_cache_memory_bytes", budget, one * per_block, max_model_len)
    return min(want, budget // per_block)


def num_blocks_for(
    config: EngineConfig, shape: KVShape, device: torch.device, max_model_len: int
) -> int:
    """The KV pool size in blocks (see the module doc for the rule)."""
    if config.num_gpu_blocks is not None:
        return config.num_gpu_blocks
    per_block = shape.bytes_per_block
    one = shape.context_blocks(max_model_len)
    on_cuda = device.type == "cuda"
    free, total = torch.cuda.mem_get_info(device) if on_cuda else (0, 0)
    server_style = (config.kv_cache_memory_bytes is None
                    and config.gpu_memory_utilization is not None and on_cuda)
    if server_style:
        share = int(total * config.gpu_memory_utilization) - (total - free)
        if share // per_block < one:
            raise KVBudgetError("gpu_memory_utilization", max(0, share), one * per_block,
                                max_model_len)
        num_blocks = share // per_block
    else:
        num_blocks = planned_blocks(config, shape, max_model_len)
    if on_cuda:
        room = max(0, free - CUDA_RESERVE_BYTES)
        if room // per_block < one:
            raise KVBudgetError("max_model_len", room, one * per_block, max_model_len)
        num_blocks = min(num_blocks, room // per_block)
    return int(num_blocks)


def group_blocks(config: EngineConfig, shape: KVShape, num_blocks: int,
                 groups: list) -> list[int]:
    """Blocks per KV group (``groups``: KVGroupSpecs, full attention first) out of the
    bytes of a ``num_blocks`` pool of ``shape`` (the module doc has the rule)."""
    if len(groups) == 1:
        return [num_blocks]
    budget = num_blocks * shape.bytes_per_block
    counts = []
    for group in groups:
        if group.window is None:
            counts.append(0)
            continue
        per_seq = shape.context_blocks(group.window + config.max_num_batched_tokens) + 1
        counts.append(min(num_blocks, config.max_num_seqs * per_seq))
        budget -= counts[-1] * shape.block_bytes(group.layers)
    full = [g for g, group in enumerate(groups) if group.window is None]
    full_bytes = sum(shape.block_bytes(groups[g].layers) for g in full)
    for g in full:
        counts[g] = max(num_blocks, budget // full_bytes)
    return counts


@dataclass(slots=True, frozen=True)
class MemoryEstimate:
    weights_bytes: int
    kv_bytes: int
    state_bytes: int = 0  # a hybrid model's linear-attention state pool

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.state_bytes


def estimate_memory(info, config: EngineConfig) -> MemoryEstimate:
    """What loading `info` (engine.loaders.catalog's ModelInfo) with `config` takes: the
    weights, plus the KV pool of `planned_blocks` for the model's context (the engine's
    ``max_model_len`` rule). A budget too small for one context still shows what one
    context needs, the least that loads. Quantized GGUF weights kept as stored count as
    their file size (the tensor blocks; small tensors may be dequantized, so it is close,
    not exact), a folder's MXFP4 experts their blocks' bytes; dense weights count
    parameters times the dtype's bytes."""
    dtype = estimate_dtype(config)
    context = info.context_length
    max_model_len = max(1, min(config.max_model_len or context, context))
    # A hybrid model's linear layers hold no KV (catalog.ModelInfo.kv_layers, .hybrid).
    hybrid = getattr(info, "hybrid", None)
    kv_layers = getattr(info, "kv_layers", info.num_layers)
    kv_dtype = estimate_kv_dtype(config)
    shape = KVShape(kv_layers, info.num_kv_heads, info.head_dim,
                    block_size_for(config, kv_dtype), kv_dtype)
    try:
        blocks = planned_blocks(config, shape, max_model_len)
    except KVBudgetError:
        blocks = shape.context_blocks(max_model_len)
    if config.weights == "stored" and info.format == "gguf":
        weights = info.size_bytes
    else:
        weight_dtype = dtype if config.weights == "stored" else resolve_dtype(config.weights)
        weights = info.num_parameters * weight_dtype.itemsize
        mxfp4 = getattr(info, "mxfp4", None)
        if config.weights == "stored" and mxfp4 is not None:  # those stay as their blocks
            weights += mxfp4.nbytes - mxfp4.parameters * weight_dtype.itemsize
    kv = blocks * shape.bytes_per_block
    states = 0
    if hybrid is not None:
        slot = hybrid.state_bytes(dtype.itemsize)
        states = (state_slots(config, slot, kv)[0] + 1) * slot  # and the null slot
    return MemoryEstimate(weights, kv, states)
