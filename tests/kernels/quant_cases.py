"""Random GGUF-quantized matrices for the quantized-kernel tests, and their oracle.

Random bytes are valid blocks of every type except in the fp16 scale fields (d, dmin, m),
where they could be inf or NaN or huge; those are overwritten with fp16 values uniform in
[-0.05, 0.05], the size of real weight scales.
"""

from __future__ import annotations

import numpy
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from kernels.quant.formats import BY_NAME, QuantFormat

# Byte offsets of each block's fp16 fields, read off gguf.quants' dequantize_blocks:
# written out here rather than taken from the kernels so a wrong offset there shows.
FP16_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}
TYPE_NAMES = list(FP16_FIELDS)


def random_quantized(name: str, n: int, k: int, seed: int = 0) -> tuple[QuantFormat,
                                                                      numpy.ndarray]:
    """(format, uint8 [n, row_bytes]) of random blocks with modest finite scales."""
    fmt = BY_NAME[name]
    rng = numpy.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n, k // fmt.block_size, fmt.block_bytes),
                          dtype=numpy.uint8)
    for offset in FP16_FIELDS[name]:
        scales = rng.uniform(-0.05, 0.05, size=blocks.shape[:2]).astype(numpy.float16)
        blocks[..., offset:offset + 2] = scales.view(numpy.uint8).reshape(*scales.shape, 2)
    return fmt, blocks.reshape(n, -1)


def oracle_weights(fmt: QuantFormat, qweight: numpy.ndarray) -> torch.Tensor:
    """float32 [n, k] from gguf's reference dequantizer."""
    return torch.from_numpy(dequantize(qweight, GGMLQuantizationType(fmt.type_id)))
