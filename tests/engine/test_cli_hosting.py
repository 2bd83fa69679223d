"""``folio models --models-dir`` and ``folio serve``'s library options."""

from __future__ import annotations

import pytest

from engine.cli import main
from tests.engine.tiny_models import save_tiny_model


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("library")
    save_tiny_model(root / "tiny-one")
    return root


def test_models_lists_a_models_dir(models_dir, capsys):
    assert main(["models", "--models-dir", str(models_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("starter ") for line in lines)
    assert any(line.startswith("tiny-one ") and "llama" in line for line in lines)


@pytest.mark.parametrize("options, message", [
    (["--keep-alive", "soon"], "--keep-alive must be seconds"),
    (["--models-dir", "/no/such/dir"], "models_dirs: /no/such/dir is not a folder"),
    (["--model", "no-such-name"], "'no-such-name' is not in this server's library"),
    (["--memory-gib", "0"], "--memory-gib must be > 0"),
])
def test_serve_refuses_bad_options_before_loading(options, message, capsys, monkeypatch):
    monkeypatch.setattr("engine.serve.server.check_port_free", lambda *a: None)
    assert main(["serve", "--port", "0", *options]) == 2
    assert message in capsys.readouterr().err


def test_serve_loads_its_model_at_start_and_hosts_the_library(models_dir, monkeypatch):
    served = []

    def serve_forever(models, host, port, settings):
        served.append((models.default_name, sorted(models.library.names()),
                       [(m.name, m.state) for m in models.host.models()],
                       models.host.keep_alive_s, models.host.budget_bytes))

    monkeypatch.setattr("engine.serve.server.serve_forever", serve_forever)
    monkeypatch.setattr("engine.serve.server.check_port_free", lambda *a: None)
    assert main(["serve", "--port", "0", "--models-dir", str(models_dir), "--model",
                 "tiny-one", "--keep-alive", "90s", "--memory-gib", "2"]) == 0
    (name, names, loaded, keep_alive, budget) = served[0]
    assert name == "tiny-one" and {"starter", "tiny-one"} <= set(names)
    assert loaded == [("tiny-one", "loaded")]
    assert (keep_alive, budget) == (90.0, 2 << 30)
