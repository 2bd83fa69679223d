"""Token ids and tiny tokenizers shared by the text tests (conftest.py cannot be imported
by test modules: other conftest.py files share its module name)."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

# The starter's (SmolLM2) ids of <|im_start|>, <|im_end|> and "\n".
IM_START, IM_END, NEWLINE = 1, 2, 198


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def byte_tokenizer(bos: bool = False) -> PreTrainedTokenizerFast:
    """Byte-level, no merges: every UTF-8 byte is its own token (and <s> = 256 first when
    `bos`)."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<s>"] = 256
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    if bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", 256)]
        )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>")
