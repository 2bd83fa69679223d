"""engine/runner/heap.py: with glibc's thresholds fixed, an activation-sized tensor comes
from the heap and stays there for reuse once freed; a pool-sized one is a mapping of its
own. Checked in a fresh interpreter against the program break (the heap's end): in this
one, earlier allocations have already moved glibc's own thresholds."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

_PROBE = """
import ctypes, json, sys, torch
from engine.runner import heap

libc = ctypes.CDLL(None)
libc.sbrk.restype, libc.sbrk.argtypes = ctypes.c_void_p, [ctypes.c_long]
if sys.argv[1] == "fixed":
    assert heap.keep_freed_memory()
mib = 1 << 20
t = torch.empty(16 * mib, dtype=torch.uint8).fill_(1)
end = t.data_ptr() + 16 * mib
in_heap = end <= libc.sbrk(0)
del t
kept = libc.sbrk(0) >= end  # not trimmed off the heap once freed
pool = torch.empty(64 * mib, dtype=torch.uint8).fill_(1)
pool_in_heap = pool.data_ptr() < libc.sbrk(0)
print(json.dumps({"in_heap": in_heap, "kept": kept, "pool_in_heap": pool_in_heap}))
"""


def _probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True,
                         text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="glibc's mallopt only")
def test_activation_sized_tensors_stay_in_the_heap_and_pools_are_mappings():
    assert _probe("fixed") == {"in_heap": True, "kept": True, "pool_in_heap": False}
    # glibc's defaults in a fresh process: 16 MiB is past its first mmap threshold (128
    # KiB), a mapping faulted afresh at every allocation.
    assert _probe("default")["in_heap"] is False
