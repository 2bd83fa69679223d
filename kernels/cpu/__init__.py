"""Folio's native CPU kernels: a PyTorch C++ extension built by `make setup`.

`available()` says whether the library is loaded; its ops are `torch.ops.folio_cpu.*`
(they thread through torch's own OpenMP pool). Where it was not built (no C++ compiler,
an unsupported platform) or is switched off (FOLIO_NATIVE_CPU=0), Folio runs the PyTorch
path and says so once, in the log and through `status()` (the Memory dock's device line).
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)

NATIVE_ENV = "FOLIO_NATIVE_CPU"
_HERE = Path(__file__).resolve().parent


@functools.cache
def _load() -> str | None:
    """Load the library once; None when loaded, else why it is not."""
    if os.environ.get(NATIVE_ENV, "1") == "0":
        reason = f"switched off ({NATIVE_ENV}=0)"
    else:
        built = sorted(_HERE.glob("_folio_cpu*.so")) + sorted(_HERE.glob("_folio_cpu*.pyd"))
        if not built:
            reason = ("not built (run `make setup`, or `python -m kernels.cpu.build` for an "
                      "installed Folio; it needs a C++ compiler)")
        else:
            try:
                torch.ops.load_library(str(built[0]))
                return None
            except (OSError, RuntimeError) as exc:
                reason = f"not loadable ({exc}); rebuild with `make setup`"
    log.warning("native CPU kernels %s: running the slower PyTorch path", reason)
    return reason


def available() -> bool:
    return _load() is None


def status() -> str:
    """One line for people: the kernel path in use, or why the native one is not."""
    reason = _load()
    if reason is None:
        return f"native kernels ({torch.ops.folio_cpu.isa()})"
    return f"PyTorch kernels (native {reason.split(' (')[0]})"


def ops():
    """torch.ops.folio_cpu; call only when available()."""
    return torch.ops.folio_cpu
