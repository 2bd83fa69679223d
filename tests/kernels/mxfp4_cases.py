"""Random MXFP4 matrices (GGUF type 39) and the format's definition in NumPy, for the
native kernel's tests and the MoE block's."""

from __future__ import annotations

import numpy as np

MXFP4 = 39
# E2M1's values doubled (ggml's kvalues_mxfp4), the weights' integers.
VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float64)


def random_mxfp4(n: int, k: int, seed: int, exponents=(118, 127)) -> np.ndarray:
    """uint8 [n, k / 32 * 17]: random codes, scales 2^(e - 128) for e in [lo, hi)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n, k // 32, 17), dtype=np.uint8)
    blocks[..., 0] = rng.integers(*exponents, size=(n, k // 32))
    return blocks.reshape(n, -1)


def model_weights(blocks: np.ndarray, k: int) -> np.ndarray:
    """float64 [n, k]: the format's definition (a code's value doubled, times 2^(e - 128))."""
    n = blocks.shape[0]
    view = blocks.reshape(n, k // 32, 17)
    codes = np.concatenate([view[..., 1:] & 0x0F, view[..., 1:] >> 4], axis=-1)
    scale = np.ldexp(1.0, view[..., 0].astype(np.int64) - 128)
    return (VALUES[codes] * scale[..., None]).reshape(n, k)
