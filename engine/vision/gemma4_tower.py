"""Gemma 4's vision encoder and its embedder into the text model, in PyTorch: one
image's patches in, one row of text-model embeddings per soft token out.

The tower differs from SigLIP in every block:
- patches are flattened pixels (row in patch, column in patch, channel) through one
  linear map, after ``2 * (x - 0.5)``; positions are two learned tables, one for the
  patch's column and one for its row, summed;
- each block is Gemma's sandwich: RMSNorm (scaling by the weight itself) before and
  after attention and the gated GELU MLP; queries and keys get RMSNorm per head and an
  axial 2-D rotary (the first half of a head turns with the column, the second with the
  row), values a weightless RMSNorm, and the score scale is 1;
- linear maps may clamp their inputs and outputs to stored ranges (``use_clipped_linears``);
- the pooler averages each ``k x k`` square of patch states into one soft token (row by
  row), scales by sqrt(hidden), and may standardize with a stored bias and scale;
- the embedder takes a weightless RMSNorm, then projects to the text model's width.

Parameter names are the checkpoint's under ``model.vision_tower.`` and
``model.embed_vision.``, so a folder's tensors load by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(slots=True, frozen=True)
class Gemma4TowerSpec:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    patch_size: int
    pooling: int  # k: each k x k square of patches becomes one soft token
    position_table: int  # rows of each position table
    rope_theta: float
    eps: float
    hidden_act: str
    clipped: bool  # use_clipped_linears
    standardize: bool
    text_hidden_size: int

    @classmethod
    def of(cls, config) -> Gemma4TowerSpec:
        """From a ``Gemma4Config`` (transformers' object)."""
        vision = config.vision_config
        if vision.hidden_activation not in ("gelu_pytorch_tanh", "gelu"):
            raise ValueError(f"vision_config.hidden_activation: {vision.hidden_activation!r} "
                             "is not supported (gelu_pytorch_tanh or gelu)")
        rope = vision.rope_parameters or {}
        if rope.get("rope_type", "axial") != "axial":
            raise ValueError(f"vision_config.rope_parameters.rope_type: {rope['rope_type']!r}"
                             " is not supported (axial)")
        return cls(vision.hidden_size, vision.intermediate_size, vision.num_hidden_layers,
                   vision.num_attention_heads, vision.num_key_value_heads, vision.head_dim,
                   vision.patch_size, vision.pooling_kernel_size,
                   vision.position_embedding_size, float(rope.get("rope_theta", 100.0)),
                   vision.rms_norm_eps, vision.hidden_activation,
                   bool(vision.use_clipped_linears), bool(vision.standardize),
                   config.text_config.hidden_size)


class _Norm(nn.Module):
    """RMSNorm in float32, scaled by the weight itself (or not at all)."""

    def __init__(self, width: int, eps: float, with_scale: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width)) if with_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.rms_norm(x.float(), (x.shape[-1],), None, self.eps)
        if self.weight is not None:
            out = out * self.weight.float()
        return out.to(x.dtype)


