"""The GGUF (llama.cpp) block types Folio keeps quantized in memory (sizes from gguf).

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


def _formats() -> tuple[QuantFormat, ...]:
    # Block sizes and type ids come from gguf's own table, never a copy of it.
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    names = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
             "MXFP4")
    types = (GGMLQuantizationType[name] for name in names)
    return tuple(QuantFormat(t.name, int(t), *GGML_QUANT_SIZES[t]) for t in types)


_FORMATS = _formats()
QUANT_FORMATS: dict[int, QuantFormat] = {f.type_id: f for f in _FORMATS}
BY_NAME: dict[str, QuantFormat] = {f.name: f for f in _FORMATS}


def quant_format(type_id: int) -> QuantFormat | None:
    """The format of a GGUF type id, or None for a type Folio does not keep quantized."""
    return QUANT_FORMATS.get(type_id)


@dataclass(slots=True, frozen=True)
class QuantizedTensor:
    """A [n, k] matrix as its GGUF blocks: `data` is uint8 [n, row_bytes] on any device,
    often a view of the mapped file. `row_order`, when set, is int64 [n]: row i of the
    matrix is stored row row_order[i] (llama.cpp's rope order of Q/K rows, undone without
    moving the bytes)."""

    type_id: int
    shape: tuple[int, int]
    data: object  # torch.Tensor; typed loosely so this table needs no torch import
    row_order: object | None = None  # torch.Tensor int64 [n]

    @property
    def format(self) -> QuantFormat:
        return QUANT_FORMATS[self.type_id]

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def in_order(self) -> QuantizedTensor:
        """The same matrix with its rows moved into order (a copy when row_order is set)."""
        if self.row_order is None:
            return self
        return QuantizedTensor(self.type_id, self.shape, self.data[self.row_order])


@dataclass(slots=True)
class BlockStorage:
    """A layout that keeps a QuantizedTensor's blocks as they are (RawBlocks, NativeBlocks,
    Mxfp4Blocks): its shape and bytes are the tensor's."""

    tensor: QuantizedTensor

    @property
    def shape(self) -> tuple[int, int]:
        return self.tensor.shape

    @property
    def nbytes(self) -> int:
        return self.tensor.nbytes
