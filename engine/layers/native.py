"""When a layer runs Folio's fused native CPU ops (kernels/cpu) instead of its PyTorch
code: float32 tensors on the CPU with the library loaded. Everything else (CUDA,
bfloat16, the library not built or FOLIO_NATIVE_CPU=0) keeps the PyTorch path.

On the CPU a decode step of a small model is dominated by the fixed cost of each eager
op, so the fused ops (one per norm, per residual add + norm, per gated activation, per
rotary + KV write) are what cut a step's time, not their arithmetic."""

from __future__ import annotations

import torch

from kernels import cpu
from kernels.cpu.attention import POOL_DTYPES


def fused_cpu(*tensors: torch.Tensor) -> bool:
    # A plain loop over `is_cpu`: this runs about 400 times per decode step, where a
    # generator and a device object per tensor were a measurable share of the Python.
    for t in tensors:
        if t.dtype != torch.float32 or not t.is_cpu:
            return False
    return cpu.available()


def native_pool(k_cache: torch.Tensor) -> bool:
    """A KV pool the native attention ops read and write from float32 rows, on the CPU:
    float32, float16 (the native backend's default), or a quantized format's storage
    (int8, fp8, int4: kernels/kv_format.py), written quantized and read in place."""
    return k_cache.is_cpu and k_cache.dtype in POOL_DTYPES


def native_ops():
    """torch.ops.folio_cpu; call only where fused_cpu(...) holds."""
    return cpu.ops()
