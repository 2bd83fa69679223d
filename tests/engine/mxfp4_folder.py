"""Tiny gpt-oss folders stored as openai/gpt-oss-* are released: every fused expert
matrix as MXFP4 ``_blocks`` / ``_scales`` (quantized here from the format's definition,
in transformers' layout) and ``quantization_config`` naming mxfp4 in config.json.

The quantizer follows the OCP microscaling rule: per block of 32 weights along the input,
the shared exponent floor(log2(max |w|)) - 2 (E2M1's largest exponent), each weight the
nearest E2M1 value of w / 2^exponent (clamped to 6); codes packed two per byte, weight 2b
in the low nibble of byte b."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import save_file

from tests.engine.tiny_moe import GPT_OSS, byte_fields, moe_model

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
QUANTIZATION = {"quant_method": "mxfp4",
                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"]}


def quantize_hf(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [..., out, k] -> (blocks uint8 [..., out, k / 32, 16], scales uint8
    [..., out, k / 32]) in transformers' MXFP4 layout."""
    groups = matrix.float().reshape(*matrix.shape[:-1], -1, 32)
    amax = groups.abs().amax(dim=-1)
    exponent = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=1e-30))) - 2,
                           torch.zeros_like(amax)).clamp(-127, 127)
    scaled = groups / torch.pow(2.0, exponent).unsqueeze(-1)
    magnitude = (scaled.abs().unsqueeze(-1) - E2M1).abs().argmin(dim=-1)
    codes = (magnitude | torch.where(scaled < 0, 8, 0)).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exponent + 127).to(torch.uint8)


def save_mxfp4_gpt_oss_model(path: Path, seed: int = 0,
                             **overrides: Any) -> transformers.GptOssForCausalLM:
    """The folder; returns transformers' model with the experts as the folder holds them
    (dequantized by transformers' own code), the reference to run against."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from tests.engine.tiny_models import byte_level_tokenizer

    model = moe_model(GPT_OSS, seed, **{**byte_fields(GPT_OSS), **overrides})
    state = {name: t.detach().clone().contiguous() for name, t in model.state_dict().items()}
    stored: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales = quantize_hf(tensor.transpose(1, 2))  # rows = outputs
            stored[name + "_blocks"], stored[name + "_scales"] = blocks, scales
            state[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        else:
            stored[name] = tensor
    path.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = QUANTIZATION
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file(stored, str(path / "model.safetensors"), metadata={"format": "pt"})
    byte_level_tokenizer().save_pretrained(path)
    model.load_state_dict(state)
    return model
