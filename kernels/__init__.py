"""Attention and KV-cache operations over a paged KV cache.

`get_backend` picks the implementation: Triton kernels on CUDA, the native C++ kernels
(kernels/cpu) on the CPU when they are built, the PyTorch reference elsewhere. This
package knows nothing of `engine`; the seam is `kernels.interface`
(`AttentionMetadata`, `allocate_kv_cache` and the four `AttentionBackend` methods
documented in `docs/INTERNALS.md`), re-exported here. Backends import the interface from
`kernels.interface`, never from this package, so that importing flows one way.
"""

from __future__ import annotations

import os

import torch

from kernels.interface import (
    AttentionBackend,
    AttentionMetadata,
    allocate_kv_cache,
    check_attention_options,
    check_sinks,
    effective_window,
)

__all__ = [
    "BACKEND_ENV",
    "BACKEND_NAMES",
    "AttentionBackend",
    "AttentionMetadata",
    "allocate_kv_cache",
    "check_attention_options",
    "check_sinks",
    "default_backend_name",
    "effective_window",
    "get_backend",
]

BACKEND_ENV = "FOLIO_ATTENTION_BACKEND"
BACKEND_NAMES = ("torch", "triton", "cpu")


def default_backend_name(device: torch.device | str) -> str:
    """Triton on CUDA; on the CPU the native kernels when built (kernels.cpu.available()),
    else the PyTorch reference; the reference on any other device (MPS)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return "triton"
    if kind == "cpu":
        from kernels import cpu

        return "cpu" if cpu.available() else "torch"
    return "torch"


def get_backend(device: torch.device | str, name: str | None = None) -> AttentionBackend:
    """default_backend_name(device) unless `name` or $FOLIO_ATTENTION_BACKEND says
    otherwise. "cpu" where the native library is not built runs the reference (kernels.cpu
    says so once in the log)."""
    choice = name or os.environ.get(BACKEND_ENV) or None
    if choice is None:
        choice = default_backend_name(device)
    if choice not in BACKEND_NAMES:
        raise ValueError(
            f"attention_backend must be one of {', '.join(BACKEND_NAMES)}, got {choice!r}"
        )
    if choice == "triton":
        from kernels.triton.backend import TritonBackend

        return TritonBackend()
    if choice == "cpu":
        from kernels import cpu

        if cpu.available():
            from kernels.cpu.attention import CpuBackend

            return CpuBackend()
    from kernels.reference.backend import TorchBackend

    return TorchBackend()