class _Linear(nn.Module):
    """A bias-free linear map whose input and output may be clamped to stored ranges."""

    def __init__(self, inputs: int, outputs: int, clipped: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(inputs, outputs, bias=False)
        self.clipped = clipped
        if clipped:
            for name in ("input_min", "input_max", "output_min", "output_max"):
                sign = -1.0 if name.endswith("min") else 1.0
                self.register_buffer(name, torch.tensor(sign * float("inf")))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.clipped:
            return self.linear(x)
        x = torch.clamp(x, self.input_min, self.input_max)
        return torch.clamp(self.linear(x), self.output_min, self.output_max)


def axial_rotary(positions: torch.Tensor, head_dim: int, theta: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [P, head_dim] for patches at ``positions`` [P, 2] (column, row): the
    first half of a head turns with the column, the second with the row, each half
    rotated as a NEOX pair layout of its own."""
    quarter = torch.arange(0, head_dim // 2, 2, dtype=torch.float32) / (head_dim // 2)
    inv_freq = 1.0 / theta ** quarter  # [head_dim / 4]
    angles = positions.float()[..., None] * inv_freq  # [P, 2, head_dim / 4]
    col, row = angles[:, 0], angles[:, 1]
    turns = torch.cat([col, col, row, row], dim=-1)
    return turns.cos(), turns.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [P, H, D]: each half of D is a NEOX-rotated part of its own.
    def turn(part, c, s):
        a, b = part.chunk(2, dim=-1)
        return part * c + torch.cat([-b, a], dim=-1) * s

    halves = x.chunk(2, dim=-1)
    cs, ss = cos[:, None].chunk(2, dim=-1), sin[:, None].chunk(2, dim=-1)
    return torch.cat([turn(h, c, s) for h, c, s in zip(halves, cs, ss, strict=True)], dim=-1)


class _Attention(nn.Module):
    def __init__(self, spec: Gemma4TowerSpec) -> None:
        super().__init__()
        self.spec = spec
        width, heads, kv, dim = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_proj = _Linear(width, heads * dim, spec.clipped)
        self.k_proj = _Linear(width, kv * dim, spec.clipped)
        self.v_proj = _Linear(width, kv * dim, spec.clipped)
        self.o_proj = _Linear(heads * dim, width, spec.clipped)
        self.q_norm = _Norm(dim, spec.eps)
        self.k_norm = _Norm(dim, spec.eps)
        self.v_norm = _Norm(dim, spec.eps, with_scale=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x [P, D] -> q [H, P, d], k and v [KV, P, d]; every patch sees every patch.
        p, dim = x.shape[0], self.spec.head_dim
        q = _rotate(self.q_norm(self.q_proj(x).view(p, -1, dim)), cos, sin)
        k = _rotate(self.k_norm(self.k_proj(x).view(p, -1, dim)), cos, sin)
        v = self.v_norm(self.v_proj(x).view(p, -1, dim))
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), scale=1.0,
            enable_gqa=self.spec.num_heads != self.spec.num_kv_heads)
        return self.o_proj(out.transpose(0, 1).reshape(p, -1))


class _MLP(nn.Module):
    def __init__(self, spec: Gemma4TowerSpec) -> None:
        super().__init__()
        self.gate_proj = _Linear(spec.hidden_size, spec.intermediate_size, spec.clipped)
        self.up_proj = _Linear(spec.hidden_size, spec.intermediate_size, spec.clipped)
        self.down_proj = _Linear(spec.intermediate_size, spec.hidden_size, spec.clipped)
        self.approximate = "tanh" if spec.hidden_act == "gelu_pytorch_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = F.gelu(self.gate_proj(x), approximate=self.approximate)
        return self.down_proj(gate * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, spec: Gemma4TowerSpec) -> None:
        super().__init__()
        width, eps = spec.hidden_size, spec.eps
        self.input_layernorm = _Norm(width, eps)
        self.self_attn = _Attention(spec)
        self.post_attention_layernorm = _Norm(width, eps)
        self.pre_feedforward_layernorm = _Norm(width, eps)
        self.mlp = _MLP(spec)
        self.post_feedforward_layernorm = _Norm(width, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class _PatchEmbedder(nn.Module):
    def __init__(self, spec: Gemma4TowerSpec) -> None:
        super().__init__()
        self.input_proj = nn.Linear(3 * spec.patch_size ** 2, spec.hidden_size, bias=False)
        self.position_embedding_table = nn.Parameter(
            torch.zeros(2, spec.position_table, spec.hidden_size))

    def forward(self, patches: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # patches [P, 3 * p * p] in [0, 1]; positions [P, 2] (column, row)
        x = self.input_proj(2 * (patches - 0.5))
        table = self.position_embedding_table
        return x + table[0][positions[:, 0]] + table[1][positions[:, 1]]


class _Tower(nn.Module):
    def __init__(self, spec: Gemma4TowerSpec) -> None:
        super().__init__()
        self.spec = spec
        self.patch_embedder = _PatchEmbedder(spec)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(_Layer(spec) for _ in range(spec.num_layers))
        if spec.standardize:
            self.register_buffer("std_bias", torch.zeros(spec.hidden_size))
            self.register_buffer("std_scale", torch.ones(spec.hidden_size))

    def forward(self, patches: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        """patches [rows * cols, 3 * p * p] row-major -> soft tokens [rows * cols / k**2,
        hidden], float32."""
        spec = self.spec
        device = patches.device
        row, col = torch.meshgrid(torch.arange(rows, device=device),
                                  torch.arange(cols, device=device), indexing="ij")
        positions = torch.stack([col.reshape(-1), row.reshape(-1)], dim=-1)
        if int(positions.max()) >= spec.position_table:
            raise ValueError(f"an image of {rows} x {cols} patches is past the tower's "
                             f"{spec.position_table}-entry position tables")
        cos, sin = axial_rotary(positions, spec.head_dim, spec.rope_theta)
        x = self.patch_embedder(patches, positions)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for layer in self.encoder.layers:
            x = layer(x, cos, sin)
        k = spec.pooling
        grid = x.float().T.reshape(1, -1, rows, cols)  # [1, hidden, rows, cols]
        pooled = F.avg_pool2d(grid, k).flatten(2)[0].T  # [tokens, hidden], row by row
        pooled = pooled * spec.hidden_size ** 0.5
        if spec.standardize:
            pooled = (pooled - self.std_bias.float()) * self.std_scale.float()
        return pooled


class _Embedder(nn.Module):
    def __init__(self, spec: Gemma4TowerSpec) -> None:
        super().__init__()
        self.eps = spec.eps
        self.embedding_projection = nn.Linear(spec.hidden_size, spec.text_hidden_size,
                                              bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(tokens.float(), (tokens.shape[-1],), None, self.eps)
        return self.embedding_projection(normed.to(self.embedding_projection.weight.dtype))


class Gemma4Encoder(nn.Module):
    """``encode(patches)``: one image's ``Gemma4Patches`` -> its soft tokens' text-model
    embeddings [rows * cols / k**2, text width]."""

    def __init__(self, spec: Gemma4TowerSpec) -> None:
        super().__init__()
        self.spec = spec
        self.vision_tower = _Tower(spec)
        self.embed_vision = _Embedder(spec)

    def forward(self, patches: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        pooled = self.vision_tower(patches, rows, cols)
        return self.embed_vision(pooled.to(patches.dtype))

    def encode(self, image, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self(image.patches.to(device, dtype), image.rows, image.cols)
