"""A Hugging Face folder's later loads (engine/loaders/folder_cache.py): the config read back
as the FileConfig a cached GGUF gives, the tokenizer as Folio's own object. Checked
against the first load (transformers' config class, or for a Llama folder config.json
read as it states it) and transformers' AutoTokenizer: the same config values and model
spec, the same tokenizer, the same greedy replies; a changed config.json or tokenizer
file is read again, a damaged entry written again, a tokenizer Folio's object cannot
stand for kept as transformers'; a fresh process that loads a folder from the cache
imports no transformers module at all."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from engine.llm import LLM
from engine.loaders import load_model_files
from engine.loaders.gguf.file_config import FileConfig
from engine.models import build_model
from engine.sampling_params import SamplingParams
from engine.text.file_tokenizer import FileTokenizer
from tests.engine.loaders.config_checks import transformers_imported
from tests.engine.loaders.gguf.test_gguf_fast_load import _same_tokenizer
from tests.engine.text.test_file_tokenizer import assert_same
from tests.engine.tiny_models import (
    CHATML,
    save_tiny_model,
    tiny_gemma_config,
    tiny_llama_config,
)

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(params=["llama", "gemma2"])
def folder(request, tmp_path) -> Path:
    config = tiny_llama_config() if request.param == "llama" else tiny_gemma_config(2)
    return save_tiny_model(tmp_path / request.param, config, seed=3)


def test_a_later_load_reads_the_kept_config_and_the_same_tokenizer(folder):
    cold = load_model_files(folder)
    warm = load_model_files(folder)
    # A Llama folder's first load reads config.json itself (test_folder_config.py holds it
    # to transformers' class); Gemma 2's builds transformers' config.
    assert isinstance(cold.config, FileConfig) == (folder.name == "llama")
    assert isinstance(warm.config, FileConfig)
    assert warm.config.to_dict() == cold.config.to_dict()
    assert build_model(warm.config, torch.float32, "meta").spec == build_model(
        cold.config, torch.float32, "meta").spec
    assert type(cold.tokenizer) is type(warm.tokenizer) is FileTokenizer
    _same_tokenizer(cold.tokenizer, warm.tokenizer)
    assert_same(warm.tokenizer, AutoTokenizer.from_pretrained(folder))


def _greedy(folder: Path) -> list[list[int]]:
    with LLM(folder, max_model_len=64, num_gpu_blocks=16, block_size=16) as llm:
        params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        outs = llm.generate(["hello hello", [3, 4, 5, 6, 7]], params)
        reply = llm.chat([{"role": "user", "content": "hi there"}], params)
        return [list(out.outputs[0].token_ids) for out in [*outs, reply]]


def test_greedy_replies_are_the_same_from_the_kept_config(folder):
    first = _greedy(folder)  # the first load's config, kept
    assert isinstance(load_model_files(folder).config, FileConfig)
    assert _greedy(folder) == first


def test_a_changed_config_json_is_read_again(tmp_path):
    folder = save_tiny_model(tmp_path / "llama", tiny_llama_config(), seed=3)
    assert load_model_files(folder).config.rms_norm_eps == 1e-5
    config_json = folder / "config.json"
    values = json.loads(config_json.read_text())
    config_json.write_text(json.dumps({**values, "rms_norm_eps": 1e-6}))
    os.utime(config_json, ns=(1, 1))
    again = load_model_files(folder)
    assert again.config.rms_norm_eps == 1e-6
    assert load_model_files(folder).config.rms_norm_eps == 1e-6  # kept again


def test_a_load_from_the_cache_imports_no_transformers(tmp_path, cache_dir):
    folder = save_tiny_model(tmp_path / "llama", tiny_llama_config(), seed=3)
    load_model_files(folder)  # the first load: the config and the tokenizer kept
    assert transformers_imported(folder, cache_dir, "transformers") == []


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    os.utime(path, ns=(1, 1))


def test_a_changed_tokenizer_file_is_read_again(tmp_path, cache_dir):
    folder = save_tiny_model(tmp_path / "llama", tiny_llama_config(), seed=3)
    first = load_model_files(folder).tokenizer
    assert (first.chat_template, first.eos_token) == (CHATML, "<|im_end|>")
    _edit_json(folder / "tokenizer_config.json", eos_token="<|im_start|>")
    assert load_model_files(folder).tokenizer.eos_token == "<|im_start|>"
    template = folder / "chat_template.jinja"
    template.write_text("{{ messages[0].content }}")
    os.utime(template, ns=(1, 1))
    assert load_model_files(folder).tokenizer.chat_template == "{{ messages[0].content }}"
    # Each change wrote an entry in place of the folder's older one.
    assert len(list((cache_dir / "hf-tokenizer").iterdir())) == 1


def test_a_damaged_tokenizer_entry_is_written_again(tmp_path, cache_dir, caplog):
    folder = save_tiny_model(tmp_path / "llama", tiny_llama_config(), seed=3)
    first = load_model_files(folder).tokenizer
    (entry,) = (cache_dir / "hf-tokenizer").iterdir()
    (entry / "tokenizer.json").write_text("{not json")
    again = load_model_files(folder).tokenizer
    assert "reading the tokenizer of" in caplog.text
    _same_tokenizer(first, again)
    assert json.loads((entry / "tokenizer.json").read_text())  # written again


def test_a_tokenizer_folios_object_cannot_stand_for_stays_transformers(tmp_path, cache_dir):
    folder = save_tiny_model(tmp_path / "llama", tiny_llama_config(), seed=3)
    _edit_json(folder / "tokenizer_config.json", split_special_tokens=True)
    loaded = load_model_files(folder).tokenizer
    assert type(loaded).__name__ == "TokenizersBackend"
    assert loaded.encode("<|im_end|>") == AutoTokenizer.from_pretrained(folder).encode(
        "<|im_end|>")
    assert not (cache_dir / "hf-tokenizer").exists()
