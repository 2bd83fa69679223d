"""Attention and KV-cache operations over a paged KV cache.

`get_backend` picks the implementation: Triton kernels on CUDA, the PyTorch reference
elsewhere. This package knows nothing of `engine`; the seam is `kernels.interface`
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
    effective_window,
)

__all__ = [
    "BACKEND_ENV",
    "BACKEND_NAMES",
    "AttentionBackend",
    "AttentionMetadata",
    "allocate_kv_cache",
    "check_attention_options",
    "effective_window",
    "get_backend",
]

BACKEND_ENV = "FOLIO_ATTENTION_BACKEND"
BACKEND_NAMES = ("torch", "triton")


def get_backend(device: torch.device | str, name: str | None = None) -> AttentionBackend:
    """Triton on CUDA, the PyTorch reference elsewhere; `name` or $FOLIO_ATTENTION_BACKEND
    override the choice."""
    choice = name or os.environ.get(BACKEND_ENV) or None
    if choice is None:
        choice = "triton" if torch.device(device).type == "cuda" else "torch"
    if choice not in BACKEND_NAMES:
        raise ValueError(
            f"attention_backend must be one of {', '.join(BACKEND_NAMES)}, got {choice!r}"
        )
    if choice == "triton":
        from kernels.triton.backend import TritonBackend

        return TritonBackend()
    from kernels.reference import TorchBackend

    return TorchBackend()
