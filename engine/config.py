"""Engine settings, validated when built."""

from __future__ import annotations

from dataclasses import dataclass

from engine.dtypes import DTYPE_NAMES
from engine.validation import FieldChecker

BLOCK_SIZES = (8, 16, 32, 64)

_check = FieldChecker("EngineConfig")


@dataclass(slots=True)
class EngineConfig:
    block_size: int = 16
    # KV pool size: either a block count, or derived from a memory budget.
    num_gpu_blocks: int | None = None
    # KV pool budget in bytes on any device; None = the default (runner/kv_cache.py).
    kv_cache_memory_bytes: int | None = None
    # CUDA without a budget: the pool fills this share of the card's total memory, less
    # what is already in use (the weights, other processes).
    gpu_memory_utilization: float = 0.85
    num_host_blocks: int = 0  # host pool for swap preemption; 0 = recompute
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512  # per-step token budget (prefill chunk size)
    max_model_len: int | None = None  # None = the model's context length
    enable_prefix_caching: bool = True
    dtype: str = "float32"
    device: str = "cpu"
    attention_backend: str | None = None  # None = auto (triton on CUDA, torch elsewhere)
    num_threads: int | None = None  # torch CPU threads; None = torch's default
    seed: int = 0

    def __post_init__(self) -> None:
        _check.types(
            self,
            integers=("block_size", "num_gpu_blocks", "kv_cache_memory_bytes", "num_host_blocks",
                      "max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_threads",
                      "seed"),
            numbers=("gpu_memory_utilization",),
        )
        _check(self.block_size in BLOCK_SIZES, "block_size", self.block_size,
               f"one of {BLOCK_SIZES}")
        _check(self.num_gpu_blocks is None or self.num_gpu_blocks >= 1, "num_gpu_blocks",
               self.num_gpu_blocks, ">= 1 or None")
        _check(self.kv_cache_memory_bytes is None or self.kv_cache_memory_bytes > 0,
               "kv_cache_memory_bytes", self.kv_cache_memory_bytes, "> 0 or None")
        _check(0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization",
               self.gpu_memory_utilization, "in (0, 1]")
        _check(self.num_host_blocks >= 0, "num_host_blocks", self.num_host_blocks, ">= 0")
        _check(self.max_num_seqs >= 1, "max_num_seqs", self.max_num_seqs, ">= 1")
        _check(self.max_num_batched_tokens >= 1, "max_num_batched_tokens",
               self.max_num_batched_tokens, ">= 1")
        _check(self.max_model_len is None or self.max_model_len >= 1, "max_model_len",
               self.max_model_len, ">= 1 or None")
        _check(self.dtype in DTYPE_NAMES, "dtype", self.dtype, f"one of {DTYPE_NAMES}")
        _check(self.attention_backend in (None, "torch", "triton"), "attention_backend",
               self.attention_backend, "'torch', 'triton' or None")
        _check(self.num_threads is None or self.num_threads >= 1, "num_threads",
               self.num_threads, ">= 1 or None")

    @property
    def preemption_mode(self) -> str:
        return "swap" if self.num_host_blocks > 0 else "recompute"

