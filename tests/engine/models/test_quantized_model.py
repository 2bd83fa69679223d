"""A whole model on GGUF-quantized weights, through each path a device takes: the Triton
kernels (interpreted here; what CUDA runs), the CPU layouts (int4pack, int8 rows), all
against the same model on the dequantized float32 weights.

q/k get Q4_0 and v Q8_0 (a stack of two block types, like llama.cpp's Q4_K_M mixes), the
MLP Q4_1 and Q5_0, the tied embedding Q8_0: every layout and the tied sharing run."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType, dequantize, quantize

import engine.layers.weights as weights_module
from engine.models import build_model
from engine.models.base import pool_layers
from kernels import allocate_kv_cache
from kernels.quant.formats import QuantizedTensor
from kernels.quant.matrix import RawBlocks
from kernels.reference.backend import TorchBackend
from tests.conftest import tiny_hf_model

BLOCK_SIZE = 16
TYPES = {"q_proj": "Q4_0", "k_proj": "Q4_0", "v_proj": "Q8_0", "o_proj": "Q4_1",
         "gate_proj": "Q4_1", "up_proj": "Q5_0", "down_proj": "Q5_0",
         "embed_tokens": "Q8_0"}


def quantized_checkpoint(hf_model) -> tuple[list, list]:
    """(name, QuantizedTensor or float) pairs, and the same weights dequantized."""
    quantized, floats = [], []
    for name, tensor in hf_model.state_dict().items():
        kind = next((TYPES[part] for part in TYPES if f".{part}." in f".{name}"), None)
        if kind is None or tensor.dim() != 2:
            quantized.append((name, tensor))
            floats.append((name, tensor))
            continue
        qtype = GGMLQuantizationType[kind]
        blocks = quantize(tensor.float().numpy(), qtype)
        quantized.append((name, QuantizedTensor(int(qtype), tuple(tensor.shape),
                                                torch.from_numpy(blocks))))
        floats.append((name, torch.from_numpy(dequantize(blocks, qtype))))
    return quantized, floats


def logits(model, build_attention_metadata, tokens: list[int]) -> torch.Tensor:
    """Prefill of `tokens` in two chunks, then logits of every position."""
    spec = model.spec
    cache = allocate_kv_cache(spec.num_layers, 8, BLOCK_SIZE, spec.num_kv_heads,
                              spec.head_dim, model.dtype, "cpu", head_major=False)
    table = list(range(8))
    out = []
    with torch.inference_mode():
        for start, stop in ((0, 13), (13, len(tokens))):
            meta = build_attention_metadata([table], [start], [stop - start], BLOCK_SIZE)
            hidden = model(torch.tensor(tokens[start:stop]), torch.arange(start, stop),
                           pool_layers(cache, meta), meta, TorchBackend())
            out.append(model.compute_logits(hidden))
    return torch.cat(out)


@pytest.fixture(scope="module")
def checkpoint():
    hf_model = tiny_hf_model("llama", tie_word_embeddings=True)
    return hf_model.config, *quantized_checkpoint(hf_model)


def build(config, weights):
    model = build_model(config, dtype=torch.float32, device="cpu")
    model.load_weights(weights)
    return model


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_the_triton_path_equals_the_dequantized_model(checkpoint, build_attention_metadata,
                                                      monkeypatch):
    config, quantized, floats = checkpoint
    triton_layout = lambda tensor, device: RawBlocks(tensor, triton=True)  # noqa: E731
    monkeypatch.setattr(weights_module, "for_product", triton_layout)
    monkeypatch.setattr(weights_module, "for_rows", triton_layout)
    monkeypatch.setattr(weights_module, "_quantized_kind",
                        lambda device: weights_module.TritonQuantized)
    model = build(config, quantized)
    qkv = model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.storage, weights_module.TritonQuantized)
    assert all(isinstance(run, RawBlocks) and run.triton for run in qkv.storage.runs)
    assert model.embed_tokens.storage is model.lm_head.storage  # tied: one copy
    tokens = list(range(3, 40))
    expected = logits(build(config, floats), build_attention_metadata, tokens)
    assert relative(logits(model, build_attention_metadata, tokens), expected) < 1e-4


def test_the_torch_cpu_layouts_track_the_dequantized_model(checkpoint,
                                                           build_attention_metadata,
                                                           without_native_cpu):
    config, quantized, floats = checkpoint
    model = build(config, quantized)
    qkv = model.layers[0].self_attn.qkv_proj
    assert [type(run).__name__ for run in qkv.storage.runs] == ["Int4Packed", "Int4Packed"]
    assert [type(run).__name__ for run in model.layers[0].mlp.gate_up_proj.storage.runs] == [
        "Int4Packed", "Int8Rows"]
    assert model.embed_tokens.storage is model.lm_head.storage
    reference = build(config, floats)
    # Every float weight is gone: the model holds the quantized layouts only.
    assert all(p.numel() == 0 for name, p in model.named_parameters()
               if "proj" in name or "embed" in name)
    assert model.weight_bytes() < reference.weight_bytes() / 3
    tokens = list(range(3, 40))
    ours = logits(model, build_attention_metadata, tokens)
    expected = logits(reference, build_attention_metadata, tokens)
    # bf16 activations and int8 rows for Q5_0: a few parts in a thousand, not more.
    assert relative(ours, expected) < 2e-2
    assert (ours.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9

