"""Tiny random-weight models saved as real Hugging Face folders, with a byte-level
tokenizer and a ChatML template, so that tests run the whole engine (loader,
tokenizer, model, scheduler) in seconds and download nothing."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    Gemma4TextConfig,
    LlamaConfig,
    Phi3Config,
    PreTrainedTokenizerFast,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for tok in SPECIALS:
        vocab[tok] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIALS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|endoftext|>", eos_token="<|im_end|>",
        unk_token="<|endoftext|>", pad_token="<|endoftext|>",
    )
    tok.chat_template = CHATML
    return tok


def tiny_llama_config(**overrides) -> LlamaConfig:
    fields = dict(
        vocab_size=len(pre_tokenizers.ByteLevel.alphabet()) + len(SPECIALS),
        hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        bos_token_id=256, eos_token_id=258,
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


def tiny_gemma_config(version: int, **overrides):
    """Gemma 2 or Gemma 3 (text) with the byte-level vocabulary: a 16-token window on every
    sliding layer, so prompts cross it; Gemma 2's soft-caps low enough to bite."""
    fields = dict(
        vocab_size=len(pre_tokenizers.ByteLevel.alphabet()) + len(SPECIALS),
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
        max_position_embeddings=1024, rms_norm_eps=1e-6, sliding_window=16,
        bos_token_id=256, eos_token_id=258, pad_token_id=256,
    )
    if version == 2:
        fields |= dict(attn_logit_softcapping=3.0, final_logit_softcapping=8.0)
        config_class = Gemma2Config
    else:
        fields |= dict(layer_types=["sliding_attention"] * 3 + ["full_attention"],
                       rope_scaling={"rope_type": "linear", "factor": 4.0})
        config_class = Gemma3TextConfig
    fields.update(overrides)
    return config_class(**fields)


def tiny_gemma4_config(**overrides):
    """Gemma 4 (text) with the byte-level vocabulary, every change from Gemma 3 in play:
    global layers with wider heads sharing keys and values over one KV head, proportional
    rope, per-layer embeddings, the last two layers reading earlier layers' K/V (with a
    double-wide MLP), a final soft-cap; a 16-token window on the sliding layers."""
    fields = dict(
        vocab_size=len(pre_tokenizers.ByteLevel.alphabet()) + len(SPECIALS),
        vocab_size_per_layer_input=len(pre_tokenizers.ByteLevel.alphabet()) + len(SPECIALS),
        hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
        attention_k_eq_v=True, hidden_size_per_layer_input=8, num_kv_shared_layers=2,
        use_double_wide_mlp=True, final_logit_softcapping=30.0,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
        max_position_embeddings=1024, rms_norm_eps=1e-6, sliding_window=16,
        bos_token_id=256, eos_token_id=258, pad_token_id=256,
    )
    fields.update(overrides)
    return Gemma4TextConfig(**fields)


def tiny_phi3_config(**overrides):
    """Phi-3 with the byte-level vocabulary (Phi-4-mini's partial rotary with
    partial_rotary_factor=0.75)."""
    fields = dict(
        vocab_size=len(pre_tokenizers.ByteLevel.alphabet()) + len(SPECIALS),
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5,
        bos_token_id=256, eos_token_id=258, pad_token_id=256, tie_word_embeddings=False,
    )
    fields.update(overrides)
    return Phi3Config(**fields)


def tiny_qwen35_config(**overrides) -> Qwen3_5TextConfig:
    """Qwen3.5 (hybrid) with the byte-level vocabulary: 3 Gated DeltaNet layers and 1
    full-attention layer, grouped k/v heads in both kinds, partial rotary 0.25."""
    fields = dict(
        vocab_size=len(pre_tokenizers.ByteLevel.alphabet()) + len(SPECIALS),
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        rms_norm_eps=1e-6, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        bos_token_id=256, eos_token_id=258, pad_token_id=256, tie_word_embeddings=False,
        architectures=["Qwen3_5ForCausalLM"],
    )
    fields.update(overrides)
    return Qwen3_5TextConfig(**fields)


def save_tiny_model(path: Path, config=None, seed: int = 0,
                    init: Callable[[torch.nn.Module, int], None] | None = None) -> Path:
    """A random model folder: config.json, model.safetensors, tokenizer files.
    ``init(model, seed)``: the weights' own initialization (`peaked_weights`, ...)."""
    config = config or tiny_llama_config()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    # Larger weights than the default init give peaked logits, so greedy decoding is
    # not decided by float noise between implementations.
    with torch.no_grad():
        if init is not None:
            init(model, seed)
        for p in model.parameters() if init is None else ():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    model.save_pretrained(path, safe_serialization=True)
    byte_level_tokenizer().save_pretrained(path)
    return path


def peaked_weights(model: torch.nn.Module, seed: int) -> None:
    """Seeded random weights large enough that logits are peaked, so greedy decoding is not
    decided by float noise between implementations: norms near (not at) one, so a skipped
    norm shows; biases small; each matrix scaled by 1/sqrt of its input size (the last dim,
    a mixture's stacked 3-D experts included)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * noise)
            elif param.dim() == 1:
                param.copy_(0.2 * noise)
            elif name.endswith("embed_tokens.weight") or name == "lm_head.weight":
                param.copy_(noise)
            else:
                param.copy_(noise * param.shape[-1] ** -0.5)


def calm_qwen35_weights(model: torch.nn.Module, seed: int) -> None:
    """`peaked_weights` for a Qwen3.5 model that quantization noise does not throw off: its
    zero-centred norms near one (scale 1 + w, w near 0, where peaked_weights' near-one w
    doubles every norm and sharpens attention into chaos), and the matrices writing to the
    residual stream (o_proj, out_proj, down_proj) a third as large, so each layer nudges
    the stream rather than swamping it. Logits then move by about what the weights do."""
    peaked_weights(model, seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
                param.sub_(1.0)
            elif name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight",
                                "experts.down_proj")):
                param.mul_(0.3)


def random_prompt(seed: int, length: int) -> list[int]:
    """length token ids below 256 (the tiny models' byte vocabulary), reproducible by seed."""
    rng = random.Random(seed)
    return [rng.randrange(0, 256) for _ in range(length)]


def tiny_qwen35_moe_config(**overrides) -> Qwen3_5MoeTextConfig:
    """Qwen3.5-MoE: the tiny Qwen3.5's layers, each MLP 8 routed experts (2 a token) and a
    shared expert of its own width (rows of whole Q8_0 blocks: 32 values)."""
    base = tiny_qwen35_config().to_dict()
    fields = {key: base[key] for key in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
        "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
        "linear_value_head_dim", "linear_conv_kernel_dim", "bos_token_id", "eos_token_id",
        "pad_token_id", "tie_word_embeddings")}
    fields |= dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                   shared_expert_intermediate_size=64, architectures=["Qwen3_5MoeForCausalLM"])
    fields.update(overrides)
    return Qwen3_5MoeTextConfig(**fields)
