"""A tiny random Qwen3.5 vision-language folder as transformers saves one
(``Qwen3_5ForConditionalGeneration``): the hybrid text model of tests/engine/tiny_models.py
with a wider rotary part (16 dims in 8 frequencies, M-RoPE sections 3 / 3 / 2), a
two-block vision tower over 4 x 4 patches merged 2 x 2, the byte-level tokenizer with
Qwen's vision tokens added, and the image processor's settings (sides in multiples of 8,
at most 64 x 64 pixels). ``moe``: the same around the tiny Qwen3.5-MoE text model
(``Qwen3_5MoeForConditionalGeneration``)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
)

from tests.engine.tiny_models import (
    byte_level_tokenizer,
    peaked_weights,
    tiny_qwen35_config,
    tiny_qwen35_moe_config,
)

VISION_SPECIALS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
              patch_size=4, temporal_patch_size=2, spatial_merge_size=2,
              num_position_embeddings=16)
MAX_PIXELS = 64 * 64
MIN_PIXELS = 8 * 8


def qwen35_vl_tokenizer():
    tok = byte_level_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": VISION_SPECIALS})
    return tok


def tiny_qwen35_vl_config(tokenizer, moe: bool = False, **text_fields):
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "mrope_section": [3, 3, 2], "mrope_interleaved": True}
    make_text = tiny_qwen35_moe_config if moe else tiny_qwen35_config
    text = make_text(vocab_size=len(tokenizer), head_dim=32, rope_parameters=rope,
                     **text_fields).to_dict()
    text.pop("architectures", None)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_SPECIALS}
    make = Qwen3_5MoeConfig if moe else Qwen3_5Config
    return make(text_config=text, vision_config=VISION,
                         image_token_id=ids["<|image_pad|>"],
                         video_token_id=ids["<|video_pad|>"],
                         vision_start_token_id=ids["<|vision_start|>"],
                         vision_end_token_id=ids["<|vision_end|>"],
                         tie_word_embeddings=False)


def image_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil(patch_size=4, temporal_patch_size=2, merge_size=2,
                                    size={"shortest_edge": MIN_PIXELS,
                                          "longest_edge": MAX_PIXELS},
                                    image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.25, 0.3])


def save_tiny_qwen35_vl(path: Path, seed: int = 0, moe: bool = False) -> Path:
    tokenizer = qwen35_vl_tokenizer()
    config = tiny_qwen35_vl_config(tokenizer, moe)
    torch.manual_seed(seed)
    make = Qwen3_5MoeForConditionalGeneration if moe else Qwen3_5ForConditionalGeneration
    model = make(config).eval()
    peaked_weights(model, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.model.visual.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "norm" in name and name.endswith("weight"):
                param.copy_(1 + 0.2 * noise)
            elif param.dim() >= 2:
                param.copy_(noise * param[0].numel() ** -0.5 * 1.5)
            else:
                param.copy_(0.1 * noise)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    image_processor().save_pretrained(path)
    return path
