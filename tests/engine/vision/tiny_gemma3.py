"""A tiny random Gemma 3 (``Gemma3ForConditionalGeneration``) folder as transformers
saves one: the Gemma 3 text model of tests/engine/tiny_models.py (a 16-token window on
three of its four layers), a two-layer SigLIP tower over 64 x 64 frames of 8 x 8
patches (an 8 x 8 grid, pooled by 2 into 16 image tokens), the byte-level tokenizer
with Gemma 3's image tokens added, and the image processor's settings."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, PreTrainedTokenizerFast

from tests.engine.tiny_models import CHATML, SPECIALS, tiny_gemma_config

BOI, EOI, SOFT = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
SIDE = 64
TOKENS = 16


def gemma3_tokenizer():
    """The byte-level tokenizer with one merge, two newlines into one token (as Gemma's
    own tokenizer has tokens for runs of newlines, which an image's text joins), and
    Gemma 3's image tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for token in SPECIALS:
        vocab[token] = len(vocab)
    vocab["ĊĊ"] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[("Ċ", "Ċ")]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIALS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|endoftext|>", eos_token="<|im_end|>",
        unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML
    tok.add_special_tokens({"additional_special_tokens": [BOI, EOI, SOFT]})
    tok.boi_token, tok.eoi_token, tok.image_token = BOI, EOI, SOFT
    tok.image_token_id = tok.convert_tokens_to_ids(SOFT)
    tok.boi_token_id = tok.convert_tokens_to_ids(BOI)
    return tok


def tiny_gemma3_config(tokenizer, **vision) -> Gemma3Config:
    text = tiny_gemma_config(3, vocab_size=len(tokenizer))
    tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, image_size=SIDE, patch_size=8,
                 vision_use_head=False) | vision
    return Gemma3Config(text_config=text.to_dict(), vision_config=tower,
                        mm_tokens_per_image=TOKENS,
                        boi_token_index=tokenizer.convert_tokens_to_ids(BOI),
                        eoi_token_index=tokenizer.convert_tokens_to_ids(EOI),
                        image_token_index=tokenizer.convert_tokens_to_ids(SOFT))


def random_weights(model: torch.nn.Module, seed: int) -> None:
    """Seeded weights large enough that greedy replies are not decided by float noise:
    Gemma's zero-centred norms (scale 1 + w) near zero, SigLIP's LayerNorms near one,
    matrices scaled by 1 / sqrt of their input size."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith(("layer_norm1.weight", "layer_norm2.weight",
                              "post_layernorm.weight")):
                param.copy_(1 + 0.2 * noise)
            elif name.endswith("norm.weight"):
                param.copy_(0.2 * noise)
            elif name.endswith("mm_input_projection_weight"):  # [vision width, text width]
                param.copy_(noise * param.shape[0] ** -0.5)
            elif param.dim() >= 2:
                scale = 1.0 if "language_model" in name else 2.0
                param.copy_(noise * param[0].numel() ** -0.5 * scale)
            else:
                param.copy_(0.1 * noise)


def save_tiny_gemma3(path: Path, seed: int = 0, **vision) -> Path:
    from transformers.models.gemma3.image_processing_pil_gemma3 import (
        Gemma3ImageProcessorPil,
    )

    tokenizer = gemma3_tokenizer()
    config = tiny_gemma3_config(tokenizer, **vision)
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).eval()
    random_weights(model, seed)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    side = config.vision_config.image_size
    Gemma3ImageProcessorPil(size={"height": side, "width": side}).save_pretrained(path)
    return path
