"""Multimodal rotary positions (Qwen3.5's interleaved M-RoPE): each rotary frequency
turns by one of a token's three positions (time, height, width).

``sections`` = (t, h, w) counts of frequencies, interleaved as transformers' Qwen3.5
text rotary lays them out: frequency i follows height when i % 3 == 1 and i < 3 * h,
width when i % 3 == 2 and i < 3 * w, time otherwise. A text token has one position for
all three, so a step of text only (positions [T]) is the plain table lookup; a step
holding image tokens passes positions [3, T] (engine/core/mrope.py computes both).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.layers.rotary import RotaryEmbedding


def section_axes(sections: Sequence[int], num_freqs: int) -> torch.Tensor:
    """The axis (0 time, 1 height, 2 width) each of ``num_freqs`` frequencies follows."""
    axes = torch.zeros(num_freqs, dtype=torch.int64)
    for axis in (1, 2):
        if axis < len(sections):
            axes[axis:min(3 * int(sections[axis]), num_freqs):3] = axis
    return axes


class MRopeEmbedding(RotaryEmbedding):
    def __init__(self, rotary_dim: int, max_position: int, theta: float, scaling,
                 sections: Sequence[int], dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__(rotary_dim, max_position, theta, scaling, dtype, device)
        axes = section_axes(sections, rotary_dim // 2)
        # The table's columns: cos(i) and its rotate-half twin i + rotary_dim / 2.
        self.axes: torch.Tensor
        self.register_buffer("axes", torch.cat((axes, axes)).to(device), persistent=False)

    def lookup(self, positions: torch.Tensor,
               meta: object = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin [T, 1, rotary_dim]; ``positions`` [T] (text) or [3, T]."""
        if positions.dim() == 1:
            return super().lookup(positions, meta)
        columns = torch.arange(self.axes.shape[0], device=positions.device)
        # [3, T, D] gathered per axis, then each column from its own axis: [T, D].
        cos = self.cos[positions][self.axes, :, columns].t()
        sin = self.sin[positions][self.axes, :, columns].t()
        return cos.unsqueeze(1), sin.unsqueeze(1)
