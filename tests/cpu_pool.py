"""The CPU engine's default KV pool (engine/runner/device.py): int8 in 64-token blocks on
the native kernels, float32 in 16-token blocks where the library is not built. Tests that
name 16-token blocks get float16 on the native kernels (CPU_KV_ITEM_BYTES)."""

import kernels.cpu

NATIVE = kernels.cpu.available()
CPU_KV_FORMAT = "int8" if NATIVE else "float32"
CPU_BLOCK_SIZE = 64 if NATIVE else 16
# One K or V element's bytes in a CPU pool of 16-token blocks.
CPU_KV_ITEM_BYTES = 2 if NATIVE else 4


def cpu_kv_bytes_per_token(kv_layers: int, kv_heads: int, head_dim: int) -> int:
    """A token's KV bytes in the default CPU pool."""
    from engine.models.spec import kv_bytes_per_token

    return kv_bytes_per_token(kv_layers, kv_heads, head_dim, CPU_KV_FORMAT)
