"""A GGUF file's later loads (from its cache entry) without transformers' model code: the
config read back as a FileConfig, the tokenizer through the tokenizers-backed class
directly. Each is checked against the first load's (transformers' own config class, or
for Llama, Qwen2 and Qwen3 the config read from the keys, which test_gguf_keys_config.py
checks against that class; and the GGUF tokenizer conversion): the same config values and
model spec, the same token ids for the same text and chats, the same greedy replies; and a
fresh process that loads from the cache imports no ``transformers.models`` module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine.llm import LLM
from engine.loaders import load_model_files
from engine.loaders.gguf.file_config import FileConfig, config_from_record
from engine.models import build_model, family_of
from engine.sampling_params import SamplingParams
from engine.text.chat_template import chat_tokenizer_for
from tests.engine.loaders.config_checks import transformers_imported
from tests.engine.loaders.gguf import test_gguf_families as families
from tests.engine.loaders.gguf import test_gguf_loader as llama_files

REPO = Path(__file__).resolve().parents[4]
TEXTS = ["hello hello", "", " ", "  hello\n\nhell o", "<s>hello</s>", "ab<|im_end|>cd",
         "<|im_start|>user\nhi<|im_end|>", "héllo wörld 😀 日本語", "tab\tand\r\nnewline"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hell o", "token_ids": None},
        {"role": "user", "content": "again 😀"}]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _llama_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    llama_files.write_gguf(path, llama_files.tiny_state())
    return path


def _family_file(tmp_path: Path, variant: str) -> Path:
    arch, make_config = families.VARIANTS[variant]
    config = make_config()
    state = families.random_model(config).state_dict()
    path = tmp_path / f"{variant}.gguf"
    families.write_gguf(path, arch, config, state, Q.F32)
    return path


def _files(tmp_path: Path, name: str) -> Path:
    return _llama_file(tmp_path) if name == "llama" else _family_file(tmp_path, name)


def _cold_and_warm(path: Path):
    cold = load_model_files(path)
    warm = load_model_files(path)
    # A first load builds transformers' config unless the family's is read from the keys
    # (test_gguf_keys_config.py checks those against transformers' class).
    assert isinstance(cold.config, FileConfig) == (
        family_of(cold.config).config_defaults is not None)
    assert isinstance(warm.config, FileConfig)
    return cold, warm


@pytest.mark.parametrize("name", ["llama", "gemma2", "gemma3", "phi3", "phi4"])
def test_the_cached_config_reads_as_transformers_built_it(tmp_path, name):
    cold, warm = _cold_and_warm(_files(tmp_path, name))
    assert warm.config.to_dict() == cold.config.to_dict()
    for key in cold.config.to_dict().keys() - {"transformers_version"}:  # JSON's stamp
        assert getattr(warm.config, key) == getattr(cold.config, key), key
    for alias, real in getattr(cold.config, "attribute_map", {}).items():
        assert getattr(warm.config, alias) == getattr(cold.config, real), alias
    assert build_model(warm.config, torch.float32, "meta").spec == build_model(
        cold.config, torch.float32, "meta").spec


def test_the_cached_tokenizer_gives_the_converted_ids(tmp_path):
    cold, warm = _cold_and_warm(_llama_file(tmp_path))
    assert type(warm.tokenizer) is type(cold.tokenizer)
    _same_tokenizer(cold.tokenizer, warm.tokenizer)


def _same_tokenizer(cold, warm) -> None:
    assert warm.get_vocab() == cold.get_vocab()
    assert (warm.bos_token, warm.eos_token, warm.chat_template) == (
        cold.bos_token, cold.eos_token, cold.chat_template)
    assert warm.all_special_ids == cold.all_special_ids
    for text in TEXTS:
        for special in (True, False):
            ids = cold.encode(text, add_special_tokens=special)
            assert warm.encode(text, add_special_tokens=special) == ids, (text, special)
            for skip in (True, False):
                assert warm.decode(ids, skip_special_tokens=skip) == cold.decode(
                    ids, skip_special_tokens=skip)
    chat_cold = chat_tokenizer_for(cold, "chatml")
    chat_warm = chat_tokenizer_for(warm, "chatml")
    assert chat_warm.eos_token_ids == chat_cold.eos_token_ids
    for generation in (True, False):
        assert chat_warm.encode_chat(CHAT, generation) == chat_cold.encode_chat(CHAT, generation)


def test_a_config_record_that_is_not_one_rebuilds_the_entry(tmp_path, cache_dir):
    path = _llama_file(tmp_path)
    load_model_files(path)
    (entry,) = (cache_dir / "gguf").iterdir()
    meta = json.loads((entry / "meta.json").read_text())
    meta["hf_config"] = {"values": 3}
    (entry / "meta.json").write_text(json.dumps(meta))
    again = load_model_files(path)  # rebuilt from the file, not an error
    assert again.config.num_key_value_heads == 2
    with pytest.raises((KeyError, TypeError, ValueError)):
        config_from_record({"values": 3})
    assert json.loads((entry / "meta.json").read_text())["hf_config"]["values"]["vocab_size"] \
        == len(llama_files.TOKENS)


def test_a_file_config_names_a_missing_attribute():
    config = FileConfig({"model_type": "llama", "num_experts": 4}, {"num_local_experts":
                                                                   "num_experts"})
    assert config.num_local_experts == 4
    assert getattr(config, "sliding_window", None) is None
    with pytest.raises(AttributeError, match="no attribute 'sliding_window'"):
        config.sliding_window  # noqa: B018


def _greedy(path: Path) -> list[list[int]]:
    with LLM(path, max_model_len=64, num_gpu_blocks=16, block_size=16) as llm:
        params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        outs = llm.generate(["hello hello", [3, 4, 5, 6, 7]], params)
        return [list(out.outputs[0].token_ids) for out in outs]


def test_greedy_replies_are_the_same_from_the_cache(tmp_path):
    path = _llama_file(tmp_path)
    first = _greedy(path)  # converts and writes the entry
    assert isinstance(load_model_files(path).config, FileConfig)
    assert _greedy(path) == first


def test_a_load_from_the_cache_imports_no_transformers_model_code(tmp_path, cache_dir):
    path = _llama_file(tmp_path)
    load_model_files(path)  # the first load: the entry written
    assert transformers_imported(path, cache_dir) == []


@pytest.mark.slow
def test_the_starter_from_its_cache_tokenizes_as_converted():
    from engine.loaders.catalog import starter_path

    cold, warm = _cold_and_warm(starter_path())
    assert type(warm.tokenizer) is type(cold.tokenizer)
    _same_tokenizer(cold.tokenizer, warm.tokenizer)
    assert warm.config.to_dict() == cold.config.to_dict()
