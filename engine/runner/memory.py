"""Process and device memory, for the memory panel."""

from __future__ import annotations

import os
import resource
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.runner.resident import resident_bytes


@dataclass(slots=True, frozen=True)
class MemoryStats:
    device: str  # for people: "CUDA 0: NVIDIA H200", "CPU" (runner/device.py)
    weights_bytes: int
    kv_pool_bytes: int  # reserved: the pool's whole size
    device_total_bytes: int | None  # CUDA only
    device_used_bytes: int | None
    device_free_bytes: int | None
    process_rss_bytes: int
    # The pool's pages the OS holds (runner/resident.py): on the CPU only blocks written
    # so far, on CUDA all of it. None where it cannot be measured.
    kv_pool_resident_bytes: int | None = None
    # A mixture of experts: the bytes of its experts, part of weights_bytes; None otherwise.
    expert_bytes: int | None = None
    # A hybrid model's linear-attention state pool (runner/state_pool.py), reserved beside
    # the KV pool; 0 without linear layers.
    state_pool_bytes: int = 0
    # The KV pool's format by name (kv_cache_dtype: "float16", "int8", ...) and the bytes
    # one token of context takes in it across every KV layer (a quantized format's scales
    # included); "" and 0 where no pool is given.
    kv_dtype: str = ""
    kv_bytes_per_token: int = 0
    # A vision model's encoded images kept by content (engine/vision/inputs.py); 0 else.
    encoder_cache_bytes: int = 0

    @property
    def other_bytes(self) -> int | None:
        """What the weights and the pool's resident part leave of the memory in use: on
        CUDA the device's (activations, the CUDA context, other processes), on the CPU
        the process's RSS (libraries, the tokenizer, activations). None when the pool's
        residency is unknown, rather than a figure that counts its reserve as used."""
        if self.kv_pool_resident_bytes is None:
            return None
        used = (self.device_used_bytes if self.device_used_bytes is not None
                else self.process_rss_bytes)
        return max(0, used - self.weights_bytes - self.kv_pool_resident_bytes
                   - self.state_pool_bytes - self.encoder_cache_bytes)


def process_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak is the best the standard library offers
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_stats(device: torch.device, weights_bytes: int, kv_pools: Sequence[torch.Tensor],
                 label: str | None = None, expert_bytes: int | None = None,
                 state_pool_bytes: int = 0, kv_dtype: str = "",
                 kv_bytes_per_token: int = 0, encoder_cache_bytes: int = 0) -> MemoryStats:
    """`kv_pools`: the KV pool tensors (one per KV group); `label` names the device for
    the memory panel, without it torch's name; `kv_dtype` and `kv_bytes_per_token` as
    the engine's KVShape gives them."""
    total = used = free = None
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        used = total - free
    reserved = sum(pool.numel() * pool.element_size() for pool in kv_pools)
    return MemoryStats(label or str(device), weights_bytes, reserved, total, used, free,
                       process_rss_bytes(), resident_bytes(kv_pools), expert_bytes,
                       state_pool_bytes, kv_dtype, kv_bytes_per_token, encoder_cache_bytes)
