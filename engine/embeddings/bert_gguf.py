"""A BERT-family embedding model from a llama.cpp GGUF file (architectures ``bert`` and
``nomic-bert``), read with the ``gguf`` package: its keys to a ``BertSpec`` and pooling,
its tensors to the encoder's Hugging Face names (dequantized to float32), its WordPiece
vocabulary to a ``tokenizers`` tokenizer.

llama.cpp's converter writes the vocabulary with "phantom spaces": a word-initial piece
as ``▁piece``, a continuation (WordPiece's ``##piece``) bare, ``[CLS]``-style specials as
they are; read back here. Its WordPiece tokenizer lowercases, as the uncased BERT
vocabularies these models use do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.embeddings.bert import BERT, NOMIC, BertSpec
from engine.embeddings.pooling import CLS, GGUF_POOLINGS, MEAN

ARCHITECTURES = (BERT, NOMIC)
_PHANTOM = "\u2581"

# The encoder's names (bert.py) by GGUF name; "{i}" a layer.
_BERT_NAMES = {
    "token_embd": "embeddings.word_embeddings", "token_types":
    "embeddings.token_type_embeddings", "position_embd": "embeddings.position_embeddings",
    "token_embd_norm": "embeddings.LayerNorm",
    "blk.{i}.attn_q": "encoder.layer.{i}.attention.self.query",
    "blk.{i}.attn_k": "encoder.layer.{i}.attention.self.key",
    "blk.{i}.attn_v": "encoder.layer.{i}.attention.self.value",
    "blk.{i}.attn_output": "encoder.layer.{i}.attention.output.dense",
    "blk.{i}.attn_output_norm": "encoder.layer.{i}.attention.output.LayerNorm",
    "blk.{i}.ffn_up": "encoder.layer.{i}.intermediate.dense",
    "blk.{i}.ffn_down": "encoder.layer.{i}.output.dense",
    "blk.{i}.layer_output_norm": "encoder.layer.{i}.output.LayerNorm",
}
_NOMIC_NAMES = {
    "token_embd": "embeddings.word_embeddings", "token_types":
    "embeddings.token_type_embeddings", "token_embd_norm": "emb_ln",
    "blk.{i}.attn_qkv": "encoder.layers.{i}.attn.Wqkv",
    "blk.{i}.attn_output": "encoder.layers.{i}.attn.out_proj",
    "blk.{i}.attn_output_norm": "encoder.layers.{i}.norm1",
    "blk.{i}.ffn_up": "encoder.layers.{i}.mlp.fc11",
    "blk.{i}.ffn_gate": "encoder.layers.{i}.mlp.fc12",
    "blk.{i}.ffn_down": "encoder.layers.{i}.mlp.fc2",
    "blk.{i}.layer_output_norm": "encoder.layers.{i}.norm2",
}


@dataclass(slots=True)
class GGUFEncoder:
    spec: BertSpec
    pooling: str
    weights: list[tuple[str, torch.Tensor]]
    tokenizer: object  # transformers.PreTrainedTokenizerFast
    name: str


def gguf_kind(path: Path) -> tuple[str | None, str | None]:
    """The file's general.architecture and the pooling its ``{arch}.pooling_type`` says
    (None for either that it does not)."""
    from gguf import GGUFReader

    reader = GGUFReader(path, "r")
    arch = _value(reader, "general.architecture")
    return arch, GGUF_POOLINGS.get(_value(reader, f"{arch}.pooling_type"))


def read_gguf_encoder(path: Path) -> GGUFEncoder:
    from gguf import GGUFReader

    reader = GGUFReader(path, "r")
    arch = _value(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: a GGUF of architecture {arch!r}; the BERT-family "
                         f"embedders Folio runs are {', '.join(ARCHITECTURES)}")

    def key(name: str, default=None):
        found = _value(reader, f"{arch}.{name}")
        if found is None and default is None:
            raise ValueError(f"{path}: the key {arch}.{name} is missing")
        return default if found is None else found

    tokens = _value(reader, "tokenizer.ggml.tokens")
    if not tokens or _value(reader, "tokenizer.ggml.model") != "bert":
        raise ValueError(f"{path}: no WordPiece vocabulary (tokenizer.ggml.model 'bert')")
    hidden = key("embedding_length")
    spec = BertSpec(arch, len(tokens), hidden, key("block_count"),
                    key("attention.head_count"), key("feed_forward_length"),
                    key("context_length"),
                    _value(reader, "tokenizer.ggml.token_type_count") or 2,
                    key("attention.layer_norm_epsilon"),
                    key("rope.freq_base", 10000.0) if arch == NOMIC else 10000.0)
    pooling = GGUF_POOLINGS.get(key("pooling_type", -1))
    if pooling is None:
        pooling = MEAN if arch == NOMIC else CLS
    names = _BERT_NAMES if arch == BERT else _NOMIC_NAMES
    weights = [(_hf_name(t.name, names, path), _tensor(t)) for t in reader.tensors]
    return GGUFEncoder(spec, pooling, weights, _tokenizer(reader, tokens, path),
                       _value(reader, "general.name") or path.stem)


def _value(reader, name: str):
    field = reader.get_field(name)
    return None if field is None else field.contents()


def _hf_name(name: str, names: dict[str, str], path: Path) -> str:
    base, _, suffix = name.rpartition(".")
    parts = base.split(".")
    layer = None
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
        layer, base = parts[1], f"blk.{{i}}.{parts[2]}"
    target = names.get(base)
    if target is None or suffix not in ("weight", "bias"):
        raise ValueError(f"{path}: unexpected tensor {name!r}")
    return f"{target.replace('{i}', layer or '')}.{suffix}"


def _tensor(tensor) -> torch.Tensor:
    from gguf import GGMLQuantizationType, quants

    shape = tuple(int(d) for d in reversed(tensor.shape))
    data = np.asarray(tensor.data)
    if tensor.tensor_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        data = quants.dequantize(data, tensor.tensor_type)
    return torch.from_numpy(np.array(data, dtype=np.float32).reshape(shape))


def _tokenizer(reader, tokens: list[str], path: Path):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {}
    for i, tok in enumerate(tokens):
        if tok.startswith("[") and tok.endswith("]"):
            word = tok
        elif tok.startswith(_PHANTOM):
            word = tok[len(_PHANTOM):]
        else:
            word = "##" + tok
        vocab.setdefault(word, i)

    def special(key: str, fallback: str) -> str:
        found = _value(reader, key)
        return tokens[found] if isinstance(found, int) and 0 <= found < len(tokens) \
            else fallback

    cls = special("tokenizer.ggml.bos_token_id", "[CLS]")
    sep = special("tokenizer.ggml.seperator_token_id",
                  special("tokenizer.ggml.eos_token_id", "[SEP]"))
    unk = special("tokenizer.ggml.unknown_token_id", "[UNK]")
    pad = special("tokenizer.ggml.padding_token_id", "[PAD]")
    for name in (cls, sep, unk):
        if name not in vocab:
            raise ValueError(f"{path}: the vocabulary has no {name} token")
    core = Tokenizer(models.WordPiece(vocab, unk_token=unk))
    core.normalizer = normalizers.BertNormalizer(lowercase=True)
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    core.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    return PreTrainedTokenizerFast(tokenizer_object=core, cls_token=cls, sep_token=sep,
                                   unk_token=unk, pad_token=pad if pad in vocab else unk)
