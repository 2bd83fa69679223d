"""Random GGUF-quantized matrices for the quantized-kernel tests, and their oracle.

Random bytes are valid blocks of every type except in the fp16 scale fields (d, dmin, m),
where they could be inf or NaN or huge; those are overwritten with fp16 values uniform in
[-0.05, 0.05], the size of real weight scales. MXFP4's E8M0 scale byte (its first) is
drawn from 118..129, scales 2^-10..2^1.
"""

from __future__ import annotations

import functools

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
# The Triton kernels also take MXFP4 (gpt-oss's experts), which the native CPU ones do not.
TRITON_TYPE_NAMES = [*TYPE_NAMES, "MXFP4"]


def random_quantized(name: str, n: int, k: int, seed: int = 0) -> tuple[QuantFormat,
                                                                      numpy.ndarray]:
    """(format, uint8 [n, row_bytes]) of random blocks with modest finite scales."""
    fmt = BY_NAME[name]
    rng = numpy.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n, k // fmt.block_size, fmt.block_bytes),
                          dtype=numpy.uint8)
    if name == "MXFP4":
        blocks[..., 0] = rng.integers(118, 130, size=blocks.shape[:2])
    for offset in FP16_FIELDS.get(name, ()):
        scales = rng.uniform(-0.05, 0.05, size=blocks.shape[:2]).astype(numpy.float16)
        blocks[..., offset:offset + 2] = scales.view(numpy.uint8).reshape(*scales.shape, 2)
    return fmt, blocks.reshape(n, -1)


def oracle_weights(fmt: QuantFormat, qweight: numpy.ndarray) -> torch.Tensor:
    """float32 [n, k] from gguf's reference dequantizer."""
    return torch.from_numpy(dequantize(qweight, GGMLQuantizationType(fmt.type_id)))


def _set_fields(blocks: numpy.ndarray, name: str, values: tuple[float, float]) -> numpy.ndarray:
    out = blocks.reshape(blocks.shape[0], -1, BY_NAME[name].block_bytes).copy()
    for offset, value in zip(FP16_FIELDS[name], values, strict=False):
        out[..., offset:offset + 2] = numpy.frombuffer(numpy.float16(value).tobytes(), numpy.uint8)
    return out.reshape(blocks.shape)


@functools.cache
def exact_case(name: str, n: int, k: int, seed: int = 0):
    """(blocks uint8 [n, row_bytes], W float32 [n, k], W* float64 [n, k], mag [n, k]) of
    random_quantized blocks. W is gguf's dequantization; W* = D s q - M o, the same weights
    computed exactly in float64 (gguf's dequantizer run with the fp16 fields set to 1 and
    0, which isolates the integer terms); mag bounds the magnitudes of the separate terms
    D s q and M o (4 (|D| max|s q| + |M| max|o|) over each 16-weight sub-block)."""
    fmt, blocks = random_quantized(name, n, k, seed=seed)
    qtype = GGMLQuantizationType(fmt.type_id)
    w = dequantize(blocks, qtype)
    a = dequantize(_set_fields(blocks, name, (1.0, 0.0)), qtype).astype(numpy.float64)
    view = blocks.reshape(n, -1, fmt.block_bytes)
    def field(offset):
        values = view[..., offset:offset + 2].copy().view(numpy.float16)[..., 0]
        return numpy.repeat(values.astype(numpy.float64), fmt.block_size, axis=1)

    fields = [field(o) for o in FP16_FIELDS[name]]
    exact = fields[0] * a
    b = numpy.zeros_like(a)
    if len(fields) == 2:
        b = dequantize(_set_fields(blocks, name, (0.0, 1.0)), qtype).astype(numpy.float64)
        exact += fields[1] * b

    def sub_max(v):
        return numpy.repeat(numpy.abs(v).reshape(n, -1, 16).max(axis=-1), 16, axis=1)
    mag = 4 * numpy.abs(fields[0]) * sub_max(a)
    if len(fields) == 2:
        mag += 4 * numpy.abs(fields[1]) * sub_max(b)
    return blocks, w, exact, mag


def round_blocks(x: numpy.ndarray, qmax: int) -> tuple[numpy.ndarray, numpy.ndarray]:
    """float32 [m, k] -> (q float32 [m, k / 32, 32], d float32 [m, k / 32]): the kernels'
    activation rounding in NumPy float32 (d = amax / qmax per 32-element block,
    q = rint(x * (1 / d)), ties to even, clamped to +-qmax, 0 where d = 0)."""
    m, k = x.shape
    blocks = x.astype(numpy.float32).reshape(m, k // 32, 32)
    d = (numpy.abs(blocks).max(axis=-1) / numpy.float32(qmax)).astype(numpy.float32)
    with numpy.errstate(divide="ignore"):
        inv = numpy.where(d == 0, numpy.float32(0), numpy.float32(1) / d).astype(numpy.float32)
    q = numpy.clip(numpy.rint(blocks * inv[..., None]), -qmax, qmax).astype(numpy.float32)
    return q, d


def check_product(y: numpy.ndarray, x: numpy.ndarray, case, xdq: numpy.ndarray,
                  dx: numpy.ndarray, label: str) -> None:
    """A kernel's product y (float64 [m, n]) of activations x (float64 [m, k]), rounded to
    xdq = dx * q (dx the block step per element), by exact_case's weights: within the
    float32 accumulation bound F of the exact integer arithmetic, and within the rounding
    bound (dx / 2 per element) plus 2F of the float64 product with gguf's weights (the
    derivations: tests/kernels/cpu/test_quant_matmul.py's docstring)."""
    _, w, exact, mag = case
    k = x.shape[1]
    bound_f = max(1e-5, (k / 32 + 16) * 2.0 ** -23) * (numpy.abs(xdq) @ mag.T)
    err = numpy.abs(y - xdq @ exact.T)
    assert (err <= bound_f + 1e-30).all(), f"{label}: {(err / bound_f).max()}"
    w64 = w.astype(numpy.float64)
    bound = 0.5 * (1 + 2.0 ** -20) * (dx @ numpy.abs(w64).T) + 2 * bound_f
    err = numpy.abs(y - x @ w64.T)
    assert (err <= bound).all(), f"{label}: {(err / bound).max()}"
