"""A GGUF file's first load builds its config from the file's keys, without transformers'
config class, for the families whose registry entry lists ``config_defaults`` (Llama,
Qwen2, Qwen3; a folder's config.json likewise:
tests/engine/loaders/test_folder_config.py). The oracle is transformers' class on the same
keys (what every first load built before): every value the keys config holds is the one
that class gives, every attribute the engine reads while loading and running the model
reads the same from both, the greedy replies are the same, and the defaults in the
registry are the ones the class fills in. A fresh process's first load imports no
``transformers.models`` module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from engine.llm import LLM
from engine.loaders import load_model_files
from engine.loaders.gguf import loader as gguf_loader
from engine.loaders.gguf.file_config import FileConfig, config_from_record, config_record
from engine.models import build_model
from engine.models.registry import FAMILIES
from engine.sampling_params import SamplingParams
from tests.engine.loaders.config_checks import engine_reads, transformers_imported
from tests.engine.loaders.gguf import test_gguf_loader as llama_files

REPO = Path(__file__).resolve().parents[4]
_MISSING = object()


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _qwen_state(arch: str) -> dict[str, np.ndarray]:
    """A random Qwen2 (q/k/v biases) or Qwen3 (q/k norms, head_dim 32) model's weights."""
    torch.manual_seed(0)
    shape = dict(vocab_size=len(llama_files.TOKENS), hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=128, tie_word_embeddings=True)
    model = (Qwen2ForCausalLM(Qwen2Config(**shape)) if arch == "qwen2" else
             Qwen3ForCausalLM(Qwen3Config(**shape, head_dim=32)))
    return {n: t.detach().numpy().copy() for n, t in model.state_dict().items()
            if n != "lm_head.weight"}


# name -> write_gguf's arguments (a llama state unless the arch says otherwise)
VARIANTS = {
    "llama": {},
    "llama-untied": {"tied": False},
    "llama-linear": {"extra_kv": {"llama.rope.scaling.type": "linear",
                                  "llama.rope.scaling.factor": 4.0}},
    "llama-yarn": {"extra_kv": {"llama.rope.scaling.type": "yarn",
                                "llama.rope.scaling.factor": 4.0,
                                "llama.rope.scaling.original_context_length": 32}},
    "llama3": {"extra": {"rope_freqs.weight": llama_files.llama3_factors(16, 10000.0, 2.0, 32)},
               "extra_kv": {"llama.rope.scaling.original_context_length": 32}},
    "qwen2": {"arch": "qwen2", "permute": False, "quantized": {}},
    "qwen2-yarn": {"arch": "qwen2", "permute": False, "quantized": {},
                   "extra_kv": {"qwen2.rope.scaling.type": "yarn",
                                "qwen2.rope.scaling.factor": 4.0,
                                "qwen2.rope.scaling.original_context_length": 32}},
    "qwen3": {"arch": "qwen3", "permute": False, "quantized": {}, "head_dim": 32},
}


def _file(tmp_path: Path, name: str) -> Path:
    args = dict(VARIANTS[name])
    arch = args.get("arch", "llama")
    state = (llama_files.tiny_state(tied=args.pop("tied", True)) if arch == "llama"
             else _qwen_state(arch))
    path = tmp_path / f"{name}.gguf"
    llama_files.write_gguf(path, state, **args)
    return path


def _transformers_built(path: Path, cache_dir: Path) -> FileConfig:
    """What transformers' class builds from the same keys, read back as a FileConfig (so
    both sides answer attribute reads the same way), from the entry's config dict."""
    (entry,) = (cache_dir / "gguf").iterdir()
    keys = json.loads((entry / "meta.json").read_text())["config"]
    return config_from_record(config_record(gguf_loader._transformers_config(keys, path)))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_keys_config_holds_what_transformers_class_builds(tmp_path, cache_dir, name):
    path = _file(tmp_path, name)
    keys = load_model_files(path).config
    assert isinstance(keys, FileConfig)
    built = _transformers_built(path, cache_dir)
    for key, value in keys.to_dict().items():
        assert value == getattr(built, key), key
    assert build_model(keys, torch.float32, "meta").spec == build_model(
        built, torch.float32, "meta").spec


@pytest.mark.parametrize("name", ["llama", "llama-untied", "llama3", "qwen2", "qwen3"])
def test_every_attribute_the_engine_reads_is_the_same(tmp_path, cache_dir, monkeypatch, name):
    path = _file(tmp_path, name)
    keys = load_model_files(path).config
    built = _transformers_built(path, cache_dir)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)

    def run() -> None:
        with LLM(path, max_model_len=64, num_gpu_blocks=16, block_size=16) as llm:
            llm.generate(["hello"], params)
            llm.chat([{"role": "user", "content": "hello"}], params)

    reads, _ = engine_reads(monkeypatch, "load_gguf", built, run)
    for attribute in sorted(reads):
        assert getattr(keys, attribute, _MISSING) == getattr(built, attribute, _MISSING), \
            attribute


def _greedy(path: Path) -> list[list[int]]:
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    with LLM(path, max_model_len=64, num_gpu_blocks=16, block_size=16) as llm:
        outs = llm.generate(["hello hello", [3, 4, 5, 6, 7]], params)
    return [list(out.outputs[0].token_ids) for out in outs]


@pytest.mark.parametrize("name", ["llama-untied", "qwen2", "qwen3"])
def test_greedy_replies_are_those_of_transformers_config(tmp_path, cache_dir, monkeypatch,
                                                          name):
    path = _file(tmp_path, name)
    from_keys = _greedy(path)
    shutil.rmtree(cache_dir / "gguf")  # the next load is a first load again
    monkeypatch.setattr(gguf_loader, "_first_config", gguf_loader._transformers_config)
    assert not isinstance(load_model_files(path).config, FileConfig)  # the old first load
    assert _greedy(path) == from_keys


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.config_defaults is not None],
                         ids=lambda f: f.model_type)
def test_the_registry_defaults_are_transformers_own(family):
    config = AutoConfig.for_model(family.model_type)
    for key, value in family.config_defaults.items():
        # transformers 5 keeps the theta with the rest of the rope settings.
        found = (config.rope_parameters["rope_theta"] if key == "rope_theta"
                 else getattr(config, key))
        assert found == value, key


def test_first_and_later_loads_import_no_transformers(tmp_path, cache_dir):
    """Neither its model code (the config comes from the keys) nor the package at all (the
    tokenizer is Folio's own: engine/text/file_tokenizer.py)."""
    path = _file(tmp_path, "llama")
    assert transformers_imported(path, cache_dir, "transformers") == []
    assert list((cache_dir / "gguf").iterdir())  # it was a first load: it wrote the entry
    assert transformers_imported(path, cache_dir, "transformers") == []
