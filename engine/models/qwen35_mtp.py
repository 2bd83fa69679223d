"""Qwen3.5's multi-token-prediction (MTP) head: the ``mtp.*`` tensors its checkpoints ship
beside the text model, which guess the token after next from the model's own hidden state.

The structure, as vLLM's ``qwen3_5_mtp.py`` runs it (Qwen3-Next's MTP, the same layout):

- inputs at position i: the target's hidden state at i and the embedding of token i + 1
  (the target's own ``embed_tokens``, shared);
- each goes through its own zero-centred RMSNorm (``pre_fc_norm_hidden``,
  ``pre_fc_norm_embedding``); ``fc`` maps their concatenation [embedding | hidden]
  (2 * hidden_size) back to hidden_size, no bias;
- one Qwen3.5 full-attention decoder layer (``mtp.layers.0``: gated attention with q/k
  norms and partial rotary at position i, and the model's MLP kind: dense for Qwen3.5,
  sparse with a shared expert for Qwen3.5-MoE), over a paged KV cache of its own;
- a final zero-centred RMSNorm (``mtp.norm``); the target's LM head (shared) turns it
  into the logits of token i + 2.

The hidden state that feeds it is the target's *last* one, after the model's final norm
(``model.norm``): what ``CausalLM.forward`` returns and the LM head reads. vLLM hands its
MTP proposer the target model's output hidden states, which Qwen3.5's model returns after
``self.norm``; drafts past the first feed the head's own output (after ``mtp.norm``) back
as the hidden state of the next position.

``mtp_num_hidden_layers`` above 1 (vLLM would cycle through the layers, one per draft) is
refused: every Qwen3.5 release has one. Plain engines never read these tensors
(`split_mtp` is only used with ``EngineConfig.speculative="mtp"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from engine.layers.linear import StackedLinear
from engine.layers.mrope import MRopeEmbedding
from engine.layers.norm import GemmaRMSNorm
from engine.models.base import LayerKV, Target, copy_checkpoint
from engine.models.decoder import attention_targets, norm_targets
from engine.models.experts import per_expert
from engine.models.qwen35 import FULL, Qwen35ForCausalLM
from kernels import AttentionBackend, AttentionMetadata

MTP_PREFIX = "mtp."


def mtp_layer_count(hf_config: Any) -> int:
    """The config's ``mtp_num_hidden_layers`` (0 when it has none)."""
    return int(getattr(hf_config, "mtp_num_hidden_layers", 0) or 0)


def split_mtp(weights: Iterable[tuple[str, Any]], into: dict[str, Any]
              ) -> Iterator[tuple[str, Any]]:
    """The text model's tensors of a checkpoint stream; the ``mtp.*`` ones go to ``into``
    (read once, with the rest: the head is small)."""
    for name, tensor in weights:
        if name.startswith(MTP_PREFIX):
            into[name] = tensor
        else:
            yield name, tensor


