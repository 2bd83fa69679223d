"""A quantized matrix ready to multiply on its device, in the layout that device runs
fastest, plus the row lookups an embedding table needs.

    layout       device  product                         rows (embedding lookup)
    NativeBlocks CPU     folio_cpu integer dot products   folio_cpu dequantize of the rows
                         on the file's blocks (8-bit
                         activations), kernels/cpu
    RawBlocks    CUDA    Triton fused dequantize + GEMV   Triton dequantize of the rows
                         / dequantize-in-tile GEMM
    RawBlocks    CPU     dequantize, then F.linear        gguf's dequantize of the rows
                         (exact, slow: tests and odd cases)
    Int4Packed   CPU     aten int4pack (Q4_0/Q4_1/Q4_K,   the rows' nibbles read out of
                         and Q8_0 as two 4-bit halves)     the packed layout
    Int8Rows     CPU     aten int8pack / F.linear         int8 rows times their scale
    Mxfp4Blocks  not     dequantize on use, F.linear      the rows' blocks dequantized
                 CUDA    (MXFP4 where the native library
                         does not take it: kernels/quant/mxfp4;
                         on CUDA it is RawBlocks like the rest)

NativeBlocks reads the blocks where they lie (a map of the GGUF file) and keeps the file's
row order; the other layouts are built at load from the blocks in order. Without the
native library (not built, or FOLIO_NATIVE_CPU=0) the CPU takes Int4Packed / Int8Rows.
`for_product` and `for_rows` pick the layout; a tied embedding shares its LM head's
(`shares_layout`), so it is held once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from kernels.quant.formats import BlockStorage, QuantizedTensor
from kernels.quant.mxfp4 import MXFP4_TYPE, Mxfp4Blocks, native_mxfp4
from kernels.quant.torch_packed import INT4_TYPES, Int4Packed, Int8Rows, tile_rows


@dataclass(slots=True)
class RawBlocks(BlockStorage):
    """The file's blocks as they are, uint8 [n, row_bytes] on the device."""

    # Triton kernels (CUDA; tests run them interpreted on CPU) or gguf's reference code.
    triton: bool = False

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [m, k] -> x @ W.T [m, n] in x's dtype."""
        n, k = self.tensor.shape
        if self.triton:
            from kernels.triton.quant_matmul import quant_matmul

            return quant_matmul(x, self.tensor.data, self.tensor.type_id, n, k)
        return F.linear(x, self.rows(None, x.dtype))

    def rows(self, ids: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` of W (all rows for None), dequantized to `dtype`."""
        data = self.tensor.data if ids is None else self.tensor.data[ids]
        k = self.tensor.shape[1]
        if self.triton:
            from kernels.triton.quant_dequant import dequantize_rows

            return dequantize_rows(data, self.tensor.type_id, k, dtype)
        # Other devices (MPS) dequantize on the CPU: correct, not fast.
        return dequantize_cpu(data.cpu(), self.tensor.type_id).to(data.device, dtype)


@dataclass(slots=True)
class NativeBlocks(BlockStorage):
    """The file's blocks multiplied in place by the native CPU library (kernels/cpu)."""


    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x float32 [m, k], or its 8-bit blocks (quantize_activations), -> float32 [m, n]."""
        from kernels.cpu import quant

        t = self.tensor
        return quant.quant_matmul(x, t.data, t.type_id, t.shape[1], t.row_order)

    def rows(self, ids: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        from kernels.cpu import quant

        t = self.tensor
        if ids is None:
            ids = torch.arange(t.shape[0])
        if t.row_order is not None:
            ids = t.row_order[ids]
        return quant.dequantize_rows(t.data, ids, t.type_id, t.shape[1]).to(dtype)


QuantMatrix = RawBlocks | Int4Packed | Int8Rows | NativeBlocks | Mxfp4Blocks


def dequantize_cpu(data: torch.Tensor, type_id: int) -> torch.Tensor:
    """uint8 [r, row_bytes] CPU blocks -> float32 [r, k], with gguf's reference code."""
    from gguf import GGMLQuantizationType, dequantize

    array = np.ascontiguousarray(data.numpy())
    return torch.from_numpy(dequantize(array, GGMLQuantizationType(type_id)))


def native_cpu(device: torch.device) -> bool:
    """Whether quantized products on `device` run the native CPU library."""
    from kernels import cpu

    return device.type == "cpu" and cpu.available()


def for_product(tensor: QuantizedTensor, device: torch.device) -> QuantMatrix:
    """The layout that multiplies fastest on `device` (the tensor's data is on the CPU)."""
    if tensor.type_id == MXFP4_TYPE and device.type != "cuda" and not native_mxfp4(device):
        return Mxfp4Blocks(_moved(tensor.in_order(), device))
    if native_cpu(device):
        return NativeBlocks(tensor)
    tensor = tensor.in_order()
    if device.type != "cpu":
        return RawBlocks(_moved(tensor, device), triton=device.type == "cuda")
    if tensor.type_id in INT4_TYPES:
        return Int4Packed.from_blocks(tensor)
    return Int8Rows.from_float(dequantize_cpu(tensor.data, tensor.type_id))


def for_rows(tensor: QuantizedTensor, device: torch.device) -> RawBlocks | Mxfp4Blocks:
    """The layout for an embedding table that only looks rows up."""
    if tensor.type_id == MXFP4_TYPE and device.type != "cuda" and not native_mxfp4(device):
        return Mxfp4Blocks(_moved(tensor.in_order(), device))
    if native_cpu(device):
        return NativeBlocks(tensor)
    tensor = tensor.in_order()
    return RawBlocks(_moved(tensor, device), triton=device.type == "cuda")


def shares_layout(product: QuantMatrix) -> bool:
    """Whether a product layout also answers row lookups (so a tied table keeps one)."""
    if isinstance(product, Int4Packed):
        try:
            tile_rows()
        except ValueError:  # an int4pack layout we cannot read: keep the file's rows too
            return False
    return True


def _moved(tensor: QuantizedTensor, device: torch.device) -> QuantizedTensor:
    return QuantizedTensor(tensor.type_id, tensor.shape, tensor.data.to(device))
