"""A Gated DeltaNet layer (Qwen3.5's linear attention) over the state pool.

Each sequence of a step owns one state slot (the runner's pool: a conv state and a
recurrent state per linear layer, engine/runner/state_pool.py). A chunk that starts a
sequence starts from zeros; one that continues it reads the slot; either way the slot
holds the state after the chunk's last token when the layer returns. The token mixing
itself (conv, delta rule: decode rows by the recurrent step together, prompt chunks by the
chunked delta rule) is engine/layers/token_mixers.py's, Triton or PyTorch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.base import Layer
from engine.layers.deltanet_data import DeltaNetShape, StateMetadata
from engine.layers.linear import StackedLinear
from engine.layers.token_mixers import MixerInputs, TokenMixer, token_mixer_for

__all__ = ["DeltaNetShape", "GatedDeltaNet", "GatedRMSNorm", "StateMetadata"]


class GatedRMSNorm(Layer):
    """RMSNorm of each head's output, then a SiLU gate from the z projection."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(size, dtype=dtype, device=device),
                                   requires_grad=False)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (self.weight * normed * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(Layer):
    """``mixer``: the token mixing's implementation, by default the device's
    (`token_mixer_for`: Triton on CUDA, PyTorch elsewhere), chosen here once."""

    def __init__(self, shape: DeltaNetShape, dtype: torch.dtype, device: torch.device | str,
                 mixer: TokenMixer | None = None) -> None:
        super().__init__()
        self.shape = shape
        self.mixer = mixer or token_mixer_for(device)
        s = shape
        # qkv, z, b, a: one matmul.
        self.in_proj = StackedLinear(s.hidden_size, (s.conv_dim, s.value_dim, s.num_v_heads,
                                                     s.num_v_heads), False, dtype, device)
        self.conv_weight = nn.Parameter(torch.empty(s.conv_dim, s.conv_width, dtype=dtype,
                                                    device=device), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.empty(s.num_v_heads, dtype=dtype, device=device),
                                    requires_grad=False)
        self.A_log = nn.Parameter(torch.empty(s.num_v_heads, dtype=dtype, device=device),
                                  requires_grad=False)
        self.norm = GatedRMSNorm(s.head_v_dim, s.eps, dtype, device)
        self.out_proj = StackedLinear(s.value_dim, (s.hidden_size,), False, dtype, device)

    def forward(self, hidden: torch.Tensor, conv_states: torch.Tensor,
                rec_states: torch.Tensor, meta: StateMetadata) -> torch.Tensor:
        """hidden [T, hidden_size] -> [T, hidden_size]; conv_states [slots, C, K - 1] and
        rec_states [slots, Hv, Dk, Dv] are this layer's pool, updated in place."""
        s = self.shape
        mixed, z, b, a = self.in_proj(hidden).split(
            (s.conv_dim, s.value_dim, s.num_v_heads, s.num_v_heads), dim=-1)
        beta = b.float().sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        core = self.mixer(s, MixerInputs(mixed, g, beta, self.conv_weight, conv_states,
                                         rec_states, meta))
        out = self.norm(core.to(hidden.dtype), z.unflatten(-1, (s.num_v_heads, s.head_v_dim)))
        return self.out_proj(out.flatten(-2))

    def checkpoint_targets(self, prefix: str) -> dict:
        """This layer's parameters by Hugging Face name (``prefix`` ends in
        ``linear_attn.``); the checkpoint's conv weight is [C, 1, K]."""
        names = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
        targets: dict = {f"{prefix}{n}.weight": self.in_proj.slot(i)
                         for i, n in enumerate(names)}
        targets[f"{prefix}conv1d.weight"] = self.conv_weight.data.unsqueeze(1)
        targets[f"{prefix}dt_bias"] = self.dt_bias.data
        targets[f"{prefix}A_log"] = self.A_log.data
        targets[f"{prefix}norm.weight"] = self.norm.weight.data
        targets[f"{prefix}out_proj.weight"] = self.out_proj.slot(0)
        return targets
