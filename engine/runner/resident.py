"""How much of a tensor's memory the OS holds: the resident part of the KV pool.

On the CPU the pool is an anonymous mapping whose pages exist only once a block is
written into them (kernels.allocate_kv_cache), so its size is what it may grow to, not
what it costs. mincore(2) (Linux, macOS, the BSDs) reports each page of a range as
resident or not: the same pages the process's RSS counts, and it reads only the page
tables, so it neither touches the pool nor allocates anything but a byte per page. It
walks every page of the range, though, which is why the worker measures at most every
few seconds (engine/worker.py). Where there is no mincore (Windows) the answer is None and
the memory panel says so. Device memory (CUDA) is committed when it is allocated: all of
it is resident.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
from collections.abc import Iterable

import torch

PAGE_SIZE = mmap.PAGESIZE
# mincore's byte per page: bit 0 is "resident"; macOS sets other bits (referenced,
# modified, paged out) that say nothing about residency.
_RESIDENT_BIT = bytes(i & 1 for i in range(256))


@functools.cache
def _mincore():
    """libc's mincore with its argument types, or None where the C library has none."""
    if os.name != "posix":
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).mincore
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def resident_range_bytes(address: int, length: int) -> int | None:
    """Resident bytes of the pages spanning [address, address + length), or None when
    they cannot be measured here (no mincore, or a range the OS will not report on)."""
    if length <= 0:
        return 0
    mincore = _mincore()
    if mincore is None:
        return None
    start = address - address % PAGE_SIZE
    span = address + length - start
    pages = -(-span // PAGE_SIZE)
    flags = bytearray(pages)
    view = (ctypes.c_ubyte * pages).from_buffer(flags)
    try:
        failed = mincore(start, span, view) != 0
    finally:
        del view  # the bytearray cannot be used while a ctypes view holds its buffer
    if failed:
        return None
    return flags.translate(_RESIDENT_BIT).count(1) * PAGE_SIZE


def resident_bytes(tensors: Iterable[torch.Tensor]) -> int | None:
    """Resident bytes of the storages behind `tensors` (each storage counted once, views
    included), or None when a CPU storage's residency cannot be measured here."""
    total, seen = 0, set()
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        if tensor.device.type != "cpu":
            total += storage.nbytes()
            continue
        resident = resident_range_bytes(storage.data_ptr(), storage.nbytes())
        if resident is None:
            return None
        # A storage that does not start on a page shares its edge pages with others.
        total += min(resident, storage.nbytes())
    return total
