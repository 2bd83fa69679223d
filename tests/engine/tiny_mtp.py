"""Tiny random Qwen3.5 folders with a multi-token-prediction head (``mtp.*`` tensors and
``mtp_num_hidden_layers`` in the config), and the head as plain PyTorch: the structure
vLLM's Qwen3.5 MTP runs, built from transformers' Qwen3.5 layers, for the tests to check
Folio's head against."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    Qwen3_5DecoderLayer,
    Qwen3_5RMSNorm,
    Qwen3_5TextRotaryEmbedding,
)
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer

from tests.engine.tiny_models import (
    calm_qwen35_weights,
    save_tiny_model,
    tiny_qwen35_config,
    tiny_qwen35_moe_config,
)

FULL = "full_attention"


def mtp_config(moe: bool = False, hybrid: bool = True, **overrides):
    """The tiny Qwen3.5 (or Qwen3.5-MoE) config with one MTP layer. ``hybrid`` False:
    every layer full attention (no linear-attention state), so that speculation runs
    before hybrid models can roll their state back."""
    make = tiny_qwen35_moe_config if moe else tiny_qwen35_config
    fields = dict(mtp_num_hidden_layers=1)
    if not hybrid:
        fields["layer_types"] = [FULL] * 4
    fields.update(overrides)
    config = make(**fields)
    config._attn_implementation = "eager"
    return config


class ReferenceMTP(nn.Module):
    """The head in plain PyTorch: pre-fc norms on the token embedding and on the target's
    final-norm hidden state, fc over [embedding | hidden], transformers' Qwen3.5 decoder
    layer of the full-attention kind, the final norm."""

    def __init__(self, config) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(hidden, eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(hidden, eps)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        layer = Qwen3_5MoeDecoderLayer if hasattr(config, "num_experts") else \
            Qwen3_5DecoderLayer
        self.layers = nn.ModuleList([layer(config, config.layer_types.index(FULL))
                                     if FULL in config.layer_types else None])
        self.norm = Qwen3_5RMSNorm(hidden, eps)
        self.rotary = Qwen3_5TextRotaryEmbedding(config)

    def forward(self, embeds: torch.Tensor, target_hidden: torch.Tensor) -> torch.Tensor:
        """embeds, target_hidden [T, hidden] for positions 0..T-1 -> [T, hidden]."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds),
                               self.pre_fc_norm_hidden(target_hidden)], dim=-1))[None]
        t = x.shape[1]
        positions = torch.arange(t)[None]
        cos, sin = self.rotary(x, positions)
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        x = self.layers[0](x, position_embeddings=(cos, sin), attention_mask=mask,
                           position_ids=positions)
        return self.norm(x)[0]


_RESIDUAL_WRITERS = ("o_proj.weight", "out_proj.weight", "down_proj.weight",
                     "experts.down_proj")


def _near_bigram(model: nn.Module, leak: float) -> None:
    """Every layer's writes to the residual stream scaled by ``leak`` and every
    zero-centred norm at scale one: at leak 0 a model's next token depends on its current
    token alone."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(_RESIDUAL_WRITERS):
                param.mul_(leak)
            elif "norm" in name and param.dim() == 1 and \
                    not name.endswith("linear_attn.norm.weight"):
                param.zero_()  # pre_fc_norm_embedding / _hidden included


def save_mtp_model(path: Path, config, seed: int = 0, leak: float | None = None) -> Path:
    """A random Qwen3.5 folder whose model.safetensors also holds an MTP head (seeded);
    its config names ``mtp_num_hidden_layers``.

    ``leak`` set: a head that knows the model. The model is nearly a bigram model (its
    layers' writes scaled by ``leak``) and the head reads only the token (fc passes the
    embedding half through, its layer writes nothing), so its logits at position i are
    the model's at i + 1 when leak is 0: every draft is right; a small leak makes some
    wrong."""
    def init(model: nn.Module, init_seed: int) -> None:
        calm_qwen35_weights(model, init_seed)
        if leak is not None:
            _near_bigram(model, leak)

    save_tiny_model(path, config, seed=seed, init=init)
    torch.manual_seed(seed + 1)
    head = ReferenceMTP(config)
    calm_qwen35_weights(head, seed + 1)
    if leak is not None:
        _near_bigram(head, 0.0)
        with torch.no_grad():
            hidden = config.hidden_size
            head.fc.weight.copy_(torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], 1))
    file = path / "model.safetensors"
    tensors = load_file(file)
    tensors |= {f"mtp.{name}": t.contiguous() for name, t in head.state_dict().items()
                if not name.startswith("rotary.")}
    save_file(tensors, file, metadata={"format": "pt"})
    config_file = path / "config.json"
    data = json.loads(config_file.read_text())
    data["mtp_num_hidden_layers"] = config.mtp_num_hidden_layers
    config_file.write_text(json.dumps(data))
    return path


def reference_head(path: Path, config) -> ReferenceMTP:
    """The folder's head as plain PyTorch (float32)."""
    head = ReferenceMTP(config)
    tensors = load_file(path / "model.safetensors")
    head.load_state_dict({name.removeprefix("mtp."): t for name, t in tensors.items()
                          if name.startswith("mtp.")}, strict=False)
    return head.eval()
