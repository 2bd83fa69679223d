"""A Hugging Face folder's first load reads config.json as a FileConfig, without
transformers' config class, for the families whose registry entry lists
``config_defaults`` (Llama, Qwen2, Qwen3), when it states every size the decoder needs.
The oracle is transformers' ``AutoConfig`` on the same folder (what every first load built
before), for folders as transformers 5 saves them and as older releases wrote config.json
(rope settings at the top level, the scaling's ``type``, ``torch_dtype``, no head_dim, a
window switched off): the same values, the same attributes read by the engine while it
loads and runs the model, the same greedy replies. Any other folder still goes through
transformers' class, and a fresh process's first load imports no ``transformers.models``
module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, Qwen2Config, Qwen3Config

from engine.llm import LLM
from engine.loaders import FolioLoadError, load_model_files
from engine.loaders.gguf.file_config import (
    FileConfig,
    config_from_record,
    config_from_values,
    config_record,
)
from engine.models import build_model
from engine.models.spec import head_dim_of
from engine.sampling_params import SamplingParams
from tests.engine.loaders.config_checks import engine_reads, transformers_imported
from tests.engine.tiny_models import save_tiny_model, tiny_gemma_config, tiny_llama_config

REPO = Path(__file__).resolve().parents[3]
_MISSING = object()
# transformers renames torch_dtype to dtype and stamps its own version; neither is read.
_RENAMED = {"torch_dtype", "transformers_version"}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _shape(**fields):
    return dict(vocab_size=tiny_llama_config().vocab_size, hidden_size=64,
                intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5,
                bos_token_id=256, eos_token_id=258, **fields)


CONFIGS = {
    "llama": lambda: tiny_llama_config(),
    "llama-tied-linear": lambda: tiny_llama_config(
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
    "llama-llama3": lambda: tiny_llama_config(rope_parameters={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
        "rope_theta": 500000.0}),
    "qwen2": lambda: Qwen2Config(**_shape(tie_word_embeddings=True)),
    "qwen3": lambda: Qwen3Config(**_shape(head_dim=32, tie_word_embeddings=True)),
}


def _as_older_release(folder: Path) -> None:
    """Rewrite config.json as transformers 4 wrote it: rope theta and scaling (its
    ``type``) at the top level, ``torch_dtype``, no head_dim; Qwen's window stated but off."""
    path = folder / "config.json"
    values = json.loads(path.read_text())
    rope = dict(values.pop("rope_parameters"))
    values["rope_theta"] = rope.pop("rope_theta")
    kind = rope.pop("rope_type")
    values["rope_scaling"] = None if kind == "default" else {"type": kind, **rope}
    values["torch_dtype"] = values.pop("dtype", "float32")
    if values["model_type"] == "llama":
        values.pop("head_dim", None)
    if values["model_type"] == "qwen2":
        values.update(sliding_window=4096, use_sliding_window=False, max_window_layers=2)
    for name in ("layer_types", "attention_dropout", "initializer_range", "use_cache"):
        values.pop(name, None)
    path.write_text(json.dumps(values))


def _folder(tmp_path: Path, name: str, older: bool) -> Path:
    folder = save_tiny_model(tmp_path / f"{name}{'-old' if older else ''}", CONFIGS[name](),
                             seed=3)
    if older:
        _as_older_release(folder)
    return folder


def _built(folder: Path) -> FileConfig:
    """transformers' config for the folder, as a FileConfig (attribute reads alike)."""
    return config_from_record(config_record(AutoConfig.from_pretrained(folder)))


CASES = [(name, older) for name in CONFIGS for older in (False, True)]
IDS = [f"{name}{'-older' if older else ''}" for name, older in CASES]


@pytest.mark.parametrize(("name", "older"), CASES, ids=IDS)
def test_config_json_reads_as_transformers_class_builds_it(tmp_path, name, older):
    folder = _folder(tmp_path, name, older)
    plain = load_model_files(folder).config
    assert isinstance(plain, FileConfig)
    built = _built(folder)
    for key, value in plain.to_dict().items():
        if key not in _RENAMED:
            assert value == getattr(built, key), key
    assert build_model(plain, torch.float32, "meta").spec == build_model(
        built, torch.float32, "meta").spec


