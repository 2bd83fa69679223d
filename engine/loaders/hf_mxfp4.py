"""Hugging Face folders whose experts are stored in MXFP4 (openai/gpt-oss-20b, -120b as
released): config.json's ``quantization_config`` names ``"quant_method": "mxfp4"``, and
each fused expert matrix ``X`` of a layer is two tensors, ``X_blocks`` uint8 [E, out,
k / 32, 16] and ``X_scales`` uint8 [E, out, k / 32] (the float checkpoint's ``X`` is
[E, k, out]).

The loader reads the pair as one entry under ``X``: the header shapes as that float
tensor's (so the shape check, the catalog's parameter count and the model's names stay
the float checkpoint's), and the weights as an `Mxfp4Experts` in GGUF's blocks
(`kernels.quant.mxfp4.from_hf_blocks`) when they stay quantized, or as the dequantized
float tensor otherwise. Any other ``quant_method`` is refused by name: Folio would
otherwise read its packed integers as if they were weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.loaders.base import FolioLoadError
from engine.models.gpt_oss import Mxfp4Experts
from kernels.quant.formats import BY_NAME
from kernels.quant.mxfp4 import BLOCK, from_hf_blocks

MXFP4 = "mxfp4"
_BLOCKS, _SCALES = "_blocks", "_scales"


def quant_method(config: object, where: Path) -> str | None:
    """The folder's quantization method (``"mxfp4"``), or None for plain weights; a
    method Folio cannot read raises FolioLoadError naming it. `config` is the
    transformers config or config.json as a dict."""
    settings = (config.get("quantization_config") if isinstance(config, Mapping)
                else getattr(config, "quantization_config", None))
    if settings is None:
        return None
    if not isinstance(settings, Mapping):
        settings = settings.to_dict() if hasattr(settings, "to_dict") else vars(settings)
    method = settings.get("quant_method")
    if method == MXFP4:
        return MXFP4
    raise FolioLoadError(f"{where}: quantization_config has quant_method {method!r}, which "
                         f"Folio cannot read (it reads {MXFP4!r}: gpt-oss as released); use "
                         "the model's unquantized or GGUF release")


@dataclass(slots=True, frozen=True)
class StoredMxfp4:
    """What a folder's MXFP4 tensors take: the parameters they hold and the bytes they
    keep in memory as GGUF blocks (what weights="stored" loads)."""

    parameters: int = 0
    nbytes: int = 0


def fused_shapes(shapes: Mapping[str, tuple[int, ...]],
                 where: Path) -> tuple[dict[str, tuple[int, ...]], StoredMxfp4]:
    """Header shapes with each ``X_blocks`` / ``X_scales`` pair as the float ``X``
    [E, k, out], and what those tensors take; a pair missing a half or whose halves
    disagree raises FolioLoadError."""
    out: dict[str, tuple[int, ...]] = {}
    parameters = nbytes = 0
    for name, shape in shapes.items():
        if name.endswith(_SCALES) and name.removesuffix(_SCALES) + _BLOCKS in shapes:
            continue  # read with its blocks
        if not name.endswith(_BLOCKS):
            out[name] = shape
            continue
        base = name.removesuffix(_BLOCKS)
        scales = shapes.get(base + _SCALES)
        if scales is None:
            raise FolioLoadError(f"{where}: {name} has no {base + _SCALES}; the download is "
                                 "incomplete, download the model again")
        if len(shape) != 4 or shape[-1] != BLOCK // 2 or tuple(scales) != tuple(shape[:-1]):
            raise FolioLoadError(f"{where}: {name} {list(shape)} and its scales "
                                 f"{list(scales)} are not MXFP4 blocks [E, out, k / 32, 16] "
                                 "and scales [E, out, k / 32]")
        experts, rows, groups = shape[:3]
        out[base] = (experts, groups * BLOCK, rows)
        parameters += experts * rows * groups * BLOCK
        nbytes += experts * rows * groups * BY_NAME["MXFP4"].block_bytes
    return out, StoredMxfp4(parameters, nbytes)


def joined(items: Iterable[tuple[str, torch.Tensor]], keep_quantized: bool,
           dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor | Mxfp4Experts]]:
    """The folder's (name, tensor) pairs with each blocks / scales pair as one entry under
    the float name, once both halves are read: an `Mxfp4Experts` when `keep_quantized`,
    else the float tensor in `dtype`. The repacked blocks replace the file's (no float
    copy of the experts is made while they stay quantized)."""
    waiting: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in items:
        suffix = _BLOCKS if name.endswith(_BLOCKS) else _SCALES if name.endswith(
            _SCALES) else None
        if suffix is None:
            yield name, tensor
            continue
        base = name.removesuffix(suffix)
        halves = waiting.setdefault(base, {})
        halves[suffix] = tensor
        if len(halves) < 2:
            continue
        del waiting[base]
        blocks, scales = halves[_BLOCKS], halves[_SCALES]
        experts = Mxfp4Experts(from_hf_blocks(blocks, scales), blocks.shape[-2] * BLOCK)
        del halves, blocks, scales
        yield base, experts if keep_quantized else experts.dequantize(dtype)
    if waiting:
        first = next(iter(waiting))
        raise FolioLoadError(f"{first}: half of an MXFP4 pair (blocks and scales) is "
                             "missing; download the model again")

