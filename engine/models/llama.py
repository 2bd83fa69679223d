"""The Llama-family decoder (Llama 2/3, Mistral, SmolLM, Qwen2, Qwen3) over a paged KV cache.

The model knows nothing of scheduling: a step hands it flattened token ids and positions,
the whole-model KV cache and the attention metadata, and it returns hidden states; the
caller picks the rows to turn into logits. Its layers are the plain pre-norm decoder
layer (decoder.py) with a SiLU-gated MLP.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.attention import PagedSelfAttention
from engine.layers.mlp import GatedMLP
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.models.base import CausalLM, Target
from engine.models.decoder import PreNormLayer, norm_targets, projection_targets
from engine.models.spec import DecoderSpec


class LlamaDecoderLayer(PreNormLayer):
    def __init__(self, spec: DecoderSpec, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.self_attn = PagedSelfAttention(
            spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim,
            qkv_bias=spec.qkv_bias, o_bias=spec.o_bias,
            qk_norm_eps=spec.rms_norm_eps if spec.qk_norm else None,
            dtype=dtype, device=device, sliding_window=spec.sliding_window,
        )
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype,
                                                device)
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, spec.mlp_bias, dtype,
                            device)


class LlamaForCausalLM(CausalLM):
    def __init__(
        self, spec: DecoderSpec, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        super().__init__(spec, dtype, device,
                         RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device))
        self.rotary = RotaryEmbedding(spec.head_dim, spec.max_position_embeddings,
                                      spec.rope_theta, spec.rope_scaling, dtype, device)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(spec, dtype, device) for _ in range(spec.num_layers)
        )

    def checkpoint_targets(self) -> dict[str, Target]:
        """Each Hugging Face parameter name -> the tensor (or stacked slice) it fills."""
        targets = self.shared_targets()
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            targets |= norm_targets(prefix, layer)
            targets |= projection_targets(prefix, layer.self_attn, layer.mlp, self.spec)
        return targets
