"""oneDNN's packed weight layout for float32 linears on CPU.

PyTorch ships oneDNN (formerly MKL-DNN) for its own compiler and exposes the two ops used
here: one reorders a [out, in] matrix into oneDNN's blocked layout, the other multiplies by
it. On the CPUs we measured, the packed multiply beats both the plain F.linear and the
padded (W @ x.T).T product at most batch sizes of a decode or prefill step (README,
"Performance", has the figures). It is also one op returning a contiguous [T, out]
result where the padded product needed five, which matters as much at one row: a decode
step on CPU pays a fixed cost per op, 120 matmuls over.

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
