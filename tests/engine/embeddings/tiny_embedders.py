"""Tiny random embedding models saved as real folders (and a GGUF file written with the
``gguf`` package), with transformers' pooling of the same weights as the reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from transformers import BertConfig, BertModel, BertTokenizerFast, Qwen3Config, Qwen3Model

from tests.engine.tiny_models import SPECIALS, byte_level_tokenizer

WORDS = ("the pump runs at litres per hour in winter who renews forklift licences where is "
         "fire assembly point car park garden ferry leaves harbour pier quarter past six "
         "manual page report budget plan staff office door window power cable").split()
BERT_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(set(WORDS)),
              *[f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"],
              *"abcdefghijklmnopqrstuvwxyz0123456789.,?!'-"]


def save_tiny_bert(path: Path, pooling: str = "cls", normalize: bool = True,
                   seed: int = 0) -> Path:
    """A random BertModel folder with a WordPiece tokenizer and sentence-transformers'
    modules.json / 1_Pooling/config.json saying ``pooling`` ("cls", "mean", "lasttoken")."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(BERT_VOCAB) + "\n")
    BertTokenizerFast(str(path / "vocab.txt"), do_lower_case=True).save_pretrained(path)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(BERT_VOCAB), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=64, layer_norm_eps=1e-12)
    BertModel(config).eval().save_pretrained(path, safe_serialization=True)
    write_pooling(path, pooling, 32, normalize)
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 48}))
    return path


def write_pooling(path: Path, pooling: str, dims: int, normalize: bool = True) -> None:
    """sentence-transformers' modules.json and 1_Pooling/config.json saying ``pooling``
    ("cls", "mean", "lasttoken"), then normalization or not."""
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": dims, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_lasttoken": pooling == "lasttoken"}))


def tiny_qwen3_config(**overrides) -> Qwen3Config:
    fields = dict(vocab_size=256 + len(SPECIALS), hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, bos_token_id=256, eos_token_id=258,
                  architectures=["Qwen3ForCausalLM"])
    fields.update(overrides)
    return Qwen3Config(**fields)


def save_tiny_qwen3_embedder(path: Path, seed: int = 0) -> Path:
    """A random Qwen3 saved as Qwen3-Embedding is: the base model (``Qwen3Model``: names
    without ``model.``, no LM head) under a Qwen3ForCausalLM config, a byte tokenizer."""
    torch.manual_seed(seed)
    model = Qwen3Model(tiny_qwen3_config()).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    model.save_pretrained(path, safe_serialization=True)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["Qwen3ForCausalLM"]  # as Qwen3-Embedding's says
    (path / "config.json").write_text(json.dumps(config))
    write_pooling(path, "lasttoken", 64)
    byte_level_tokenizer().save_pretrained(path)
    return path


