"""A SigLIP vision tower in PyTorch, shared by the families whose eyes are SigLIP
(Idefics3, Gemma 3): frames in, one state per patch out.

The tower is SigLIP's pre-norm encoder (LayerNorm, bidirectional attention, LayerNorm,
GELU MLP) after a strided patch convolution and learned position embeddings. A frame of
the tower's own size takes the position table row by row (SigLIP's); Idefics3 also reads
smaller frames, bucketing each patch's fractional place into the position grid (NaViT's
way, ``patch_positions``; ``fractional_positions=True``).

``SiglipTower.use_matmul_dtype(torch.bfloat16)`` keeps the projections' and the patch
convolution's weights in bfloat16 and runs them and the attention in bfloat16, the
residual stream, the norms and the GELU staying float32: on a CPU with AMX or
AVX512-BF16 a large tower encodes several times faster, within bfloat16's rounding of
the float32 result (engine/vision/gemma3.py decides when).

Parameter names are the checkpoint's under the tower's prefix (``embeddings.``,
``encoder.layers.``, ``post_layernorm.``), so a folder's tensors load by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(slots=True, frozen=True)
class TowerSpec:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int  # the size its position grid was trained on
    patch_size: int
    layer_norm_eps: float
    hidden_act: str  # "gelu_pytorch_tanh" (tanh approximation) or "gelu"

    @classmethod
    def of(cls, vision) -> TowerSpec:
        """From a transformers SigLIP vision config."""
        return cls(vision.hidden_size, vision.intermediate_size, vision.num_hidden_layers,
                   vision.num_attention_heads, _side(vision.image_size),
                   _side(vision.patch_size), vision.layer_norm_eps, vision.hidden_act)


def _side(value) -> int:
    return int(value[0] if isinstance(value, list | tuple) else value)


def _project(layer: nn.Module, x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``layer(x)`` in ``dtype`` (the weights' already) where one is set."""
    return layer(x) if dtype is None else layer(x.to(dtype))


class _Attention(nn.Module):
    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        width = spec.hidden_size
        self.num_heads = spec.num_heads
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)
        self.matmul_dtype: torch.dtype | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [B, P, D] -> q, k, v [B, H, P, D / H]; every patch sees every patch.
        b, p, d = x.shape
        h = x if self.matmul_dtype is None else x.to(self.matmul_dtype)
        heads = [proj(h).view(b, p, self.num_heads, d // self.num_heads).transpose(1, 2)
                 for proj in (self.q_proj, self.k_proj, self.v_proj)]
        out = F.scaled_dot_product_attention(*heads)
        return self.out_proj(out.transpose(1, 2).reshape(b, p, d)).to(x.dtype)


class _MLP(nn.Module):
    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        self.fc1 = nn.Linear(spec.hidden_size, spec.intermediate_size)
        self.fc2 = nn.Linear(spec.intermediate_size, spec.hidden_size)
        if spec.hidden_act not in ("gelu_pytorch_tanh", "gelu"):
            raise ValueError(f"vision_config.hidden_act: {spec.hidden_act!r} is not supported "
                             "(gelu_pytorch_tanh or gelu)")
        self.approximate = "tanh" if spec.hidden_act == "gelu_pytorch_tanh" else "none"
        self.matmul_dtype: torch.dtype | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = _project(self.fc1, x, self.matmul_dtype).to(x.dtype)
        act = F.gelu(up, approximate=self.approximate)
        return _project(self.fc2, act, self.matmul_dtype).to(x.dtype)


class _EncoderLayer(nn.Module):
    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)
        self.self_attn = _Attention(spec)
        self.layer_norm2 = nn.LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)
        self.mlp = _MLP(spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class _Embeddings(nn.Module):
    def __init__(self, spec: TowerSpec, fractional_positions: bool) -> None:
        super().__init__()
        self.patch_size = spec.patch_size
        self.grid = spec.image_size // spec.patch_size
        self.fractional = fractional_positions
        self.patch_embedding = nn.Conv2d(3, spec.hidden_size, spec.patch_size,
                                         stride=spec.patch_size)
        self.position_embedding = nn.Embedding(self.grid ** 2, spec.hidden_size)
        self.matmul_dtype: torch.dtype | None = None

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        # frames [B, 3, H, W] -> patches [B, (H / p) * (W / p), D]
        patches = _project(self.patch_embedding, frames, self.matmul_dtype).to(frames.dtype)
        patches = patches.flatten(2).transpose(1, 2)
        rows, cols = frames.shape[2] // self.patch_size, frames.shape[3] // self.patch_size
        if self.fractional:
            ids = patch_positions(rows, cols, self.grid, frames.device)
        elif rows == cols == self.grid:
            ids = torch.arange(rows * cols, device=frames.device)
        else:
            raise ValueError(f"a {frames.shape[2]} x {frames.shape[3]} frame: this tower "
                             f"reads {self.grid * self.patch_size} x "
                             f"{self.grid * self.patch_size} frames only")
        return patches + self.position_embedding(ids)


def patch_positions(rows: int, cols: int, grid: int, device) -> torch.Tensor:
    """Each patch's row in the ``grid x grid`` position table, row-major [rows * cols]:
    patch (i, j) sits at the fractions (i / rows, j / cols) of the frame, bucketed into
    the grid (a frame of the grid's own size maps one to one)."""
    edges = torch.arange(1 / grid, 1.0, 1 / grid, device=device)

    def buckets(n: int) -> torch.Tensor:
        place = torch.arange(n, device=device, dtype=torch.float32) * (1.0 / n)
        return torch.bucketize(place.clamp(max=1.0 - 1e-6), edges, right=True)

    return (buckets(rows)[:, None] * grid + buckets(cols)[None, :]).reshape(-1)


class SiglipTower(nn.Module):
    """``forward(frames)``: frames [B, 3, H, W] -> patch states [B, patches, D] after
    the post-LayerNorm."""

    def __init__(self, spec: TowerSpec, fractional_positions: bool = False) -> None:
        super().__init__()
        self.spec = spec
        self.embeddings = _Embeddings(spec, fractional_positions)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(_EncoderLayer(spec) for _ in range(spec.num_layers))
        self.post_layernorm = nn.LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(frames)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)

    def use_matmul_dtype(self, dtype: torch.dtype) -> None:
        """The projections and the patch convolution in ``dtype`` from now on (their
        weights and biases converted once); call after the module's own ``to``."""
        modules = [self.embeddings, *(m for layer in self.encoder.layers
                                      for m in (layer.self_attn, layer.mlp))]
        for module in modules:
            module.matmul_dtype = dtype
            for child in module.children():
                if isinstance(child, nn.Linear | nn.Conv2d):
                    child.to(dtype)

    @property
    def matmul_dtype(self) -> torch.dtype | None:
        return self.embeddings.matmul_dtype
