"""A GGUF's tokenizer built from its own keys (engine/loaders/gguf/tokenizer.py) against
transformers' GGUF conversion of the same file, the oracle: the same backend (model,
normalizer, pre-tokenizer, decoder, added tokens), the same token ids for code, unicode,
emoji, whitespace runs and special tokens, the same decoding and special tokens, for each
kind the builder covers: byte-level BPE with merges (a tiny vocabulary; the starter's
real one under each pre-tokenizer split it knows), byte-level without merges, and
sentencepiece (Llama's, Phi-3's). Gemma's sentencepiece files stay with transformers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.loaders import load_model_files
from engine.loaders.catalog import starter_path
from engine.loaders.gguf.header import parse_gguf_header
from engine.loaders.gguf.tokenizer import (
    TOKENIZER_ARRAYS,
    build_tokenizer,
    built_here,
    convert_with_transformers,
)
from tests.engine.loaders.gguf import test_gguf_families as families
from tests.engine.loaders.gguf import test_gguf_loader as llama_files
from tests.engine.loaders.gguf.test_gguf_fast_load import _same_tokenizer

REPO = Path(__file__).resolve().parents[4]
TEXTS = [
    "hello world", "Hello, World! I'm here; they'll see.", "",
    "def f(x):\n    return {'a': x ** 2}  # squared\n\n\n", "for (int i = 0; i < 10; ++i) {}",
    "naïve café — ünïcödé 日本語のテスト Ελληνικά", "emoji 😀👍🏽 family 👨‍👩‍👧 flag 🇫🇷",
    "   three leading", "tabs\t\tand\r\nnewlines\n\n\n  trailing   ", "12345678 3.14159 1,000",
    "<|im_start|>user\nHi<|im_end|>\n", "<s>x</s><unk><|user|>hello<|end|>", "<think>hm</think>",
]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def write_tokenizer_gguf(path: Path, arch: str, keys: dict[str, object]) -> Path:
    """A GGUF of `arch` with a one-layer config (what transformers reads to pick its
    tokenizer class), the tokenizer `keys` and an embedding; nothing to run."""
    writer = gguf.GGUFWriter(str(path), arch)
    config = {"block_count": 1, "context_length": 128, "embedding_length": 32,
              "feed_forward_length": 64, "attention.head_count": 2,
              "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon": 1e-5,
              "rope.freq_base": 10000.0}
    for key, value in config.items():
        families.put(writer, f"{arch}.{key}", value)
    for key, value in keys.items():
        families.put(writer, key, value)
    rows = len(keys["tokenizer.ggml.tokens"])
    writer.add_tensor("token_embd.weight", np.zeros((rows, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_bpe_keys(pre: str) -> dict[str, object]:
    """Byte-level BPE: GPT-2's 256 byte letters, merges of digits, words and spaces, a
    control and a user-defined token."""
    letters = sorted(families.byte_level_metadata()["tokenizer.ggml.tokens"][:256])
    merges = ["1 2", "12 3", "4 5", "h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "r l",
              "Ġwo rl", "Ġworl d", "Ġ Ġ", "ĠĠ Ġ", "Ċ Ċ", "' s", "' ll"]
    merged = [m.replace(" ", "") for m in merges]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>"] + letters + merged
    types = [3, 3, 3, 4] + [1] * (len(tokens) - 4)
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.padding_token_id": 0,
            "tokenizer.chat_template": families.CHATML}


def starter_keys(pre: str) -> dict[str, object]:
    """The starter's whole vocabulary and merges (SmolLM2's), under split ``pre``."""
    metadata = parse_gguf_header(starter_path(), TOKENIZER_ARRAYS).metadata
    keys = {k: v for k, v in metadata.items() if k.startswith("tokenizer.")}
    return {**keys, "tokenizer.ggml.pre": pre}


KINDS = {
    "bpe-default": lambda: ("llama", tiny_bpe_keys("default")),
    "bpe-llama3": lambda: ("llama", tiny_bpe_keys("llama-bpe")),
    "bpe-qwen2": lambda: ("qwen2", tiny_bpe_keys("qwen2")),
    "bpe-no-merges": lambda: ("llama", families.byte_level_metadata()),
    "spm-llama": lambda: ("llama", families.sentencepiece_metadata(
        families.SPM_SPECIALS["phi3"], bos=1, eos=2)),
    "spm-phi3": lambda: ("phi3", families.sentencepiece_metadata(
        families.SPM_SPECIALS["phi3"], bos=1, eos=2)),
}


def built_and_converted(path: Path):
    metadata = parse_gguf_header(path, TOKENIZER_ARRAYS).metadata
    return build_tokenizer(metadata), convert_with_transformers(path)


def assert_same(ours, theirs, beyond: int | None = None) -> None:
    """``beyond``: the file's vocabulary size, where transformers added a default special
    token past it (a token the model has no row for); the builder adds none, and the rest
    is compared."""
    mine, converted = (json.loads(t.backend_tokenizer.to_str()) for t in (ours, theirs))
    if beyond is not None:
        assert [t["id"] for t in converted["added_tokens"] if t["id"] >= beyond] == [beyond]
        assert all(t["id"] < beyond for t in mine["added_tokens"])
        converted["added_tokens"] = [t for t in converted["added_tokens"] if t["id"] < beyond]
    assert mine == converted
    for text in TEXTS:
        for special in (True, False):
            assert ours.encode(text, add_special_tokens=special) == theirs.encode(
                text, add_special_tokens=special), (text, special)
    if beyond is None:
        _same_tokenizer(theirs, ours)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_built_tokenizer_is_transformers_conversion(tmp_path, kind):
    arch, keys = KINDS[kind]()
    path = write_tokenizer_gguf(tmp_path / f"{kind}.gguf", arch, keys)
    ours, theirs = built_and_converted(path)
    assert ours is not None
    assert_same(ours, theirs)


@pytest.mark.parametrize("pre", ["smollm", "llama-bpe", "qwen2"])
def test_the_starters_vocabulary_builds_as_converted_under_each_split(tmp_path, pre):
    path = write_tokenizer_gguf(tmp_path / f"starter-{pre}.gguf", "llama", starter_keys(pre))
    ours, theirs = built_and_converted(path)
    assert_same(ours, theirs)
    assert len(ours.encode(TEXTS[3], add_special_tokens=False)) < len(TEXTS[3])  # merged


def test_the_splits_differ_where_their_models_do(tmp_path):
    # Digits: GPT-2's split keeps a run whole, Llama 3's cuts it in threes, Qwen2's in ones.
    pieces = {}
    for pre in ("default", "llama-bpe", "qwen2"):
        path = write_tokenizer_gguf(tmp_path / f"{pre}.gguf", "llama", tiny_bpe_keys(pre))
        tokenizer = build_tokenizer(parse_gguf_header(path, TOKENIZER_ARRAYS).metadata)
        pieces[pre] = tokenizer.tokenize("12345")
    assert pieces == {"default": ["123", "45"], "llama-bpe": ["123", "45"],
                      "qwen2": ["1", "2", "3", "4", "5"]}


def test_kinds_not_built_here_stay_with_transformers(tmp_path):
    gemma = families.sentencepiece_metadata(families.SPM_SPECIALS["gemma"], bos=2, eos=1)
    assert not built_here({**gemma, "general.architecture": "gemma2"})
    assert not built_here({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "tekken"})
    assert not built_here({"tokenizer.ggml.model": "t5"})
    assert build_tokenizer({**gemma, "general.architecture": "gemma3"}) is None
    path = write_tokenizer_gguf(tmp_path / "gemma.gguf", "gemma2", gemma)
    # Loading still gives transformers' Gemma tokenizer (the family tests load its models).
    assert type(convert_with_transformers(path)).__name__ == "GemmaTokenizer"


def test_a_special_token_id_past_the_vocabulary_is_an_error():
    keys = {**tiny_bpe_keys("default"), "general.architecture": "llama",
            "tokenizer.ggml.eos_token_id": 10_000}
    with pytest.raises(ValueError, match="eos_token_id is 10000, past the vocabulary"):
        build_tokenizer(keys)


def test_a_loaded_file_tokenizes_as_before(tmp_path):
    path = tmp_path / "tiny.gguf"
    llama_files.write_gguf(path, llama_files.tiny_state())
    loaded = load_model_files(path).tokenizer
    # The file names no unknown token: transformers adds GPT-2's "<|endoftext|>" as one.
    assert_same(loaded, convert_with_transformers(path), beyond=len(llama_files.TOKENS))


_CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from gguf import gguf_reader
    from engine.loaders import load_model_files
    opened = []
    gguf_reader.GGUFReader.__init__ = lambda self, *args, **kwargs: opened.append(args)
    load_model_files(Path(sys.argv[1]))
    print(opened, "transformers.integrations.gguf" in sys.modules)
""")


def test_a_first_load_reads_no_file_through_gguf_reader(tmp_path, cache_dir):
    path = tmp_path / "tiny.gguf"
    llama_files.write_gguf(path, llama_files.tiny_state())
    env = {"FOLIO_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[] False"
    assert any((cache_dir / "gguf").iterdir())  # it was a first load: the entry written
