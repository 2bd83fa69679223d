"""The dtypes Folio runs weights and the KV cache in, by name: the one table that the
engine's settings, the model builder and the memory estimates read.

Weights and compute take the floating dtypes (`DTYPE_NAMES`); the KV cache takes those
and the quantized formats of kernels/kv_format.py (`KV_DTYPE_NAMES`, the same names as
its ``KV_FORMAT_NAMES``, kept here so that validating a setting imports no torch; a test
holds the two equal). torch is imported only when a name is resolved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from kernels.kv_format import KVFormat

DTYPE_NAMES = ("float32", "bfloat16", "float16")
KV_DTYPE_NAMES = (*DTYPE_NAMES, "int8", "fp8", "int4")


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A supported dtype given as itself or by name; ValueError naming the choices."""
    import torch

    table = {name: getattr(torch, name) for name in DTYPE_NAMES}
    if isinstance(dtype, torch.dtype) and dtype in table.values():
        return dtype
    if isinstance(dtype, str) and dtype in table:
        return table[dtype]
    raise ValueError(f"dtype must be a floating torch dtype Folio runs, or its name: one of "
                     f"{', '.join(DTYPE_NAMES)}; got {dtype!r}")


def dtype_itemsize(dtype: torch.dtype | str) -> int:
    return resolve_dtype(dtype).itemsize


def kv_format_of(kv_dtype: torch.dtype | str) -> KVFormat:
    """The KV format of a pool's storage dtype or of a kv_cache_dtype name (ValueError
    naming ``kv_cache_dtype`` otherwise)."""
    import torch

    from kernels.kv_format import format_named, format_stored_as

    if isinstance(kv_dtype, torch.dtype):
        try:
            return format_stored_as(kv_dtype)
        except ValueError:
            raise ValueError(f"kv_cache_dtype must be a dtype a KV pool keeps its rows as, "
                             f"got {kv_dtype}") from None
    return format_named(kv_dtype)
