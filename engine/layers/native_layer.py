"""A decoder layer's step as one native call: the native library's C++ class
`torch.classes.folio_cpu.DecoderLayer` (kernels/cpu/csrc/fused/decoder_layer.cpp; no
Python class has that name: the families' layers are `LlamaDecoderLayer`,
`GemmaDecoderLayer` and so on).

On the native CPU path a pre-norm layer runs ten ops (norm, q/k/v product, rotary + KV
write, attention, o product, add + norm, gate/up product, activation, down product, add),
and a small model's decode step spent about as long in the Python around them as in some
of the ops. The C++ `DecoderLayer` runs the same ops in the same order, so its output is
the modules' bit for bit, and a step makes one call per layer.

Only pre-norm layers of these parts take it: RMSNorms (the q/k norms too, as Qwen3's),
attention with a rotate-half rotary (its q/k/v and o biases, sliding window, soft-cap and
sinks as the module has them), a SiLU-gated MLP without biases, and all four products on
the native library's quantized storage (a GGUF file's blocks). Any other layer, any
step that is not float32 on the CPU backend runs its modules. Over an int8 or int4 pool
the step also writes the layer's key blocks, between its KV write and its attention, as
the CPU backend's write does (kernels/key_stage.py: the pool's stage, its step's plan, the
op write_key_blocks), so the modules and the native step write the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.layers.attention import ROTATE_HALF, PagedSelfAttention
from engine.layers.linear import StackedLinear
from engine.layers.mlp import GatedMLP
from engine.layers.native import fused_cpu, native_pool
from engine.layers.norm import RMSNorm
from engine.layers.weights import NativeQuantized
from kernels.cpu.attention import CpuBackend, kernel_sinks
from kernels.kv_format import format_of


def native_decoder_layer(input_norm: RMSNorm, attn: PagedSelfAttention, post_norm: RMSNorm,
                         mlp: object) -> tuple[torch.ScriptObject, NativeQuantized] | None:
    """The native step of a pre-norm layer made of these parts (a C++ DecoderLayer), and
    the storage whose `pairs` (set_activation_bits) every product follows; None where a
    part needs its module."""
    if (type(input_norm) is not RMSNorm or type(post_norm) is not RMSNorm
            or type(attn) is not PagedSelfAttention or type(mlp) is not GatedMLP):
        return None
    if attn.rotate not in ROTATE_HALF or mlp.fused_op != "silu_mul":
        return None
    norms = [input_norm.weight, post_norm.weight]
    if attn.q_norm is not None:
        if type(attn.q_norm) is not RMSNorm or type(attn.k_norm) is not RMSNorm:
            return None
        if (attn.q_norm.eps, attn.q_norm.weight_offset) != (attn.k_norm.eps,
                                                           attn.k_norm.weight_offset):
            return None
        norms += [attn.q_norm.weight, attn.k_norm.weight]
    linears: tuple[StackedLinear, ...] = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj,
                                          mlp.down_proj)
    storages = [linear.storage for linear in linears]
    biases = [linear.bias for linear in linears[:2] if linear.bias is not None]
    if (any(linear.bias is not None for linear in linears[2:])
            or not all(isinstance(s, NativeQuantized) for s in storages)):
        return None
    if len({s.pairs for s in storages}) != 1 or not fused_cpu(*norms, *biases):
        return None
    layer = torch.classes.folio_cpu.DecoderLayer(
        input_norm.weight, post_norm.weight, input_norm.eps, post_norm.eps,
        input_norm.weight_offset, attn.num_heads, attn.num_kv_heads, attn.head_dim,
        float(attn.scale))
    for which, storage in enumerate(storages):  # q/k/v, o, gate/up, down
        layer.set_product(which, *storage.stack_args())
    _set_attention(layer, attn)
    layer.set_biases(attn.qkv_proj.bias, attn.o_proj.bias)
    return layer, storages[0]


def _set_attention(layer: torch.ScriptObject, attn: PagedSelfAttention) -> None:
    """The native step's q/k norms, window, soft-cap and sinks: the module's, in the form
    CpuBackend.attention hands them to the kernel."""
    options = attn.attention_options
    sinks = options.get("sinks")
    sinks = kernel_sinks(None if sinks is None else sinks.detach(), attn.num_heads)
    q_norm, k_norm = attn.q_norm, attn.k_norm
    layer.set_attention(
        None if q_norm is None else q_norm.weight, None if k_norm is None else k_norm.weight,
        0.0 if q_norm is None else q_norm.eps, 0.0 if q_norm is None else q_norm.weight_offset,
        int(options.get("sliding_window") or 0), float(options.get("logit_softcap") or 0.0),
        sinks)


class NativeLayers:
    """A model's layers, each with its native step where it has one (`native_step()`,
    built on first use), run one call a layer where the step allows."""

    __slots__ = ("layers", "steps")

    def __init__(self, layers: Sequence[torch.nn.Module]) -> None:
        self.layers = list(layers)
        self.steps = [layer.native_step() if hasattr(layer, "native_step") else None
                      for layer in self.layers]

    def run(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            kv_caches: Sequence, backend: object) -> torch.Tensor | None:
        """hidden after every layer, or None where this step must take the modules (no
        layer has a native step, another backend, or tensors the ops do not take)."""
        if (not isinstance(backend, CpuBackend) or not any(self.steps)
                or not fused_cpu(hidden, cos, sin) or not native_pool(kv_caches[0][0])
                or kv_caches[0][2].key_ends is not None):  # the fused op is causal only
            return None
        by_block = format_of(kv_caches[0][0]).keys_by_block
        for layer, step, (k_cache, v_cache, meta) in zip(self.layers, self.steps, kv_caches,
                                                         strict=True):
            if step is None:
                hidden = layer(hidden, cos, sin, k_cache, v_cache, meta, backend)
                continue
            native, storage = step
            args = (hidden, cos, sin, k_cache, v_cache, *backend.kernel_args(meta)[:4],
                    meta.max_seq_len, storage.pairs)
            if by_block:
                # The plan the modules' write would make (made once per pool and step).
                stage, index = backend.key_stages.find(k_cache)
                plan = stage.plan(meta.slot_mapping)
                hidden = native.step_key_blocks(*args, stage.exact[index], plan.tokens,
                                                plan.dest, plan.blocks, plan.filled,
                                                plan.carry, plan.keep_slot)
            else:
                hidden = native.step(*args)
        return hidden
