"""A Q4_K quantizer for test files (gguf-py dequantizes K-quants but cannot write them):
llama.cpp's block layout, with a plain min/max fit per 32-value sub-block instead of its
search, so weights come back within one 4-bit step (and the 6-bit scales' rounding) of
their values; gguf's dequantize reads the blocks back, the oracle of the tests."""

from __future__ import annotations

import numpy as np

BLOCK = 256  # values per super-block
_SUB = 32  # values per sub-block, 8 to a super-block


def quantize_q4_k(weights: np.ndarray) -> np.ndarray:
    """float [..., k] (k a multiple of 256) -> uint8 [..., k / 256 * 144]."""
    shape = weights.shape
    if shape[-1] % BLOCK:
        raise ValueError(f"Q4_K rows need a multiple of {BLOCK} values, got {shape[-1]}")
    x = weights.reshape(-1, 8, _SUB).astype(np.float32)
    low = np.minimum(x.min(-1), 0.0)
    step = np.maximum(x.max(-1) - low, 1e-12) / 15  # [blocks, 8]
    d = (step.max(-1) / 63).astype(np.float16)
    dmin = ((-low).max(-1) / 63).astype(np.float16)
    d32 = np.maximum(d.astype(np.float32), 1e-12)[:, None]
    dmin32 = np.maximum(dmin.astype(np.float32), 1e-12)[:, None]
    scales = np.clip(np.rint(step / d32), 1, 63).astype(np.uint8)
    mins = np.clip(np.rint(-low / dmin32), 0, 63).astype(np.uint8)
    a = (d.astype(np.float32)[:, None] * scales)[..., None]
    b = (dmin.astype(np.float32)[:, None] * mins)[..., None]
    q = np.clip(np.rint((x + b) / np.maximum(a, 1e-12)), 0, 15).astype(np.uint8)
    packed = np.zeros((x.shape[0], 12), np.uint8)
    packed[:, :4] = scales[:, :4] | ((scales[:, 4:] >> 4) << 6)
    packed[:, 4:8] = mins[:, :4] | ((mins[:, 4:] >> 4) << 6)
    packed[:, 8:] = (scales[:, 4:] & 0xF) | ((mins[:, 4:] & 0xF) << 4)
    # Each 32 bytes hold sub-blocks 2i (low nibbles) and 2i + 1 (high nibbles).
    pairs = q.reshape(-1, 4, 2, _SUB)
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    blocks = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                             packed, qs], axis=1)
    return blocks.reshape(*shape[:-1], shape[-1] // BLOCK * 144)
