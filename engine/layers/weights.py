"""How a layer's matrix is held and multiplied: one storage object per layer, chosen once
when its weights are loaded (`StackedLinear.prepare`, `Embedding.prepare`).

    storage           device  holds                                   product
    DenseWeight       any     the float matrix, or oneDNN's packed    F.linear / oneDNN
                              copy of it on CPU float32
    NativeQuantized   CPU     the file's blocks where they lie (a     folio_cpu: 8-bit
                              map of the GGUF file), kernels/cpu;     activations, integer dots
                              MXFP4 too (kernels/quant/mxfp4)
    TritonQuantized   CUDA    the file's blocks on the card (MXFP4    Triton GEMV / GEMM
                              too)
    TorchQuantized    CPU     PyTorch's int4pack / int8-rows layouts  aten weight-only ops
                              (the native library is not built);
                      not     MXFP4 blocks where no native kernel     dequantize on use,
                      CUDA    takes them (a build from before it)     F.linear

Every storage multiplies (`matmul`, x [m, k] -> [m, n]) and reads rows back (`rows`: an
embedding lookup, the LM head's float32 refinement), so a tied embedding and LM head share
one object. A quantized storage holds the stacked checkpoint matrices as runs of rows
(`kernels.quant.matrix` layouts) and multiplies run by run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers import onednn
from kernels.cpu import quant
from kernels.quant.formats import QuantizedTensor
from kernels.quant.matrix import QuantMatrix, for_product, for_rows, native_cpu
from kernels.quant.mxfp4 import MXFP4_TYPE, native_mxfp4

# Without oneDNN, below this many rows (decode steps) CPU fp32 matmuls run faster as
# W @ x.T than as F.linear (README, "Performance"). One row is padded to two, which beats
# both at batch 1.
SMALL_BATCH = 64


class WeightStorage(Protocol):
    shape: tuple[int, int]  # [n, k]

    @property
    def nbytes(self) -> int:
        """Bytes held outside the layer's parameters (packed or quantized copies)."""

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [m, k] -> x @ W.T [m, n] in x's dtype."""

    def rows(self, ids: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` of W (every row for None) as `dtype`."""


@dataclass(slots=True)
class DenseWeight:
    """The float matrix: the layer's parameter itself (read live, so a reload is seen), or
    oneDNN's packed copy, which then holds the only bytes unless the parameter is shared."""

    weight: nn.Parameter
    shape: tuple[int, int]
    packed: torch.Tensor | None = None

    @classmethod
    def packing(cls, weight: nn.Parameter, keep_plain: bool) -> DenseWeight:
        """A CPU float32 matrix swapped for its packed copy where oneDNN is there; the plain
        one is emptied unless `keep_plain` (a matrix shared with the embedding)."""
        shape = tuple(weight.shape)
        packed = onednn.pack(weight)
        if packed is not None and not keep_plain:
            weight.data = weight.data.new_empty(0)
        return cls(weight, shape, packed)

    @property
    def nbytes(self) -> int:
        return 0 if self.packed is None else self.packed.numel() * self.packed.element_size()

    def dense(self) -> torch.Tensor:
        if self.packed is not None and self.weight.numel() == 0:
            return onednn.unpack(self.packed)
        return self.weight.detach()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return onednn.LINEAR_OP(x, self.packed, None, *onednn.NO_POST_OP)
        if x.device.type == "cpu" and x.dtype == torch.float32 and x.shape[0] < SMALL_BATCH:
            return small_batch_linear(x, self.weight)
        return F.linear(x, self.weight)

    def rows(self, ids: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        w = self.dense()
        return (w if ids is None else w[ids]).to(dtype)


def small_batch_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T computed as (weight @ x.T).T. The result is a transposed view, not
    contiguous: callers reshape it (or let the next op copy it), which saves a copy per
    matmul."""
    rows = x.shape[0]
    columns = (torch.cat([x, x]) if rows == 1 else x).t()
    return torch.mm(weight, columns).t()[:rows]


@dataclass(slots=True)
class QuantizedRuns:
    """A matrix as runs of quantized rows in row order (a stack of checkpoint matrices,
    each run one block type), multiplied run by run."""

    runs: list[QuantMatrix]

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(run.shape[0] for run in self.runs), self.runs[0].shape[1])

    @property
    def nbytes(self) -> int:
        return sum(run.nbytes for run in self.runs)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        outs = [run.matmul(x) for run in self.runs]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def rows(self, ids: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        if len(self.runs) == 1:
            return self.runs[0].rows(ids, dtype)
        every = torch.cat([run.rows(None, dtype) for run in self.runs])
        return every if ids is None else every[ids]


class NativeQuantized(QuantizedRuns):
    """The native CPU library's products, every run in one call (quant_matmul_stack), each
    multiplied where it lies. The input is quantized once for all runs: prefill-sized
    batches to 16-bit rows (the wide tiles, AVX-512), decode-sized ones as two 8-bit rows
    per row (x and its residual, quantize_activations_residual), so each weight is read
    once and the pair's sum keeps about 15 bits of each activation. 8 bits alone moved 2.7%
    of the starter's teacher-forced greedy tokens off the float32 path's (the issue allows
    2%) and lost Paris from its answer to "What is the capital of France?"; with 15 bits,
    none moved. `pairs` False (the LM head, or cpu_activation_bits=8) takes single 8-bit
    rows at decode sizes."""

    __slots__ = ("_data", "_type_ids", "_orders", "_k", "pairs")

    def __init__(self, runs: list[QuantMatrix], pairs: bool = True) -> None:
        super().__init__(runs)
        self.pairs = pairs
        # The op's arguments, gathered once: matmul runs once per layer per step.
        tensors = [run.tensor for run in runs]
        self._data = [t.data for t in tensors]
        self._type_ids = [t.type_id for t in tensors]
        self._orders = [t.row_order for t in tensors]
        self._k = tensors[0].shape[1] if tensors else 0

    def stack_args(self) -> tuple[list[torch.Tensor], list[int], list[torch.Tensor | None], int]:
        """(matrices, type ids, row orders, k): the stack as quant_matmul_stack takes it."""
        return self._data, self._type_ids, self._orders, self._k

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            return self.matmul(x.float()).to(x.dtype)
        # One call: the activations are quantized inside, once for every run.
        return quant.quant_matmul_stack(x, self._data, self._type_ids, self._k, self._orders,
                                        self.pairs)


class TritonQuantized(QuantizedRuns):
    """CUDA: the file's blocks on the card, through the Triton kernels (RawBlocks)."""

    __slots__ = ()


class TorchQuantized(QuantizedRuns):
    """A CPU without the native library: PyTorch's weight-only ops (Int4Packed, Int8Rows);
    and MXFP4 where the library does not take it (Mxfp4Blocks: a build from before its
    MXFP4 kernel, or another device without one)."""

    __slots__ = ()


def quantized_storage(parts: Sequence[QuantizedTensor], device: torch.device,
                      precise: bool = True) -> QuantizedRuns:
    """The storage for a matrix loaded as quantized parts (in row order) on `device`.

    The native path keeps each part as it lies in the file (no copy); `precise` False
    gives its products 8-bit activations alone (the LM head, whose top logits are
    recomputed in float32 anyway). The others join adjacent parts of one block type into
    one layout, built from the blocks in order."""
    kind = _quantized_kind(device)
    if (any(part.type_id == MXFP4_TYPE for part in parts) and kind is not TritonQuantized
            and not native_mxfp4(device)):
        kind = TorchQuantized
    if kind is NativeQuantized:
        return NativeQuantized([for_product(part, device) for part in parts], pairs=precise)
    merged: list[QuantizedTensor] = []
    for part in (p.in_order() for p in parts):
        if merged and merged[-1].type_id == part.type_id:
            last = merged.pop()
            part = QuantizedTensor(part.type_id, (last.shape[0] + part.shape[0], part.shape[1]),
                                   torch.cat([last.data, part.data]))
        merged.append(part)
    return kind([for_product(part, device) for part in merged])


def set_activation_bits(model: nn.Module, bits: int) -> None:
    """8: every native product of `model` takes one 8-bit row per activation row; 16: the
    layers that ask for precise products (StackedLinear.precise_products) take pairs."""
    for module in model.modules():
        storage = getattr(module, "storage", None)
        if isinstance(storage, NativeQuantized):
            storage.pairs = bits == 16 and getattr(module, "precise_products", False)


def lookup_storage(table: QuantizedTensor, device: torch.device) -> QuantizedRuns:
    """The storage of an embedding table that only looks rows up (not tied to a head)."""
    kind = _quantized_kind(device)
    if table.type_id == MXFP4_TYPE and kind is not TritonQuantized and not native_mxfp4(device):
        kind = TorchQuantized
    return kind([for_rows(table, device)])


def _quantized_kind(device: torch.device) -> type[QuantizedRuns]:
    if native_cpu(device):
        return NativeQuantized
    return TritonQuantized if device.type == "cuda" else TorchQuantized
