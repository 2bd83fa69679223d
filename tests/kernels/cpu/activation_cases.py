"""Activation rows for the CPU quantized-product tests, and what the op's quantized bytes
mean (read back through conftest's numpy model of quantize_activations)."""

from __future__ import annotations

import numpy as np
import torch


def activations(m: int, k: int, seed: int) -> torch.Tensor:
    """float32 [m, k]: normal values, each row at its own scale (1 to 2)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=gen) * (1 + torch.rand(m, 1, generator=gen))


def dequantized_act(act: torch.Tensor, k: int, act_model):
    """(dx_b * q_i float64 [m, k], dx_b per element float64 [m, k]) from the op's bytes."""
    q, d, _ = act_model[1](act.numpy(), k)
    dx = np.repeat(d[:, :k // 32].astype(np.float64), 32, axis=1)
    return dx * q[:, :k], dx
