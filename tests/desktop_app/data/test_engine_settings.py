"""Settings ▸ Engine in settings.json: defaults, round trip, bad stored values."""

from __future__ import annotations

import json
import logging

import pytest

from desktop_app.data.engine_settings import EngineSettings
from desktop_app.data.settings import AppSettings, load_settings, save_settings, settings_path
from engine.config import WEIGHTS, EngineConfig


def test_defaults_are_automatic():
    s = AppSettings().engine
    assert (s.device, s.weights, s.chat_memory_mib) == ("auto", "stored", None)
    assert s.to_engine_config() == EngineConfig(kv_disk_bytes=4 << 30, speculative="ngram")
    assert AppSettings().to_dict()["engine"] == {"device": "auto", "weights": "stored",
                                                 "chat_memory_mib": None,
                                                 "cpu_activation_bits": 16,
                                                 "keep_warm_on_disk": True,
                                                 "warm_disk_gib": 4,
                                                 "kv_cache_dtype": "auto",
                                                 "speculative": "ngram",
                                                 "embedding_model": None}


def test_the_disk_tier_setting():
    assert EngineSettings(warm_disk_gib=2).to_engine_config().kv_disk_bytes == 2 << 30
    assert EngineSettings(keep_warm_on_disk=False).to_engine_config().kv_disk_bytes == 0
    with pytest.raises(ValueError, match="warm_disk_gib"):
        EngineSettings(warm_disk_gib=0)
    with pytest.raises(ValueError, match="keep_warm_on_disk"):
        EngineSettings(keep_warm_on_disk="yes")
    assert EngineSettings.from_dict({"keep_warm_on_disk": False}).keep_warm_on_disk is False


def test_to_engine_config():
    config = EngineSettings("cuda:1", "float32", 1536).to_engine_config()
    assert (config.device, config.weights, config.kv_cache_memory_bytes) == (
        "cuda:1", "float32", 1536 << 20)


def test_round_trip_through_the_file():
    settings = AppSettings(engine=EngineSettings("cpu", "bfloat16", 3072, 8, False, 2))
    save_settings(settings)
    assert json.loads(settings_path().read_text())["engine"] == {
        "device": "cpu", "weights": "bfloat16", "chat_memory_mib": 3072,
        "cpu_activation_bits": 8, "keep_warm_on_disk": False, "warm_disk_gib": 2,
        "kv_cache_dtype": "auto", "speculative": "ngram", "embedding_model": None}
    assert load_settings().engine == EngineSettings("cpu", "bfloat16", 3072, 8, False, 2)


def test_cpu_precision_reaches_the_engine_and_old_files_read_exact():
    assert EngineSettings(cpu_activation_bits=8).to_engine_config().cpu_activation_bits == 8
    # A settings file written before the field existed.
    old = EngineSettings.from_dict({"device": "cpu", "weights": "stored",
                                    "chat_memory_mib": None})
    assert old.cpu_activation_bits == 16


@pytest.mark.parametrize("field, value", [
    ("device", "gpu"), ("device", "cuda"), ("device", 0), ("weights", "q4_k"),
    ("weights", None), ("chat_memory_mib", 0), ("chat_memory_mib", 8),
    ("chat_memory_mib", 2.5), ("chat_memory_mib", True), ("chat_memory_mib", "2 GiB"),
    ("cpu_activation_bits", 4), ("cpu_activation_bits", "16"), ("cpu_activation_bits", None),
    ("kv_cache_dtype", "q8_0"), ("kv_cache_dtype", None), ("kv_cache_dtype", 8),
    ("speculative", "draft"), ("speculative", None), ("speculative", True),
])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^EngineSettings\.{field} must be"):
        EngineSettings(**{field: value})


def test_kv_cache_precision_reaches_the_engine_and_old_files_read_automatic():
    assert EngineSettings().to_engine_config().kv_cache_dtype is None  # the device's own
    # (Only the config's field: part A's EngineConfig validates the quantized names.)
    assert EngineSettings(kv_cache_dtype="float16").to_engine_config().kv_cache_dtype == \
        "float16"
    assert EngineSettings(kv_cache_dtype="int8").kv_cache_dtype == "int8"
    old = EngineSettings.from_dict({"device": "cpu", "weights": "stored",
                                    "chat_memory_mib": 512, "cpu_activation_bits": 8,
                                    "keep_warm_on_disk": True, "warm_disk_gib": 4})
    assert old.kv_cache_dtype == "auto"


def test_quantized_kv_precisions_reach_the_engine():
    # Needs issue 47 part A (EngineConfig accepting the quantized formats).
    for name in ("int8", "int4", "fp8"):
        assert EngineSettings(kv_cache_dtype=name).to_engine_config().kv_cache_dtype == name


def test_a_bad_stored_kv_precision_reads_automatic_and_keeps_the_rest():
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"engine": {"device": "cpu", "kv_cache_dtype": "int3"}}))
    assert load_settings().engine == EngineSettings(device="cpu")


def test_weights_choices_are_the_engines():
    for value in WEIGHTS:
        assert EngineSettings(weights=value).to_engine_config().weights == value


def test_bad_stored_values_fall_back_with_a_warning(caplog):
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"theme": "dark", "engine": {
        "device": "tpu", "weights": "float32", "chat_memory_mib": -5, "extra": 1}}))
    with caplog.at_level(logging.WARNING):
        settings = load_settings()
    assert settings.theme == "dark"
    assert settings.engine == EngineSettings(weights="float32")  # the good value stays
    assert "ignoring setting device" in caplog.text
    assert "ignoring setting chat_memory_mib" in caplog.text
    assert path.with_name("settings.json.bak").exists()  # what the user wrote is kept


@pytest.mark.parametrize("stored", [5, "cpu", [1], None])
def test_an_engine_entry_that_is_not_an_object_falls_back(stored):
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"engine": stored, "serve_port": 9000}))
    settings = load_settings()
    assert settings.engine == EngineSettings() and settings.serve_port == 9000


def test_strict_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="no field"):
        EngineSettings.from_dict({"device": "cpu", "gpu": True})
    with pytest.raises(ValueError, match="no field"):
        AppSettings(engine={"extra": 1})


def test_speed_reaches_the_engine_and_old_files_read_prompt_lookup():
    assert EngineSettings(speculative="off").to_engine_config().speculative is None
    assert EngineSettings().to_engine_config().speculative == "ngram"
    old = EngineSettings.from_dict({"device": "cpu", "kv_cache_dtype": "int8"})
    assert old.speculative == "ngram"
