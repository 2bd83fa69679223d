"""How the tests' quantized GGUF files store each tensor, as llama.cpp's quantizer
chooses (norms, the conv, routers and gates in F32; a matrix in the asked type where its
rows hold whole blocks, else Q8_0, its fallback, else F32), and the folder holding a
file's own weights as floats (gguf's dequantize, the oracle): a K-quant file moves a
random model's logits past where greedy replies can be compared with the original's."""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from tests.engine.loaders.gguf.q4_k import quantize_q4_k

_KEPT_FLOAT = ("norm.weight", "mlp.gate.weight", "shared_expert_gate.weight",
               "conv1d.weight", "in_proj_a.weight", "in_proj_b.weight", "layer_scalar")


def file_type(hf_name: str, shape: tuple[int, ...], matrices: Q) -> Q:
    """The type a file of `matrices` stores the tensor `hf_name` (its Hugging Face name) in."""
    if matrices == Q.F32 or len(shape) < 2 or hf_name.endswith(_KEPT_FLOAT):
        return Q.F32
    for kind in (matrices, Q.Q8_0):
        if shape[-1] % gguf.GGML_QUANT_SIZES[kind][0] == 0:
            return kind
    return Q.F32


def encode(data: np.ndarray, kind: Q) -> tuple[np.ndarray, Q | None]:
    """(the bytes or floats to write, the raw dtype to write them as; None for F32)."""
    if kind == Q.F32:
        return np.ascontiguousarray(data, np.float32), None
    if kind == Q.Q4_K:
        return quantize_q4_k(data), kind
    return gguf.quants.quantize(np.ascontiguousarray(data, np.float32), kind), kind


def held_folder(folder: Path, dest: Path, matrices: Q) -> Path:
    """A copy of `folder` whose weights are what a `matrices` file of it holds, read back
    by gguf's dequantize. Exact where the file's conversion only renames, stacks or moves
    whole rows (quantized blocks run along rows)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, dest)
    state = load_file(str(folder / "model.safetensors"))
    held = {}
    for name, tensor in state.items():
        kind = file_type(name, tuple(tensor.shape), matrices)
        if kind != Q.F32:
            data, _ = encode(tensor.float().numpy(), kind)
            tensor = torch.from_numpy(
                gguf.quants.dequantize(data, kind).reshape(tensor.shape)).to(tensor.dtype)
        held[name] = tensor.contiguous()
    save_file(held, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest
