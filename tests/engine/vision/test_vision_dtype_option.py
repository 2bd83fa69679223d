"""``--vision-dtype {float32,bfloat16}`` on ``folio chat`` and ``folio serve``: the
vision tower computes in the dtype asked for (EngineConfig.vision_dtype), whatever the
CPU's default; anything else is refused by argparse."""

from __future__ import annotations

import io

import pytest
import torch

import engine.vision.model as vision_model
from engine.cli import main
from tests.engine.vision.tiny_idefics3 import png
from tests.engine.vision.tiny_qwen35_vl import save_tiny_qwen35_vl

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_qwen35_vl(tmp_path_factory.mktemp("qwen35vl") / "qwen35vl")


@pytest.fixture
def towers(monkeypatch):
    """The (tower dtype, parameter dtype) of every vision model loaded."""
    seen: list[tuple[torch.dtype, torch.dtype]] = []
    init = vision_model.VisionModel.__init__

    def spy(self, parts, dtype, device, encoder_dtype=None):
        init(self, parts, dtype, device, encoder_dtype)
        seen.append((self.encoder_dtype, next(self.encoder.parameters()).dtype))

    monkeypatch.setattr(vision_model.VisionModel, "__init__", spy)
    return seen


@pytest.mark.parametrize("name", ["float32", "bfloat16"])
def test_folio_chat_runs_the_tower_in_the_dtype_asked(folder, tmp_path, capfd, monkeypatch,
                                                      towers, name):
    picture = tmp_path / "red.png"
    picture.write_bytes(png(31, (48, 40)))
    monkeypatch.setattr("sys.stdin", io.StringIO("what is it?\n"))
    assert main(["chat", "--model", str(folder), "--image", str(picture), "--max-tokens",
                 "2", "--device", "cpu", "--vision-dtype", name]) == 0
    out = capfd.readouterr().out
    assert "error:" not in out and out.count("> ") == 2  # answered, then the end
    dtype = getattr(torch, name)
    assert towers == [(dtype, dtype)]


def test_folio_serve_passes_it_to_every_model(folder, monkeypatch):
    configs = []

    class Stop(ValueError):
        pass

    def hosted(model, dirs, keep_alive, memory, config):
        configs.append(config)
        raise Stop("stop here")

    monkeypatch.setattr("engine.serve.server.check_port_free", lambda *a: None)
    monkeypatch.setattr("engine.serve.hosted.HostedServe", hosted)
    assert main(["serve", "--port", "0", "--model", str(folder),
                 "--vision-dtype", "bfloat16"]) == 2
    assert main(["serve", "--port", "0", "--model", str(folder)]) == 2
    assert [c.vision_dtype for c in configs] == ["bfloat16", None]


def test_another_dtype_is_refused(folder, capsys):
    with pytest.raises(SystemExit):
        main(["chat", "--model", str(folder), "--vision-dtype", "float16"])
    assert "--vision-dtype: invalid choice: 'float16'" in capsys.readouterr().err
