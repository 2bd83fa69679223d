"""Process and device memory, for the VRAM panel."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

import torch


@dataclass(slots=True, frozen=True)
class MemoryStats:
    device: str  # for people: "CUDA 0: NVIDIA H200", "CPU" (runner/device.py)
    weights_bytes: int
    kv_pool_bytes: int
    device_total_bytes: int | None  # CUDA only
    device_used_bytes: int | None
    device_free_bytes: int | None
    process_rss_bytes: int
    # A mixture of experts: the bytes of its experts, part of weights_bytes; None otherwise.
    expert_bytes: int | None = None

    @property
    def other_bytes(self) -> int | None:
        """Device memory used by neither the weights nor the KV pool (activations,
        the CUDA context, other processes)."""
        if self.device_used_bytes is None:
            return None
        return max(0, self.device_used_bytes - self.weights_bytes - self.kv_pool_bytes)


def process_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak is the best the standard library offers
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_stats(device: torch.device, weights_bytes: int, kv_pool_bytes: int,
                 label: str | None = None, expert_bytes: int | None = None) -> MemoryStats:
    """`label` names the device for the memory panel; without it, torch's name."""
    total = used = free = None
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        used = total - free
    return MemoryStats(label or str(device), weights_bytes, kv_pool_bytes, total, used, free,
                       process_rss_bytes(), expert_bytes)
