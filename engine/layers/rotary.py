"""Rotary position embedding (rotate-half layout) with default, linear and llama3 scaling.

The cos/sin tables cover every position up to max_position_embeddings, built once, so a
step only indexes them; the model looks them up once per forward and every layer reuses
them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

ROPE_TYPES = ("default", "linear", "llama3")


def rope_inv_freq(
    head_dim: int, theta: float, scaling: Mapping[str, Any] | None
) -> torch.Tensor:
    """Per-pair inverse frequencies [head_dim // 2] in float32, after the scaling rule."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    rope_type = rope_type_of(scaling)
    if rope_type == "default":
        return inv_freq
    assert scaling is not None
    factor = float(_require(scaling, "factor"))
    if rope_type == "linear":
        # Dividing the frequencies equals dividing the positions by `factor`.
        return inv_freq / factor
    return _llama3_inv_freq(inv_freq, factor, scaling)


def _llama3_inv_freq(
    inv_freq: torch.Tensor, factor: float, scaling: Mapping[str, Any]
) -> torch.Tensor:
    """Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, and the band
    between them interpolated smoothly."""
    low_freq_factor = float(_require(scaling, "low_freq_factor"))
    high_freq_factor = float(_require(scaling, "high_freq_factor"))
    original_context = float(_require(scaling, "original_max_position_embeddings"))
    if high_freq_factor <= low_freq_factor:
        raise ValueError(
            "rope_scaling.high_freq_factor must exceed low_freq_factor, got "
            f"{high_freq_factor} <= {low_freq_factor}"
        )
    low_freq_wavelen = original_context / low_freq_factor
    high_freq_wavelen = original_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    slowed = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * slowed / factor + smooth * slowed
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, blended, slowed)


def rope_type_of(scaling: Mapping[str, Any] | None) -> str:
    """The scaling rule's name; configs spell it `rope_type` (or `type` in older files)."""
    if not scaling:
        return "default"
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"rope_scaling type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
        )
    return str(rope_type)


def _require(scaling: Mapping[str, Any], key: str) -> Any:
    if scaling.get(key) is None:
        raise ValueError(f"rope_scaling.{key} is required for rope type {rope_type_of(scaling)!r}")
    return scaling[key]


class RotaryEmbedding(nn.Module):
    def __init__(
        self,
        head_dim: int,
        max_position: int,
        theta: float,
        scaling: Mapping[str, Any] | None,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        if head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embedding, got {head_dim}")
        self.max_position = max_position
        inv_freq = rope_inv_freq(head_dim, theta, scaling)
        # Angles in float32 (as the reference models compute them), then one cast to the
        # activation dtype, which is where the reference casts them too.
        angles = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        cos, sin = angles.cos(), angles.sin()
        # Full head width, with the sign of the rotate-half pairing folded into sin, so that
        # apply_rotary is two multiplies and one add on the whole head: x * cos +
        # swap_halves(x) * sin, where the first half of sin is negated.
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", torch.cat((cos, cos), dim=-1).to(dtype=dtype, device=device),
                             persistent=False)
        self.register_buffer("sin", torch.cat((-sin, sin), dim=-1).to(dtype=dtype, device=device),
                             persistent=False)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin for each position, shaped [T, 1, head_dim] to broadcast over heads."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate [T, heads, head_dim] by the angles of its positions (rotate-half pairing:
    element i pairs with element i + head_dim // 2); cos/sin from RotaryEmbedding.lookup.

    Written as few ops as it can be: at one token per step each op's fixed cost, not its
    arithmetic, is what a decode step pays, 30 layers over."""
    swapped = x.unflatten(-1, (2, x.shape[-1] // 2)).flip(-2).flatten(-2)
    return torch.addcmul(x * cos, swapped, sin)
