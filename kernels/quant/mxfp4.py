"""MXFP4 (GGUF type 39, gpt-oss's expert weights): 32 weights per 17-byte block, one E8M0
scale byte then 16 bytes of 4-bit E2M1 codes (weight j in the low nibble of byte j,
weight j + 16 in its high nibble), as ggml-common.h's block_mxfp4.

On the CPU with the native library built (`native_mxfp4`), the blocks are multiplied as
stored by its integer kernels like the other GGUF types (kernels/cpu/csrc/quant/mxfp4.h:
the E2M1 values doubled are int8 weights, the halved E8M0 scale their block's factor), so
the loader keeps them as `NativeBlocks`. On CUDA the Triton kernels read the blocks
themselves (kernels/triton/quant_blocks.py). Elsewhere `Mxfp4Blocks` keeps a matrix's
blocks as the file holds them and dequantizes them when it multiplies, by PyTorch ops:
a mixture of experts holds each expert as its own matrix, so a step dequantizes only the
experts its tokens were routed to. The oracle of all three is `gguf.quants.dequantize`.

Hugging Face folders (openai/gpt-oss-*) store the same codes and scale bytes apart, in
another nibble order: `from_hf_blocks` moves them into these blocks once at load, so one
set of storages serves both kinds of file."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.quant.formats import BlockStorage

MXFP4_TYPE = 39  # gguf.GGMLQuantizationType.MXFP4
BLOCK, BLOCK_BYTES = 32, 17
# E2M1's values doubled, as ggml's kvalues_mxfp4: the scale below is halved to match.
_CODES = (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0,
          -12.0)


def native_mxfp4(device: torch.device) -> bool:
    """Whether MXFP4 products on `device` run the native CPU library: a CPU, the library
    loaded, and a build of it that takes type 39 (one built before MXFP4 refuses it)."""
    from kernels import cpu

    return device.type == "cpu" and cpu.available() and _library_takes_mxfp4()


@functools.cache
def _library_takes_mxfp4() -> bool:
    from kernels.cpu import quant

    try:
        quant.quant_matmul(torch.zeros(1, BLOCK), torch.zeros(1, BLOCK_BYTES, dtype=torch.uint8),
                           MXFP4_TYPE, BLOCK)
    except RuntimeError:
        return False
    return True


def half_scales(e: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> 2^(e - 128) in float32, ggml_e8m0_to_fp32_half (e < 2: subnormal)."""
    e = e.to(torch.int32)
    bits = torch.where(e < 2, torch.full_like(e, 0x00200000) << e, (e - 1) << 23)
    return bits.view(torch.float32)


def dequantize_mxfp4(data: torch.Tensor, k: int, dtype: torch.dtype = torch.float32
                     ) -> torch.Tensor:
    """uint8 [r, k / 32 * 17] MXFP4 rows -> [r, k] in `dtype`, on data's device."""
    rows = data.shape[0]
    blocks = data.reshape(rows, k // BLOCK, BLOCK_BYTES)
    codes = blocks[..., 1:]
    nibbles = torch.cat([codes & 0x0F, codes >> 4], dim=-1).to(torch.int64)
    table = torch.tensor(_CODES, dtype=torch.float32, device=data.device)
    values = table[nibbles] * half_scales(blocks[..., 0])[..., None]
    return values.reshape(rows, k).to(dtype)


def from_hf_blocks(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """A Hugging Face checkpoint's MXFP4 tensor -> these blocks: `blocks` uint8
    [..., G, 16] (weight 2b of a block in the low nibble of byte b, 2b + 1 in its high
    one), `scales` uint8 [..., G] (E8M0) -> uint8 [..., G * 17], each block its scale
    byte then the codes with weight j low and j + 16 high. The codes' table and the
    scale bytes mean the same in both (transformers reads FP4 at half these values with
    twice this scale), so the bytes move and no value is recomputed."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales are uint8, got {blocks.dtype} and "
                         f"{scales.dtype}")
    if blocks.shape[-1] != BLOCK // 2 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks [..., G, 16] need scales [..., G], got "
                         f"{list(blocks.shape)} and {list(scales.shape)}")
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2)  # weight order
    packed = codes[..., :BLOCK // 2] | (codes[..., BLOCK // 2:] << 4)
    return torch.cat([scales.unsqueeze(-1), packed], dim=-1).flatten(-2)


@dataclass(slots=True)
class Mxfp4Blocks(BlockStorage):
    """An MXFP4 matrix's blocks, in row order, dequantized on use."""

    def __post_init__(self) -> None:
        if self.tensor.type_id != MXFP4_TYPE:
            raise ValueError(f"Mxfp4Blocks holds MXFP4 blocks, not type {self.tensor.type_id}")
        self.tensor = self.tensor.in_order()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [m, k] -> x @ W.T [m, n] in x's dtype."""
        return F.linear(x, self.rows(None, x.dtype))

    def rows(self, ids: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        data = self.tensor.data if ids is None else self.tensor.data[ids]
        return dequantize_mxfp4(data, self.tensor.shape[1], dtype)
