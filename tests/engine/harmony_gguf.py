"""A tiny random gpt-oss GGUF as a file without ``tokenizer.chat_template``: the byte-level
vocabulary plus harmony's special tokens (each one token, as in o200k_harmony), its end of
text ``<|return|>``; Folio renders its chats in the family's harmony format."""

from __future__ import annotations

from pathlib import Path

from gguf import GGMLQuantizationType as Q

from tests.engine.loaders.gguf.test_gguf_families import byte_level_metadata
from tests.engine.loaders.gguf.test_gguf_gpt_oss import write_gpt_oss_gguf
from tests.engine.tiny_moe import GPT_OSS, moe_model

HARMONY_SPECIALS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                    "<|return|>", "<|call|>"]


def harmony_tokenizer_keys() -> dict[str, object]:
    keys = byte_level_metadata()
    del keys["tokenizer.chat_template"]
    tokens = list(keys["tokenizer.ggml.tokens"]) + HARMONY_SPECIALS
    keys["tokenizer.ggml.tokens"] = tokens
    keys["tokenizer.ggml.scores"] = [0.0] * len(tokens)
    keys["tokenizer.ggml.token_type"] = [3 if t.startswith("<|") else 1 for t in tokens]
    keys["tokenizer.ggml.eos_token_id"] = tokens.index("<|return|>")
    return keys


def write_harmony_gguf(path: Path, experts: Q = Q.F32, seed: int = 0) -> Path:
    keys = harmony_tokenizer_keys()
    size = len(keys["tokenizer.ggml.tokens"])
    eos = keys["tokenizer.ggml.eos_token_id"]
    model = moe_model(GPT_OSS, seed, vocab_size=size, bos_token_id=256, eos_token_id=eos,
                          pad_token_id=256, max_position_embeddings=1024)
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    write_gpt_oss_gguf(path, model.config, state, experts, tokenizer=keys)
    return path
