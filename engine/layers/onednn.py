"""oneDNN's packed weight layout for float32 linears on CPU.

PyTorch ships oneDNN (formerly MKL-DNN) for its own compiler and exposes the two ops used
here: one reorders a [out, in] matrix into oneDNN's blocked layout, the other multiplies by
it. Measured on the 2-core AVX2 development machine (shared/PERF-NOTES.md), the starter's 30
layers of q/k/v, o, gate/up and down matmuls per step, median of interleaved runs:

    rows   (W @ x.T).T, one row padded to two   oneDNN packed
    1      28.5 ms                               26.0 ms
    2      32.2 ms                               31.2 ms
    16     60.4 ms                               56.8 ms
    64     222.9 ms (F.linear)                   139.3 ms
    512    938.7 ms (F.linear)                   877.3 ms

(4 rows is the exception: 33.9 vs 42.2 ms.) It is also one op returning a contiguous
[T, out] result where the padded product needed five, which matters as much at one row:
a decode step on CPU pays a fixed cost per op, 120 matmuls over. The LM head gains at 8
rows and more (49,152 x 576: 9.0 vs 15.3 ms at 8 rows) and ties at one.

The packed copy holds the same bytes as the matrix, so a layer keeps only the packed one.
The ops are private to PyTorch: everything here falls back to None (callers keep the
plain matrix) when they are missing or fail on a probe.
"""

from __future__ import annotations

import functools
import logging

import torch

log = logging.getLogger(__name__)


@functools.cache
def available() -> bool:
    """Whether this PyTorch build can pack and multiply (probed once on a tiny matrix)."""
    if LINEAR_OP is None:
        return False
    try:
        weight = torch.arange(12, dtype=torch.float32).view(3, 4)
        x = torch.ones(2, 4)
        out = LINEAR_OP(x, torch.ops.mkldnn._reorder_linear_weight(weight), None, *NO_POST_OP)
        return bool(torch.equal(out, torch.nn.functional.linear(x, weight)))
    except (AttributeError, RuntimeError, NotImplementedError) as error:
        log.info("oneDNN packed linears unavailable (%s); using plain matmuls", error)
        return False


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """The packed copy of a [out, in] float32 CPU matrix; None where packing does not apply
    (another dtype or device, or no oneDNN)."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or not available():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def _linear_op():
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


# x @ W.T + bias for W packed by `pack`, [..., in] -> contiguous [..., out]:
# LINEAR_OP(x, packed, bias, *NO_POST_OP). Called bare, with no wrapper, because it runs
# 121 times per decode step. None in builds without it (available() is then False).
LINEAR_OP = _linear_op()
NO_POST_OP = ("none", [], "")


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """The plain [out, in] matrix back from its packed copy."""
    return packed.to_dense()
