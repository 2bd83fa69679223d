"""A Gated DeltaNet layer (Qwen3.5's linear attention) over the state pool.

Each sequence of a step owns one state slot (the runner's pool: a conv state and a
recurrent state per linear layer, engine/runner/state_pool.py). A chunk that starts a
sequence starts from zeros; one that continues it reads the slot; either way the slot
holds the state after the chunk's last token when the layer returns. Decode rows go
through the recurrent step together; prompt chunks through the chunked delta rule one
sequence at a time (their matmuls are already wide).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.base import Layer
from engine.layers.delta_rule import (
    chunked_prefill,
    conv_prefill,
    conv_step,
    prepare_qk,
    recurrent_step,
)
from engine.layers.linear import StackedLinear


@dataclass(slots=True)
class StateMetadata:
    """A step's sequences as the linear layers see them, in the step's row order."""

    query_start_loc: list[int]  # len = sequences + 1: each sequence's rows
    slots: list[int]  # each sequence's state slot
    resumes: list[bool]  # whether its chunk continues the slot's state (else: zeros)
    # Per sequence, (tokens into its chunk, slot): copy the state there once that many
    # of its tokens are in (a snapshot at a block boundary).
    snapshots: list[list[tuple[int, int]]] | None = None


@dataclass(slots=True, frozen=True)
class DeltaNetShape:
    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_width: int
    eps: float
    # Value heads in llama.cpp's tiled order (a GGUF file): see delta_rule.prepare_qk.
    v_heads_tiled: bool = False

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """The channels the conv mixes: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim

    def state_bytes(self, conv_itemsize: int) -> int:
        """One sequence's state in one layer: the conv window and the float32 state."""
        conv = self.conv_dim * (self.conv_width - 1) * conv_itemsize
        return conv + self.num_v_heads * self.head_k_dim * self.head_v_dim * 4


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
    def __init__(self, shape: DeltaNetShape, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.shape = shape
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
        core = torch.empty(hidden.shape[0], s.num_v_heads, s.head_v_dim, dtype=torch.float32,
                           device=hidden.device)
        starts = meta.query_start_loc
        decodes = [i for i in range(len(meta.slots))
                   if meta.resumes[i] and starts[i + 1] - starts[i] == 1]
        if decodes:
            rows = torch.tensor([starts[i] for i in decodes], device=hidden.device)
            slots = torch.tensor([meta.slots[i] for i in decodes], device=hidden.device)
            conv_out, conv_states[slots] = conv_step(mixed[rows], self.conv_weight,
                                                     conv_states[slots])
            q, k, v = self._heads(conv_out)
            core[rows], rec_states[slots] = recurrent_step(q, k, v, g[rows], beta[rows],
                                                           rec_states[slots])
        snapshots = meta.snapshots or [[] for _ in meta.slots]
        for i in decodes:
            for _, snap in snapshots[i]:
                conv_states[snap] = conv_states[meta.slots[i]]
                rec_states[snap] = rec_states[meta.slots[i]]
        done = set(decodes)
        for i, slot in enumerate(meta.slots):
            if i in done:
                continue
            r0, r1 = starts[i], starts[i + 1]
            conv, rec = (conv_states[slot], rec_states[slot]) if meta.resumes[i] else (None, None)
            # The chunk in pieces ending at its snapshots: splitting a prompt anywhere
            # leaves the same states.
            cuts = [(r0 + offset, snap) for offset, snap in snapshots[i]]
            start = r0
            for end, snap in [*cuts, (r1, slot)]:
                if end > start:
                    conv_out, conv = conv_prefill(mixed[start:end], self.conv_weight, conv)
                    q, k, v = self._heads(conv_out)
                    core[start:end], rec = chunked_prefill(q, k, v, g[start:end],
                                                           beta[start:end], rec)
                    start = end
                if conv is not None:
                    conv_states[snap], rec_states[snap] = conv, rec
        out = self.norm(core.to(hidden.dtype), z.unflatten(-1, (s.num_v_heads, s.head_v_dim)))
        return self.out_proj(out.flatten(-2))

    def _heads(self, conv_out: torch.Tensor):
        """The conv's output [..., C] to prepared q, k [..., Hv, Dk] and v [..., Hv, Dv]."""
        s = self.shape
        q, k, v = conv_out.split((s.key_dim, s.key_dim, s.value_dim), dim=-1)
        q, k = prepare_qk(q.unflatten(-1, (s.num_k_heads, s.head_k_dim)),
                          k.unflatten(-1, (s.num_k_heads, s.head_k_dim)), s.num_v_heads,
                          s.v_heads_tiled)
        return q, k, v.unflatten(-1, (s.num_v_heads, s.head_v_dim))

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
