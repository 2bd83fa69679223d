"""Qwen3.5's vision tower in PyTorch: one image's patches in, one row of text-model
embeddings per image token out, in one run.

Matched to transformers' ``Qwen3_5VisionModel`` (models/qwen3_5/modeling_qwen3_5.py):
- the patches come flattened as the processor writes them (qwen35.py ``patchify``):
  each row one patch's (channel, temporal copy, row, column) pixels, the rows in
  merge-block order (each ``merge x merge`` square of patches together, squares row by
  row); the patch embedding is the checkpoint's Conv3d, applied as the matrix it is
  (its kernel equals its stride, so it sees each patch once);
- learned absolute positions: the square ``side x side`` table resampled to the image's
  patch grid (bilinear, corners aligned) and added;
- 2-D rotary positions in every block: a head's first half of frequencies turns by the
  patch's row, the second by its column (rotate-half pairing over the whole head);
- pre-norm blocks (LayerNorm, bidirectional attention with a fused qkv, LayerNorm,
  MLP), no deepstack taps (Qwen3-VL's; Qwen3.5 has none);
- the merger: LayerNorm per patch, each merge square's patches side by side, an MLP to
  the text model's width.

Parameter names are the checkpoint's under ``model.visual.``, so a folder's tensors load
by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

_ACTS = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}


@dataclass(slots=True, frozen=True)
class Qwen35TowerSpec:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    num_position_embeddings: int
    out_hidden_size: int
    hidden_act: str
    rope_theta: float
    in_channels: int = 3

    @classmethod
    def of(cls, vision) -> Qwen35TowerSpec:
        """From a ``Qwen3_5VisionConfig`` (transformers' object)."""
        rope = dict(getattr(vision, "rope_parameters", None) or {})
        spec = cls(int(vision.depth), int(vision.hidden_size), int(vision.intermediate_size),
                   int(vision.num_heads), _side(vision.patch_size),
                   _side(vision.temporal_patch_size), int(vision.spatial_merge_size),
                   int(vision.num_position_embeddings), int(vision.out_hidden_size),
                   str(vision.hidden_act), float(rope.get("rope_theta", 10000.0)),
                   int(getattr(vision, "in_channels", 3)))
        if spec.hidden_act not in _ACTS:
            raise ValueError(f"vision_config.hidden_act: {spec.hidden_act!r} is not supported "
                             f"({', '.join(_ACTS)})")
        if spec.hidden_size % spec.num_heads or (spec.hidden_size // spec.num_heads) % 4:
            raise ValueError("vision_config.num_heads: the head width must be a multiple of 4")
        return spec

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2


def _side(value) -> int:
    return int(value[0] if isinstance(value, list | tuple) else value)


class _PatchEmbed(nn.Module):
    def __init__(self, spec: Qwen35TowerSpec) -> None:
        super().__init__()
        kernel = (spec.temporal_patch_size, spec.patch_size, spec.patch_size)
        self.proj = nn.Conv3d(spec.in_channels, spec.hidden_size, kernel, stride=kernel)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        # patches [N, C * T * p * p] -> [N, D]: the kernel covers each patch exactly once.
        weight = self.proj.weight.reshape(self.proj.weight.shape[0], -1)
        return F.linear(patches, weight, self.proj.bias)


class _Attention(nn.Module):
    def __init__(self, spec: Qwen35TowerSpec) -> None:
        super().__init__()
        self.num_heads = spec.num_heads
        self.qkv = nn.Linear(spec.hidden_size, 3 * spec.hidden_size)
        self.proj = nn.Linear(spec.hidden_size, spec.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x [N, D] -> q, k, v [1, H, N, D / H]; every patch of the image sees every other.
        n, d = x.shape
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, d // self.num_heads).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        heads = [t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*heads)
        return self.proj(out[0].transpose(0, 1).reshape(n, d))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, d] turned by cos, signed sin [N, 1, d] (rotate-half pairing), in float32
    as the reference does."""
    swapped = x.float().unflatten(-1, (2, x.shape[-1] // 2)).flip(-2).flatten(-2)
    return torch.addcmul(x.float() * cos, swapped, sin).to(x.dtype)


class _MLP(nn.Module):
    def __init__(self, spec: Qwen35TowerSpec) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(spec.hidden_size, spec.intermediate_size)
        self.linear_fc2 = nn.Linear(spec.intermediate_size, spec.hidden_size)
        self.approximate = _ACTS[spec.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate=self.approximate))


class _Block(nn.Module):
    def __init__(self, spec: Qwen35TowerSpec) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(spec.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(spec.hidden_size, eps=1e-6)
        self.attn = _Attention(spec)
        self.mlp = _MLP(spec)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class _Merger(nn.Module):
    def __init__(self, spec: Qwen35TowerSpec) -> None:
        super().__init__()
        wide = spec.hidden_size * spec.merge_size ** 2
        self.norm = nn.LayerNorm(spec.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(wide, wide)
        self.linear_fc2 = nn.Linear(wide, spec.out_hidden_size)

    def forward(self, x: torch.Tensor, group: int) -> torch.Tensor:
        # x [N, D] in merge-block order -> [N / group, out]: a square's patches side by side.
        folded = self.norm(x).reshape(-1, x.shape[-1] * group)
        return self.linear_fc2(F.gelu(self.linear_fc1(folded)))


class _Visual(nn.Module):
    def __init__(self, spec: Qwen35TowerSpec) -> None:
        super().__init__()
        self.spec = spec
        self.patch_embed = _PatchEmbed(spec)
        self.pos_embed = nn.Embedding(spec.num_position_embeddings, spec.hidden_size)
        self.side = int(round(spec.num_position_embeddings ** 0.5))
        self.blocks = nn.ModuleList(_Block(spec) for _ in range(spec.depth))
        self.merger = _Merger(spec)
        half = spec.hidden_size // spec.num_heads // 2
        self.inv_freq = 1.0 / spec.rope_theta ** (torch.arange(0, half, 2).float() / half)

    def forward(self, patches: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        x = self.patch_embed(patches)
        x = x + self.positions(rows, cols).to(x.dtype)
        cos, sin = self.rotary(rows, cols, x.device)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.merger(x, self.spec.merge_size ** 2)

    def positions(self, rows: int, cols: int) -> torch.Tensor:
        """The learned table resampled to the rows x cols patch grid [rows * cols, D], in
        merge-block order."""
        d = self.pos_embed.weight.shape[1]
        table = self.pos_embed.weight.float().t().reshape(1, d, self.side, self.side)
        grid = F.interpolate(table, size=(rows, cols), mode="bilinear", align_corners=True)
        return merge_order(grid[0].permute(1, 2, 0), self.spec.merge_size).reshape(-1, d)

    def rotary(self, rows: int, cols: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin [N, 1, head_dim] of each patch (merge-block order): the first
        half's frequencies turned by its row, the second's by its column, float32."""
        ys, xs = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        place = merge_order(torch.stack((ys, xs), -1), self.spec.merge_size).reshape(-1, 2)
        angles = (place[:, :, None].float() * self.inv_freq).flatten(1)  # [N, half]
        cos, sin = angles.cos(), angles.sin()
        cos = torch.cat((cos, cos), -1)[:, None].to(device)
        sin = torch.cat((-sin, sin), -1)[:, None].to(device)
        return cos, sin


def merge_order(grid: torch.Tensor, merge: int) -> torch.Tensor:
    """grid [rows, cols, ...] -> [rows / m, cols / m, m, m, ...]: each m x m square's
    cells together, squares row by row (the order the processor writes patches in)."""
    rows, cols = grid.shape[:2]
    rest = grid.shape[2:]
    return (grid.reshape(rows // merge, merge, cols // merge, merge, *rest)
            .transpose(1, 2))


class Qwen35Encoder(nn.Module):
    """``encode(image)``: a ``qwen35.PatchGrid`` -> image token embeddings
    [rows * cols / merge**2, text width], token by token in row-major order of the merged
    grid."""

    def __init__(self, spec: Qwen35TowerSpec) -> None:
        super().__init__()
        self.spec = spec
        self.visual = _Visual(spec)

    def forward(self, patches: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        return self.visual(patches, rows, cols)

    def encode(self, grid, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self(grid.pixels.to(device, dtype), grid.rows, grid.cols)
