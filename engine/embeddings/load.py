"""``load_embedder``: an embedding model's folder or GGUF file to an ``Embedder``, loaded
once per process (the server's ``/v1/embeddings`` and the documents' retrieval share it).

What a path holds decides the kind: a GGUF of architecture ``bert`` / ``nomic-bert``, or
a folder whose config is ``BertModel``'s or ``NomicBertModel``'s, is a BERT encoder
(bert.py); anything else is a decoder of a family Folio runs (decoder.py: last-token
pooling, as Qwen3-Embedding is used). Pooling and normalization as the folder's
sentence-transformers files say, else the kind's: CLS for BERT, mean for nomic-bert (a
decoder must say: last token for Qwen3-Embedding; one that does not is a chat model);
normalized.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import torch

from engine.embeddings.bert import BERT, NOMIC, BertEncoder, BertSpec
from engine.embeddings.bert_gguf import ARCHITECTURES, gguf_kind, read_gguf_encoder
from engine.embeddings.decoder import DecoderEncoder
from engine.embeddings.embedder import DOCUMENT, QUERY, Embedder
from engine.embeddings.pooling import CLS, MEAN
from engine.embeddings.probe import NOT_AN_EMBEDDER
from engine.embeddings.sentence_config import SentenceConfig, read_sentence_config

DECODER = "decoder"
MAX_DECODER_LENGTH = 8192  # tokens of one text: a longer one is cut (memory per batch)
_DEFAULT_POOLING = {BERT: CLS, NOMIC: MEAN}
# Qwen3-Embedding's model card: queries carry a one-line task, documents nothing.
QWEN3_QUERY = ("Instruct: Given a web search query, retrieve relevant passages that "
               "answer the query\nQuery:")
_DEFAULT_PROMPTS = {NOMIC: {QUERY: "search_query: ", DOCUMENT: "search_document: "}}

_loaded: dict[str, Embedder] = {}
_lock = threading.Lock()


def load_embedder(path: str | Path) -> Embedder:
    """The embedder at ``path``, loaded on the first call; ValueError naming the path and
    what is wrong for anything that is not an embedding model Folio runs."""
    resolved = Path(path).expanduser()
    key = str(resolved.resolve()) if resolved.exists() else str(resolved)
    with _lock:
        found = _loaded.get(key)
        if found is None:
            found = _loaded[key] = _load(resolved)
        return found


def embedding_model(path: str | Path | None) -> Embedder | None:
    """The ``embedding_model`` setting's embedder (EngineConfig's, the server's), None for
    none; a ValueError naming the setting for a path that is not one."""
    if path is None:
        return None
    try:
        return load_embedder(path)
    except ValueError as exc:
        raise ValueError(f"embedding_model: {exc}") from exc


def _load(path: Path) -> Embedder:
    if not path.exists():
        raise ValueError(f"{path}: no such file or folder; pick an embedding model's "
                         "folder or .gguf file")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"{path}: not a model; pick its folder (with config.json) or "
                             "a .gguf file")
        arch, pooling = gguf_kind(path)
        if arch in ARCHITECTURES:
            read = read_gguf_encoder(path)
            encoder = BertEncoder(read.spec, read.weights, str(path))
            return _embedder(read.name, path, read.tokenizer, encoder, read.spec.variant,
                             SentenceConfig(pooling=read.pooling))
        return _decoder(path, SentenceConfig(pooling=pooling))
    config = _config(path)
    sentence = read_sentence_config(path)
    if config.get("model_type") in ("bert", "nomic_bert") or "n_embd" in config:
        from transformers import AutoTokenizer

        spec = BertSpec.of_config(config)
        encoder = BertEncoder(spec, _safetensors(path), str(path))
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        return _embedder(path.name, path, tokenizer, encoder, spec.variant, sentence)
    return _decoder(path, sentence)


def _decoder(path: Path, sentence: SentenceConfig) -> Embedder:
    from engine.loaders import load_model_files
    from engine.models import build_model

    if sentence.pooling is None:
        raise ValueError(NOT_AN_EMBEDDER.format(name=path.name))
    loaded = load_model_files(path, torch.float32)
    config = loaded.config
    # A base model's class (Qwen3Model) names the causal LM whose layers it has.
    config.architectures = [a.removesuffix("Model") + "ForCausalLM"
                            if a.endswith("Model") else a
                            for a in getattr(config, "architectures", None) or ()]
    if "lm_head.weight" not in loaded.weights.shapes:
        # An embedding checkpoint without a head (Qwen3-Embedding's): the logits are
        # never computed, so a tied head takes no weights.
        config.tie_word_embeddings = True
    model = build_model(config, torch.float32, "cpu")
    model.load_weights(loaded.weights)
    prompts = sentence.prompts or (
        {QUERY: QWEN3_QUERY} if getattr(config, "model_type", "") == "qwen3" else {})
    return _embedder(loaded.name, path, loaded.tokenizer,
                     DecoderEncoder(model, str(path)), DECODER,
                     SentenceConfig(sentence.pooling, sentence.normalized,
                                    sentence.max_length, prompts))


def _embedder(name: str, path: Path, tokenizer, encoder, kind: str,
              sentence: SentenceConfig) -> Embedder:
    max_length = min(sentence.max_length or encoder.max_positions, encoder.max_positions)
    if kind == DECODER:
        max_length = min(max_length, MAX_DECODER_LENGTH)
    prompts = sentence.prompts or _DEFAULT_PROMPTS.get(kind, {})
    normalized = True if sentence.normalized is None else sentence.normalized
    # bge and its kin were not trained for truncated vectors; Qwen3-Embedding (its card:
    # "MRL support") and nomic-embed-text v1.5 were.
    return Embedder(name, identity(path), tokenizer, encoder,
                    sentence.pooling or _DEFAULT_POOLING[kind], normalized, max_length,
                    prompts, matryoshka=kind != BERT, kind=kind)


def identity(path: Path) -> str:
    """A hash of the weights' files (name, size, first and last 64 KiB of each) and the
    folder's small config files: the same model anywhere on disk, another model (or
    other weights) elsewhere."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*") if p.is_file() and p.suffix in
        (".safetensors", ".gguf", ".json", ".txt"))
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.relative_to(path) if path.is_dir() else ''}:{size}".encode())
        with file.open("rb") as f:
            digest.update(f.read(1 << 16))
            if size > 1 << 17:
                f.seek(-(1 << 16), 2)
                digest.update(f.read())
    return digest.hexdigest()[:24]


def _config(folder: Path) -> dict:
    path = folder / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: missing; an embedding model's folder needs config.json "
                         "(for a GGUF model pick the .gguf file)") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from exc


def _safetensors(folder: Path):
    from safetensors.torch import load_file

    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"{folder}: no .safetensors weights")
    for shard in shards:
        yield from load_file(shard).items()
