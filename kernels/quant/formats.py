"""The GGUF (llama.cpp) block types Folio keeps quantized in memory.

A quantized [N, K] matrix is stored row by row; each row is K / block_size blocks of
block_bytes bytes, so the whole matrix is a uint8 tensor [N, K / block_size * block_bytes]
and rows stay independent (rows can be stacked, permuted and gathered as byte rows).

The byte layout of each block is llama.cpp's (ggml-common.h); the reference dequantizer
is `gguf.quants.dequantize`, which the tests use as the oracle.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class QuantFormat:
    name: str
    type_id: int  # GGMLQuantizationType
    block_size: int  # weights per block
    block_bytes: int

    def row_bytes(self, k: int) -> int:
        """Bytes of one row of k weights; raises ValueError when k is not a whole number of
        blocks."""
        if k % self.block_size:
            raise ValueError(f"a {self.name} row holds a multiple of {self.block_size} "
                             f"weights, not {k}")
        return k // self.block_size * self.block_bytes


_FORMATS = (
    QuantFormat("Q4_0", 2, 32, 18),
    QuantFormat("Q4_1", 3, 32, 20),
    QuantFormat("Q5_0", 6, 32, 22),
    QuantFormat("Q5_1", 7, 32, 24),
    QuantFormat("Q8_0", 8, 32, 34),
    QuantFormat("Q2_K", 10, 256, 84),
    QuantFormat("Q3_K", 11, 256, 110),
    QuantFormat("Q4_K", 12, 256, 144),
    QuantFormat("Q5_K", 13, 256, 176),
    QuantFormat("Q6_K", 14, 256, 210),
)
QUANT_FORMATS: dict[int, QuantFormat] = {f.type_id: f for f in _FORMATS}
BY_NAME: dict[str, QuantFormat] = {f.name: f for f in _FORMATS}


def quant_format(type_id: int) -> QuantFormat | None:
    """The format of a GGUF type id, or None for a type Folio does not keep quantized."""
    return QUANT_FORMATS.get(type_id)


@dataclass(slots=True, frozen=True)
class QuantizedTensor:
    """A [n, k] matrix as its GGUF blocks: `data` is uint8 [n, row_bytes] on any device."""

    type_id: int
    shape: tuple[int, int]
    data: object  # torch.Tensor; typed loosely so this table needs no torch import

    @property
    def format(self) -> QuantFormat:
        return QUANT_FORMATS[self.type_id]

    @property
    def nbytes(self) -> int:
        return self.data.numel()