def _read(config: FileConfig, name: str):
    """What the engine gets for ``name``; a missing head_dim is worked out as the
    engine's head_dim_of does (transformers' Llama class states it, older files may not)."""
    if name == "head_dim":
        return head_dim_of(getattr(config, "head_dim", None), config.hidden_size,
                           config.num_attention_heads)
    return getattr(config, name, _MISSING)


def _greedy(folder: Path) -> list[list[int]]:
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    with LLM(folder, max_model_len=64, num_gpu_blocks=16, block_size=16) as llm:
        outs = llm.generate(["hello hello", [3, 4, 5, 6, 7]], params)
        reply = llm.chat([{"role": "user", "content": "hi there"}], params)
    return [list(out.outputs[0].token_ids) for out in [*outs, reply]]


@pytest.mark.parametrize(("name", "older"), CASES, ids=IDS)
def test_the_engine_reads_the_same_and_replies_the_same(tmp_path, cache_dir, monkeypatch,
                                                         name, older):
    folder = _folder(tmp_path, name, older)
    plain = load_model_files(folder).config
    built = _built(folder)
    from_json = _greedy(folder)  # the kept plain config
    reads, from_transformers = engine_reads(monkeypatch, "load_hf_folder", built,
                                            lambda: _greedy(folder))
    assert from_transformers == from_json
    for attribute in sorted(reads):
        assert _read(plain, attribute) == _read(built, attribute), attribute


def _edited(tmp_path: Path, change: dict) -> Path:
    """A Llama folder whose config.json has ``change`` (None: the field left out)."""
    folder = save_tiny_model(tmp_path / "llama", tiny_llama_config(), seed=3)
    path = folder / "config.json"
    values = {**json.loads(path.read_text()), **change}
    path.write_text(json.dumps({k: v for k, v in values.items() if v is not None}))
    return folder


@pytest.mark.parametrize("change", [
    {"architectures": ["LlamaForCausalLM", "LlamaModel"]},
    {"model_type": "mistral"},
], ids=["two-architectures", "other-model-type"])
def test_a_config_json_not_plainly_read_goes_through_transformers(tmp_path, change):
    config = load_model_files(_edited(tmp_path, change)).config
    assert not isinstance(config, FileConfig)


def test_a_size_left_out_is_transformers_default(tmp_path):
    config = load_model_files(_edited(tmp_path, {"max_position_embeddings": None})).config
    assert not isinstance(config, FileConfig)
    assert config.max_position_embeddings == AutoConfig.for_model("llama").max_position_embeddings


def test_a_size_that_is_no_number_is_refused_naming_the_file(tmp_path):
    folder = _edited(tmp_path, {"rms_norm_eps": "1e-5"})
    with pytest.raises(FolioLoadError, match="config.json: cannot be read as a model config"):
        load_model_files(folder)


def test_other_families_still_build_transformers_config(tmp_path):
    folder = save_tiny_model(tmp_path / "gemma2", tiny_gemma_config(2), seed=3)
    assert not isinstance(load_model_files(folder).config, FileConfig)


def test_the_rope_settings_are_gathered_as_transformers_5_keeps_them():
    defaults = {"rope_theta": 10000.0}
    assert config_from_values({}, defaults).rope_parameters == {
        "rope_type": "default", "rope_theta": 10000.0}
    older = config_from_values({"rope_theta": 5e5, "rope_scaling": {"type": "linear",
                                                                    "factor": 2.0}}, defaults)
    assert older.rope_parameters == {"type": "linear", "rope_type": "linear", "factor": 2.0,
                                     "rope_theta": 5e5}
    assert not hasattr(older, "rope_theta") and not hasattr(older, "rope_scaling")
    newer = config_from_values({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
                               defaults)
    assert newer.rope_parameters == {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}
    off = config_from_values({"sliding_window": 4096, "use_sliding_window": False}, defaults)
    assert off.sliding_window is None
    on = config_from_values({"sliding_window": 4096, "use_sliding_window": True}, defaults)
    assert on.sliding_window == 4096


def test_a_first_load_imports_no_transformers_model_code(tmp_path, cache_dir):
    folder = save_tiny_model(tmp_path / "llama", tiny_llama_config(), seed=3)
    assert transformers_imported(folder, cache_dir) == []
    assert list((cache_dir / "hf").iterdir())  # a first load: it kept the config
