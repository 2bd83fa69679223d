"""The GGUF file as one private map, its weights read in place by the products.

Decode streams every weight from memory once per token, so how the map is paged matters:
on 4 KiB pages each page is a TLB miss (two-level walks in a VM) and the hardware
prefetchers stop at every page boundary. `MADV_HUGEPAGE` before the first touch makes the
page cache read the file in 2 MiB folios, each mapped by one PMD entry
(docs/CPU_PERFORMANCE.md, "Decode prefetch and huge pages").
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np


def map_weights(path: Path) -> np.ndarray:
    """The whole file as a writable uint8 array over a copy-on-write map (torch wants
    writable arrays; nothing reaches the file), advised for huge pages where Linux has
    them."""
    with open(path, "rb") as handle:
        buf = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(buf, dtype=np.uint8)
