"""Model files to config + tokenizer + named weights: Hugging Face folders and GGUF files.

`load_model_files` does not build the model: see `engine.loaders.base` for what a loader
hands over, `safetensors.py` for folders and `gguf/` for llama.cpp's files. `catalog.py`
lists and resolves the models on this machine without loading them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.loaders.base import FolioLoadError, LoadedModel, ProgressFn, WeightStream
from engine.loaders.gguf.loader import load_gguf
from engine.loaders.safetensors import load_hf_folder

__all__ = ["FolioLoadError", "LoadedModel", "WeightStream", "load_model_files"]


def load_model_files(source: str | Path, dtype: torch.dtype = torch.float32,
                     progress: ProgressFn | None = None,
                     keep_quantized: bool = False, with_mtp: bool = False) -> LoadedModel:
    """Load a Hugging Face model folder or a .gguf file (see the module docstring).

    `progress(stage, fraction)` hears each stage start at 0.0 and end at 1.0; stages are
    "config", "tokenizer", "index" (folders) or "open", "tokenizer", "cache" (GGUF), then
    "weights" while `weights` is iterated. keep_quantized: a GGUF file's quantized
    matrices come out as `kernels.quant.formats.QuantizedTensor`, a folder's MXFP4 experts
    as `engine.models.gpt_oss.Mxfp4Experts` (else both are dequantized to `dtype`).
    with_mtp: a folder's multi-token-prediction tensors (``mtp.*``) come too (else they
    are never read).
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    path = Path(source).expanduser()
    if not path.exists():
        raise FolioLoadError(f"{path}: no such file or folder; pass a model folder with "
                             "config.json and safetensors weights, or a .gguf file")
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            if with_mtp:
                # gguf's MODEL_TENSORS[QWEN35] / [QWEN35MOE] list no nextn tensors:
                # llama.cpp's converter leaves the head out of these files.
                raise FolioLoadError(f"{path}: EngineConfig.speculative='mtp' needs the "
                                     "model's MTP head, which llama.cpp's Qwen3.5 GGUF files "
                                     "do not carry (no nextn tensors); load the model's "
                                     "Hugging Face folder instead")
            return load_gguf(path, dtype, progress, keep_quantized)
        raise FolioLoadError(f"{path}: not a model; pass its folder (with config.json) "
                             "or a .gguf file")
    return load_hf_folder(path, dtype, progress, keep_quantized, with_mtp)
