"""`folio chat` / `folio serve`: --device and --weights reach the EngineConfig."""

from __future__ import annotations

import pytest

import engine.llm
from engine.cli import main
from engine.loaders.base import FolioLoadError


@pytest.fixture
def configs(monkeypatch):
    seen = []

    def fake_llm(model, config=None, progress=None):
        seen.append(config)
        raise FolioLoadError("stop here")  # the config is all this test wants

    monkeypatch.setattr(engine.llm, "LLM", fake_llm)
    return seen


@pytest.mark.parametrize("command", [["chat"], ["serve", "--port", "0"]])
def test_device_and_weights_reach_the_config(configs, command, monkeypatch):
    monkeypatch.setattr("engine.serve.server.check_port_free", lambda *a: None)
    assert main([*command, "--device", "cuda:1", "--weights", "float32"]) == 2
    assert (configs[-1].device, configs[-1].weights) == ("cuda:1", "float32")
    assert main(command) == 2
    assert (configs[-1].device, configs[-1].weights) == (None, "stored")  # auto


def test_a_bad_device_is_a_message_not_a_traceback(configs, capsys):
    assert main(["chat", "--device", "gpu"]) == 2
    assert "folio: error: EngineConfig.device must be" in capsys.readouterr().err
    assert configs == []


def test_weights_are_one_of_the_choices(capsys):
    with pytest.raises(SystemExit):
        main(["chat", "--weights", "q4"])
    assert "invalid choice: 'q4'" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["chat"], ["serve", "--port", "0"]])
@pytest.mark.parametrize("name", ["int8", "int4", "fp8", "float16"])
def test_a_kv_cache_dtype_reaches_the_config(configs, command, name, monkeypatch):
    monkeypatch.setattr("engine.serve.server.check_port_free", lambda *a: None)
    assert main([*command, "--kv-cache-dtype", name]) == 2
    assert configs[-1].kv_cache_dtype == name


def test_kv_cache_dtypes_are_the_kv_formats(capsys):
    with pytest.raises(SystemExit):
        main(["chat", "--kv-cache-dtype", "q8_0"])
    err = capsys.readouterr().err.replace("'", "")  # quoted from Python 3.12.8 on
    assert "choose from float32, bfloat16, float16, int8, fp8, int4" in err


@pytest.mark.parametrize("command", [["chat"], ["serve", "--port", "0"]])
def test_speculative_options_reach_the_config(configs, command, monkeypatch):
    monkeypatch.setattr("engine.serve.server.check_port_free", lambda *a: None)
    assert main([*command, "--speculative", "ngram", "--num-speculative-tokens", "5"]) == 2
    assert (configs[-1].speculative, configs[-1].num_speculative_tokens) == ("ngram", 5)
    assert main(command) == 2
    assert (configs[-1].speculative, configs[-1].num_speculative_tokens) == (None, 8)


@pytest.mark.parametrize("command", [["chat"], ["serve", "--port", "0"]])
def test_the_mtp_method_reaches_the_config(configs, command, monkeypatch):
    monkeypatch.setattr("engine.serve.server.check_port_free", lambda *a: None)
    assert main([*command, "--speculative", "mtp"]) == 2
    assert configs[-1].speculative == "mtp"


def test_a_bad_draft_count_is_a_message(configs, capsys):
    assert main(["chat", "--speculative", "ngram", "--num-speculative-tokens", "0"]) == 2
    assert "num_speculative_tokens must be" in capsys.readouterr().err


def test_a_draft_model_and_a_bad_method(configs, capsys):
    assert main(["chat", "--speculative", "draft:/models/small.gguf"]) == 2
    assert configs[-1].draft_model == "/models/small.gguf"
    assert main(["chat", "--speculative", "lookup"]) == 2
    assert "EngineConfig.speculative must be 'ngram', 'draft:PATH'" in capsys.readouterr().err
