"""The app's engine settings on this machine: device choices, the config a stored choice
becomes, the reload when they change, and the words for a budget too small."""

from __future__ import annotations

import logging

import pytest
import torch

from desktop_app.data.engine_settings import EngineSettings
from desktop_app.services.devices import (
    config_for_source,
    describe_memory_error,
    device_choices,
    engine_config_for,
    mtp_missing,
    usable,
)
from desktop_app.services.engine_bridge import EngineBridge, describe_error
from engine.config import EngineConfig
from engine.runner.kv_cache import KVBudgetError


def test_device_choices_from_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA H200")
    assert device_choices() == [("Auto (CUDA 0: NVIDIA H200)", "auto"), ("CPU", "cpu"),
                                ("CUDA 0: NVIDIA H200", "cuda:0")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_choices() == [("Auto (CPU)", "auto"), ("CPU", "cpu")]


def test_a_cuda_device_that_is_gone_falls_back_to_auto(caplog):
    stored = EngineSettings("cuda:1", "float32", 1024)
    assert usable(stored, cuda_count=2) is stored
    with caplog.at_level(logging.WARNING):
        assert usable(stored, cuda_count=1) == EngineSettings("auto", "float32", 1024)
    assert "cuda:1 is not on this machine" in caplog.text
    assert engine_config_for(stored, cuda_count=0) == EngineConfig(
        weights="float32", kv_cache_memory_bytes=1024 << 20, kv_disk_bytes=4 << 30,
        speculative="ngram")
    assert usable(EngineSettings("cpu"), cuda_count=0).device == "cpu"


def test_a_budget_too_small_is_said_in_the_apps_words():
    err = KVBudgetError("kv_cache_memory_bytes", 256 << 20, 360 << 20, 8192)
    text = ("Memory for chats is 256 MiB, but one full context of this model (8192 tokens) "
            "needs 360 MiB. Raise Memory for chats in Settings ▸ Engine, or set it to "
            "Automatic.")
    assert describe_memory_error(err) == describe_error(err) == text
    free = describe_error(KVBudgetError("max_model_len", 100 << 20, 360 << 20, 8192))
    assert free.startswith("Only 100 MiB of device memory is free for chats")
    assert describe_memory_error(ValueError("x")) is None


@pytest.fixture
def bridge(qtbot, fake_engine):
    fake_llm, fake_worker = fake_engine
    configs = []

    def factory(source, config=None, progress=None):
        configs.append(config)
        return fake_llm(name=f"model-{source}")

    bridge = EngineBridge(llm_factory=factory, worker_factory=fake_worker)
    bridge.configs = configs
    yield bridge
    bridge.shutdown()


def test_changed_settings_reload_the_loaded_model(qtbot, bridge):
    assert not bridge.apply_engine_settings(EngineSettings(device="cpu"))  # nothing loaded
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        bridge.load_model("starter")
    assert bridge.configs[-1] == EngineConfig(device="cpu", kv_disk_bytes=4 << 30,
                                              speculative="ngram")
    assert not bridge.apply_engine_settings(EngineSettings(device="cpu"))  # unchanged
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        assert bridge.apply_engine_settings(EngineSettings("cpu", "float32", 512))
    assert bridge.configs[-1] == EngineConfig(device="cpu", weights="float32",
                                              kv_cache_memory_bytes=512 << 20,
                                              kv_disk_bytes=4 << 30, speculative="ngram")
    assert bridge.source == "starter" and len(bridge.configs) == 2


def test_automatic_settings_do_not_reload_a_default_engine(qtbot, bridge):
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        bridge.load_model("starter")
    assert not bridge.apply_engine_settings(EngineSettings())
    assert len(bridge.configs) == 1


def test_a_load_that_cannot_fit_one_context_says_so(qtbot, fake_engine):
    def factory(source, config=None, progress=None):
        raise KVBudgetError("kv_cache_memory_bytes", 64 << 20, 360 << 20, 8192)

    bridge = EngineBridge(llm_factory=factory, worker_factory=fake_engine[1])
    with qtbot.waitSignal(bridge.modelLoadFailed, timeout=5000) as failed:
        bridge.load_model("starter")
    assert failed.args[1].startswith("Memory for chats is 64 MiB, but one full context")


def test_the_mtp_setting_falls_back_to_prompt_lookup_without_a_head(tmp_path):
    from tests.engine.tiny_models import save_tiny_model, tiny_qwen35_config
    from tests.engine.tiny_mtp import mtp_config, save_mtp_model

    config = EngineSettings(speculative="mtp").to_engine_config()
    with_head = str(save_mtp_model(tmp_path / "m", mtp_config()))
    without = str(save_tiny_model(tmp_path / "q", tiny_qwen35_config()))
    assert mtp_missing(with_head) is None
    assert config_for_source(config, with_head).speculative == "mtp"
    assert config_for_source(config, without).speculative == "ngram"
    assert mtp_missing("remote:http://localhost:8000/v1#qwen") == "no local model is loaded"
    ngram = EngineSettings().to_engine_config()
    assert config_for_source(ngram, without) is ngram
