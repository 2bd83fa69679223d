"""Keep the C heap's freed memory for the next step (Linux with glibc).

A prefill allocates the same large activation tensors at every layer and every prompt
(a 512-token chunk of a 1B model: 4-32 MiB each). glibc serves allocations above its
mmap threshold (128 KiB at first, then raised as mmapped chunks are freed) with fresh
mappings and returns freed heap tops past its trim threshold to the kernel, so whether
those tensors come back as already-touched memory depends on the process's allocation
history. When they do not, every page is faulted and zeroed again: a 1B 512-token
prefill took 130,000-270,000 page faults, 10-20% of its time, in one process and none in
the next. llama.cpp allocates its compute buffers once; here glibc's thresholds are
fixed instead: allocations under 32 MiB (its largest mmap threshold) come from the heap,
which keeps up to 256 MiB free for reuse. Larger ones (a KV pool, dense weights) are
still their own mappings, returned to the system as soon as they are freed, so a model
switch still gives their memory back. The native decoder layer keeps a prefill's largest
tensor, the gate/up product, under the threshold by running its MLP in row chunks
(kernels/cpu/csrc/fused/decoder_layer.cpp).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform

log = logging.getLogger(__name__)

# mallopt's parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit platforms
TRIM_THRESHOLD = 256 << 20


@functools.cache
def keep_freed_memory() -> bool:
    """Fix glibc's heap thresholds once per process; False where this is not glibc (the
    C library's own policy then applies) or where it refused."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
    if not done:
        log.warning("glibc refused the heap thresholds; prefill may fault its pages again")
    return done
