"""The floating dtypes Folio runs weights and the KV cache in, by name: the one table
that the engine's settings, the model builder and the memory estimates read.

torch is imported only when a name is resolved, so validating a setting stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("float32", "bfloat16", "float16")


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
