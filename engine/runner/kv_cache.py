"""The KV pool's shape and size: how many bytes a token and a block take, and how many
blocks the engine allocates for a given configuration and device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.models.spec import kv_bytes_per_token

CPU_DEFAULT_KV_BYTES = 1 << 30  # 1 GiB: ~23k tokens of the starter model in fp32
# With the default CPU budget, a small model needs no more than this many full contexts.
CPU_DEFAULT_MAX_CONTEXTS = 8


@dataclass(slots=True, frozen=True)
class KVShape:
    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int
    dtype: torch.dtype

    @classmethod
    def from_spec(cls, spec, block_size: int, dtype: torch.dtype) -> KVShape:
        """From the model's DecoderSpec, which already resolved the config's head sizes."""
        return cls(spec.num_layers, spec.num_kv_heads, spec.head_dim, block_size, dtype)

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_size,
                                  self.dtype.itemsize)

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size


def num_blocks_for(
    config: EngineConfig, shape: KVShape, device: torch.device, max_model_len: int
) -> int:
    """The KV pool size: an explicit block count, a byte budget, or (CUDA) a share of
    the memory still free once the weights are loaded. The CPU default budget is capped
    at a few full contexts, so a small model does not reserve a gigabyte it never uses."""
    if config.num_gpu_blocks is not None:
        return config.num_gpu_blocks
    budget = config.kv_cache_memory_bytes
    if budget is None and device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        in_use = total - free
        budget = int(total * config.gpu_memory_utilization) - in_use
    capped = budget is None
    if budget is None:
        budget = CPU_DEFAULT_KV_BYTES
    num_blocks = budget // shape.bytes_per_block
    if capped:
        num_blocks = min(num_blocks, -(-CPU_DEFAULT_MAX_CONTEXTS * max_model_len
                                       // shape.block_size))
    if num_blocks < 1:
        raise ValueError(
            f"kv_cache_memory_bytes: {budget} bytes hold no KV block of "
            f"{shape.bytes_per_block} bytes; give the KV cache more memory"
        )
    return int(num_blocks)