def hf_bert_vectors(folder: Path, texts: list[str], pooling: str, max_length: int = 48
                    ) -> torch.Tensor:
    """transformers' BertModel on the folder, pooled as sentence-transformers does."""
    tok = BertTokenizerFast.from_pretrained(folder)
    model = BertModel.from_pretrained(folder).eval()
    batch = tok(texts, padding=True, truncation=True, max_length=max_length,
                return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"]
    if pooling == "cls":
        out = hidden[:, 0]
    elif pooling == "mean":
        out = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    else:
        out = hidden[torch.arange(len(texts)), mask.sum(1) - 1]
    return torch.nn.functional.normalize(out, dim=-1)


def hf_qwen3_vectors(folder: Path, ids: list[list[int]]) -> torch.Tensor:
    """transformers' Qwen3Model: each text's final-norm hidden state at its last token."""
    model = Qwen3Model.from_pretrained(folder).eval()
    out = []
    with torch.no_grad():
        for t in ids:
            out.append(model(torch.tensor([t])).last_hidden_state[0, -1])
    return torch.nn.functional.normalize(torch.stack(out), dim=-1)


def save_tiny_nomic(path: Path, seed: int = 0) -> Path:
    """A random nomic-embed-text style folder (NomicBertModel's config and names: rotary,
    fused Wqkv, SwiGLU fc11 / fc12 / fc2, no biases but the norms'), the BERT tokenizer."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(BERT_VOCAB) + "\n")
    BertTokenizerFast(str(path / "vocab.txt"), do_lower_case=True).save_pretrained(path)
    h, f, layers = 32, 64, 2
    config = {"model_type": "nomic_bert", "architectures": ["NomicBertModel"],
              "vocab_size": len(BERT_VOCAB), "n_embd": h, "n_head": 4, "n_layer": layers,
              "n_inner": f, "n_positions": 128, "layer_norm_epsilon": 1e-12,
              "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0, "type_vocab_size": 2}
    (path / "config.json").write_text(json.dumps(config))
    g = torch.Generator().manual_seed(seed)
    weights = {"embeddings.word_embeddings.weight": torch.randn(len(BERT_VOCAB), h, generator=g),
               "embeddings.token_type_embeddings.weight": torch.randn(2, h, generator=g),
               "emb_ln.weight": 1 + 0.1 * torch.randn(h, generator=g),
               "emb_ln.bias": 0.1 * torch.randn(h, generator=g)}
    for i in range(layers):
        p = f"encoder.layers.{i}."
        for name, shape in (("attn.Wqkv", (3 * h, h)), ("attn.out_proj", (h, h)),
                            ("mlp.fc11", (f, h)), ("mlp.fc12", (f, h)), ("mlp.fc2", (h, f))):
            weights[p + name + ".weight"] = torch.randn(shape, generator=g) * shape[1] ** -0.5
        for norm in ("norm1", "norm2"):
            weights[f"{p}{norm}.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
            weights[f"{p}{norm}.bias"] = 0.1 * torch.randn(h, generator=g)
    save_file(weights, str(path / "model.safetensors"))
    return path


def write_bert_gguf(folder: Path, out: Path, pooling_type: int = 2,
                    f16: tuple[str, ...] = ()) -> Path:
    """The tiny BertModel (or nomic-bert) folder as llama.cpp's converter writes it: arch
    ``bert`` (``nomic-bert``), the vocabulary with phantom spaces, gguf's own tensor
    names; ``f16``: GGUF names stored as float16."""
    import gguf
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    nomic = config.get("model_type") == "nomic_bert"
    if nomic:
        config = {"max_position_embeddings": config["n_positions"],
                  "hidden_size": config["n_embd"], "intermediate_size": config["n_inner"],
                  "num_hidden_layers": config["n_layer"],
                  "num_attention_heads": config["n_head"],
                  "layer_norm_eps": config["layer_norm_epsilon"],
                  "type_vocab_size": config["type_vocab_size"],
                  "rope": config["rotary_emb_base"]}
    layers = config["num_hidden_layers"]
    arch = gguf.MODEL_ARCH.NOMIC_BERT if nomic else gguf.MODEL_ARCH.BERT
    names = gguf.get_tensor_name_map(arch, layers)
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name("tiny-bert")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(layers)
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config["layer_norm_eps"])
    if nomic:
        writer.add_rope_freq_base(config["rope"])
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(pooling_type))
    vocab = (folder / "vocab.txt").read_text().split("\n")[:-1]
    phantom = [t if t.startswith("[") and t.endswith("]") else
               t[2:] if t.startswith("##") else "\u2581" + t for t in vocab]
    writer.add_tokenizer_model("bert")
    writer.add_token_list(phantom)
    writer.add_token_types([gguf.TokenType.NORMAL] * len(vocab))
    writer.add_token_type_count(config["type_vocab_size"])
    writer.add_bos_token_id(vocab.index("[CLS]"))
    writer.add_sep_token_id(vocab.index("[SEP]"))
    writer.add_unk_token_id(vocab.index("[UNK]"))
    writer.add_pad_token_id(vocab.index("[PAD]"))
    for name, tensor in load_file(folder / "model.safetensors").items():
        if name.startswith("pooler.") or name.endswith("position_ids"):
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new is not None, name
        data = tensor.float().numpy()
        base = new.rsplit(".", 1)[0]
        writer.add_tensor(new, data.astype(np.float16) if base in f16 else data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def write_qwen3_gguf(folder: Path, out: Path) -> Path:
    """The tiny Qwen3 embedder as llama.cpp writes Qwen3-Embedding: arch ``qwen3``, no
    ``output.weight`` (tied), ``qwen3.pooling_type`` 3 (last), the byte vocabulary."""
    import gguf
    from safetensors.torch import load_file

    from tests.engine.loaders.gguf.test_gguf_families import byte_level_metadata, write_tensors

    config = tiny_qwen3_config()
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, config.num_hidden_layers)
    keys = {"context_length": config.max_position_embeddings,
            "block_count": config.num_hidden_layers, "embedding_length": config.hidden_size,
            "feed_forward_length": config.intermediate_size,
            "attention.head_count": config.num_attention_heads,
            "attention.head_count_kv": config.num_key_value_heads,
            "attention.key_length": config.head_dim, "attention.value_length": config.head_dim,
            "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
            "rope.freq_base": float(config.rope_parameters["rope_theta"]),
            "pooling_type": 3}
    tensors = {}
    for name, tensor in load_file(folder / "model.safetensors").items():
        new = names.get_name("model." + name, try_suffixes=(".weight", ".bias"))
        assert new is not None, name
        tensors[new] = tensor.float().numpy()
    metadata = {**{f"qwen3.{k}": v for k, v in keys.items()}, **byte_level_metadata()}
    write_tensors(out, "qwen3", metadata, tensors, gguf.GGMLQuantizationType.F32,
                  lambda _name, _data: False)
    return out
