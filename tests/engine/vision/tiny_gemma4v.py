"""A tiny random Gemma 4 vision-language folder as transformers saves one: the Gemma 4
text model of tests/engine/tiny_models.py, a two-layer vision tower (8 x 8 patches,
pooled 2 x 2, clipped linears and standardization on, so every stored piece is read),
the byte-level tokenizer with Gemma 4's image tokens added, and the image processor's
settings (the smallest token budget, 70)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Gemma4Config, Gemma4ForConditionalGeneration

from tests.engine.tiny_models import byte_level_tokenizer, tiny_gemma4_config

BEGIN, IMAGE, END = "<|image>", "<|image|>", "<image|>"
PATCH, POOLING, BUDGET = 8, 2, 70


def gemma4v_tokenizer():
    tok = byte_level_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [BEGIN, IMAGE, END]})
    return tok


def tiny_gemma4v_config(tokenizer, **text_overrides) -> Gemma4Config:
    text = tiny_gemma4_config(vocab_size=len(tokenizer),
                              vocab_size_per_layer_input=len(tokenizer), **text_overrides)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  patch_size=PATCH, pooling_kernel_size=POOLING, position_embedding_size=128,
                  use_clipped_linears=True, standardize=True)
    ids = {name: tokenizer.convert_tokens_to_ids(tok)
           for name, tok in (("boi", BEGIN), ("image", IMAGE), ("eoi", END))}
    return Gemma4Config(text_config=text.to_dict(), vision_config=vision, audio_config=None,
                        boi_token_id=ids["boi"], image_token_id=ids["image"],
                        eoi_token_id=ids["eoi"])


def save_tiny_gemma4v(path: Path, seed: int = 0, **text_overrides) -> Path:
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    tokenizer = gemma4v_tokenizer()
    config = tiny_gemma4v_config(tokenizer, **text_overrides)
    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=generator))
            elif param.dim() >= 2 and "language_model" in name:
                # tests/engine/models/test_gemma4.py's scale: replies that vary
                param.normal_(0, 0.08, generator=generator)
            elif param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator)
                            * param[0].numel() ** -0.5)
            else:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
        # The image tokens' rows (tied to the LM head) near zero, so a reply never holds
        # one: transformers embeds a generated image token as the pad token, a quirk
        # no engine shares, which would part the replies for no fault of either.
        embed = model.model.language_model.embed_tokens.weight
        for token in (BEGIN, IMAGE, END):
            embed[tokenizer.convert_tokens_to_ids(token)] *= 0.01
        for i, layer in enumerate(model.model.language_model.layers):
            layer.layer_scalar.fill_(0.6 + 0.15 * i)
        tower = model.model.vision_tower
        tower.std_bias.copy_(0.1 * torch.randn(tower.std_bias.shape, generator=generator))
        tower.std_scale.copy_(1 + 0.1 * torch.randn(tower.std_scale.shape,
                                                    generator=generator))
        for name, buffer in tower.named_buffers():
            # Ranges that clamp some values, so the test sees them applied.
            if name.endswith(("input_max", "output_max")):
                buffer.fill_(2.5)
            elif name.endswith(("input_min", "output_min")):
                buffer.fill_(-2.5)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    Gemma4ImageProcessorPil(patch_size=PATCH, pooling_kernel_size=POOLING,
                            max_soft_tokens=BUDGET).save_pretrained(path)
    return path
