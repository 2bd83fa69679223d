"""Idefics3's vision tower (a SigLIP encoder over patches) and its pixel-shuffle
connector, in PyTorch: a batch of equal-size frames in, one row of text-model
embeddings per image token out.

The tower is SigLIP's pre-norm encoder (LayerNorm, bidirectional attention, LayerNorm,
GELU MLP) after a strided patch convolution and learned position embeddings; Idefics3
reads frames smaller than the tower's training size by bucketing each patch's
fractional place into the position grid (NaViT's way), which is what
``patch_positions`` computes. The connector folds each ``scale x scale`` square of
patch states into one state ``scale**2`` times as wide and projects it to the text
model's width, so a frame of ``(size / patch)**2`` patches becomes
``(size / patch / scale)**2`` image tokens.

Parameter names are the checkpoint's under ``model.vision_model.`` and
``model.connector.``, so a folder's tensors load by name (``load_state_dict``).
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
    scale_factor: int  # the connector's fold
    text_hidden_size: int

    def tokens_per_frame(self, frame_size: int) -> int:
        side = frame_size // self.patch_size
        return (side // self.scale_factor) ** 2


class _Attention(nn.Module):
    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        width = spec.hidden_size
        self.num_heads = spec.num_heads
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [B, P, D] -> q, k, v [B, H, P, D / H]; every patch sees every patch.
        b, p, d = x.shape
        heads = [proj(x).view(b, p, self.num_heads, d // self.num_heads).transpose(1, 2)
                 for proj in (self.q_proj, self.k_proj, self.v_proj)]
        out = F.scaled_dot_product_attention(*heads)
        return self.out_proj(out.transpose(1, 2).reshape(b, p, d))


class _MLP(nn.Module):
    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        self.fc1 = nn.Linear(spec.hidden_size, spec.intermediate_size)
        self.fc2 = nn.Linear(spec.intermediate_size, spec.hidden_size)
        if spec.hidden_act not in ("gelu_pytorch_tanh", "gelu"):
            raise ValueError(f"vision_config.hidden_act: {spec.hidden_act!r} is not supported "
                             "(gelu_pytorch_tanh or gelu)")
        self.approximate = "tanh" if spec.hidden_act == "gelu_pytorch_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


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
    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        self.patch_size = spec.patch_size
        self.grid = spec.image_size // spec.patch_size
        self.patch_embedding = nn.Conv2d(3, spec.hidden_size, spec.patch_size,
                                         stride=spec.patch_size)
        self.position_embedding = nn.Embedding(self.grid ** 2, spec.hidden_size)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        # frames [B, 3, H, W] -> patches [B, (H / p) * (W / p), D]
        patches = self.patch_embedding(frames).flatten(2).transpose(1, 2)
        rows, cols = frames.shape[2] // self.patch_size, frames.shape[3] // self.patch_size
        ids = patch_positions(rows, cols, self.grid, frames.device)
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


class _Tower(nn.Module):
    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        self.embeddings = _Embeddings(spec)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(_EncoderLayer(spec) for _ in range(spec.num_layers))
        self.post_layernorm = nn.LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(frames)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)


class _Connector(nn.Module):
    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        self.scale = spec.scale_factor
        self.modality_projection = nn.Module()
        self.modality_projection.proj = nn.Linear(
            spec.hidden_size * spec.scale_factor ** 2, spec.text_hidden_size, bias=False)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """states [B, side * side, D] (side = patches per frame side) ->
        [B, (side / s)**2, text width]: token (i, j) holds the patches of rows
        i*s .. i*s+s-1 and columns j*s .. j*s+s-1, row by row, each patch's D channels
        together."""
        b, p, d = states.shape
        s = self.scale
        side = int(round(p ** 0.5))
        if side * side != p or side % s:
            raise ValueError(f"a frame of {p} patches cannot be folded by {s}")
        folded = (states.view(b, side // s, s, side // s, s, d)
                  .permute(0, 1, 3, 2, 4, 5)
                  .reshape(b, (side // s) ** 2, s * s * d))
        return self.modality_projection.proj(folded)


class Idefics3Encoder(nn.Module):
    """``forward(frames)``: frames [N, 3, S, S] (preprocessed, equal size) -> image
    token embeddings [N * tokens_per_frame(S), text width], frame after frame."""

    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        self.spec = spec
        self.vision_model = _Tower(spec)
        self.connector = _Connector(spec)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        tokens = self.connector(self.vision_model(frames))
        return tokens.reshape(-1, tokens.shape[-1])

    def encode(self, frames, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """``frames``: an image's ``idefics3.Frames``, all encoded in one run."""
        return self(frames.pixels.to(device, dtype))