class MTPHead(nn.Module):
    """The head of a loaded Qwen3.5 target; its embedding and LM head are the target's."""

    def __init__(self, target: Qwen35ForCausalLM, num_layers: int) -> None:
        super().__init__()
        if num_layers != 1:
            raise ValueError(f"mtp_num_hidden_layers: Folio runs an MTP head of one layer "
                             f"(every Qwen3.5 release has one), this config has {num_layers}")
        spec = target.spec
        self.spec = spec
        self.dtype = target.dtype
        device = target.embed_tokens.weight.device
        hidden, eps = spec.hidden_size, spec.rms_norm_eps
        # Shared, not registered as submodules: loading the head must not prepare (repack)
        # the target's matrices again, and the head's weight count leaves them out.
        self._shared = (target.embed_tokens, target.lm_head)
        self.pre_fc_norm_embedding = GemmaRMSNorm(hidden, eps, self.dtype, device)
        self.pre_fc_norm_hidden = GemmaRMSNorm(hidden, eps, self.dtype, device)
        self.fc = StackedLinear(2 * hidden, (hidden,), False, self.dtype, device)
        self.layers = nn.ModuleList(target.layer_class(spec, FULL, self.dtype, device)
                                    for _ in range(num_layers))
        self.norm = GemmaRMSNorm(hidden, eps, self.dtype, device)
        # The target's multimodal rotary table: after an image the head's positions are
        # the target's shifted (M-RoPE) ones, 3-D on the image's own tokens.
        self.rotary = MRopeEmbedding(spec.rotary_dim, spec.max_position_embeddings,
                                     spec.rope_theta, spec.rope_scaling, spec.mrope_section,
                                     self.dtype, device)
        self._feed_forward_targets = target.feed_forward_targets

    # ------------------------------------------------------------ what the pool reads
    def layer_windows(self) -> list[int | None]:
        return [None] * len(self.layers)

    def linear_layers(self) -> tuple[int, ...]:
        return ()

    def kv_heads(self) -> list[tuple[int, int]]:
        return [(self.spec.num_kv_heads, self.spec.head_dim)] * len(self.layers)

    def weight_bytes(self) -> int:
        """The head's own weights (the shared embedding and LM head are the target's)."""
        params = sum(p.numel() * p.element_size() for p in self.parameters())
        return params + sum(m.derived_bytes for m in self.modules()
                            if isinstance(m, StackedLinear))

    # -------------------------------------------------------------------- weights
    def checkpoint_targets(self) -> dict[str, Target]:
        targets: dict[str, Target] = {
            "mtp.fc.weight": self.fc.slot(0),
            "mtp.pre_fc_norm_embedding.weight": self.pre_fc_norm_embedding.weight.data,
            "mtp.pre_fc_norm_hidden.weight": self.pre_fc_norm_hidden.weight.data,
            "mtp.norm.weight": self.norm.weight.data,
        }
        for i, layer in enumerate(self.layers):
            prefix = f"mtp.layers.{i}."
            targets |= norm_targets(prefix, layer)
            targets |= attention_targets(prefix, layer.self_attn, self.spec)
            targets |= self._feed_forward_targets(prefix + "mlp.", layer.mlp)
        return targets

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """The ``mtp.*`` tensors (a fused-expert checkpoint's split per expert)."""
        copy_checkpoint(self, per_expert(weights))

    # -------------------------------------------------------------------- forward
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                target_hidden: torch.Tensor, kv_caches: Sequence[LayerKV],
                meta: AttentionMetadata, backend: AttentionBackend,
                image_embeds: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> torch.Tensor:
        """input_ids (token i + 1 at position i), positions int64 [T], or [3, T] for a
        step over an image's tokens (the target's position of index i); target_hidden
        [T, hidden_size] (the target's final-norm hidden state at i, or the head's own
        output at i - 1 for a draft past the first). ``image_embeds``: (rows int64 [R],
        embeddings [R, hidden_size]) replacing those rows' token embeddings, where token
        i + 1 is an image's (what the target embedded there). Returns the head's hidden
        states after ``mtp.norm`` [T, hidden_size]."""
        embed, _ = self._shared
        embedded = embed(input_ids)
        if image_embeds is not None:
            rows, embeds = image_embeds
            embedded = embedded.index_copy(0, rows, embeds.to(embedded.dtype))
        tokens = self.pre_fc_norm_embedding(embedded)
        hidden = self.pre_fc_norm_hidden(target_hidden.to(self.dtype))
        x = self.fc(torch.cat([tokens, hidden], dim=-1))
        cos, sin = self.rotary.lookup(positions, meta)
        for layer, (k_cache, v_cache, layer_meta) in zip(self.layers, kv_caches, strict=True):
            x = layer(x, cos, sin, k_cache, v_cache, layer_meta, backend)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's LM head: float32 logits [N, vocab_size]."""
        _, lm_head = self._shared
        return lm_head(hidden)


def build_mtp_head(target: nn.Module, hf_config: Any, model_name: str,
                   weights: dict[str, Any]) -> MTPHead:
    """The loaded head of ``target``; ValueError naming the field and the model where it
    has none."""
    layers = mtp_layer_count(hf_config)
    if not isinstance(target, Qwen35ForCausalLM) or layers < 1 or not weights:
        why = ("its family has no MTP head in Folio (Qwen3.5 and Qwen3.5-MoE do)"
               if not isinstance(target, Qwen35ForCausalLM) else
               "its config has no mtp_num_hidden_layers >= 1" if layers < 1 else
               "its weights hold no mtp.* tensors")
        raise ValueError(f"EngineConfig.speculative: 'mtp' needs a model with a "
                         f"multi-token-prediction head; {model_name} has none ({why})")
    head = MTPHead(target, layers)
    head.load_weights(weights.items())
    return head
