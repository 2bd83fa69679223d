"""The bytes of one K or V element in the CPU engine's default pool (engine/runner/device.py):
float16 on the native kernels, float32 where the library is not built."""

import kernels.cpu

CPU_KV_ITEM_BYTES = 2 if kernels.cpu.available() else 4
