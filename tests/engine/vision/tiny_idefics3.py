"""A tiny random Idefics3 (SmolVLM) folder as transformers saves one: the Llama text
model of tests/engine/tiny_models.py, a two-layer SigLIP tower over 32 x 32 frames of
8 x 8 patches (16 patches, folded by 2 into 4 image tokens a frame), the byte-level
tokenizer with Idefics3's image tokens added, and the image processor's settings."""

from __future__ import annotations

import io
from pathlib import Path

import torch
from PIL import Image
from transformers import Idefics3Config, Idefics3ForConditionalGeneration

from tests.engine.tiny_models import byte_level_tokenizer, tiny_llama_config

IMAGE_SPECIALS = ["<fake_token_around_image>", "<image>", "<global-img>",
                  *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))]
TILE = 32
LONGEST = 64


def idefics3_tokenizer():
    tok = byte_level_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": IMAGE_SPECIALS})
    return tok


def tiny_idefics3_config(tokenizer) -> Idefics3Config:
    text = tiny_llama_config(vocab_size=len(tokenizer), tie_word_embeddings=False)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, image_size=TILE, patch_size=8)
    return Idefics3Config(text_config=text.to_dict(), vision_config=vision, scale_factor=2,
                          image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                          tie_word_embeddings=False)


def save_tiny_idefics3(path: Path, seed: int = 0, split: bool = True) -> Path:
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    tokenizer = idefics3_tokenizer()
    config = tiny_idefics3_config(tokenizer)
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight") or \
                    name.endswith(("layer_norm1.weight", "layer_norm2.weight")):
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=generator))
            elif param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator)
                            * param[0].numel() ** -0.5 * (1.0 if "text_model" in name else 2.0))
            else:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    Idefics3ImageProcessorPil(size={"longest_edge": LONGEST}, max_image_size={"longest_edge": TILE},
                              do_image_splitting=split).save_pretrained(path)
    return path


def png(seed: int, size: tuple[int, int]) -> bytes:
    """A noisy RGB picture (different for each seed) as PNG bytes."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size[1], size[0], 3), generator=generator, dtype=torch.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels.numpy(), "RGB").save(out, format="PNG")
    return out.getvalue()
