"""A GGUF model with an mmproj file beside it in the catalog ("sees images"), listings
that leave the projector file out, and ``--mmproj`` on ``folio chat`` and ``folio
serve`` (the served --model alone takes it)."""

from __future__ import annotations

import io

import pytest

from engine.cli import main
from engine.config import EngineConfig
from engine.hosting.library import models_in
from engine.loaders.catalog import list_local_models, model_info
from engine.serve.hosted import HostedServe
from tests.engine.vision.tiny_idefics3 import png
from tests.engine.vision.tiny_idefics3_gguf import write_mmproj, write_text_gguf

pytestmark = pytest.mark.usefixtures("single_torch_thread")
MODEL = "SmolVLM-tiny.gguf"


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def files(folder, tmp_path_factory):
    """Three folders: the model with its mmproj, the model alone, the model beside a
    projector of a type Folio does not run."""
    root = tmp_path_factory.mktemp("listing")
    for name in ("paired", "alone", "other"):
        (root / name).mkdir()
        write_text_gguf(folder, root / name / MODEL)
    write_mmproj(folder, root / "paired" / "mmproj-SmolVLM-tiny-F32.gguf")
    write_mmproj(folder, root / "other" / "mmproj-other.gguf", projector="kimivl")
    return root


def test_the_catalog_says_a_gguf_with_an_mmproj_beside_it_sees_images(files):
    paired = model_info(files / "paired" / MODEL)
    assert paired.sees_images and paired.layer_summary == "sees images"
    assert not model_info(files / "alone" / MODEL).sees_images
    assert not model_info(files / "other" / MODEL).sees_images


def test_listings_leave_the_mmproj_file_out(files):
    assert models_in(files / "paired") == [files / "paired" / MODEL]
    listed = [info for info in list_local_models([files / "paired"])
              if info.path.parent == files / "paired"]
    assert [(info.path.name, info.error) for info in listed] == [(MODEL, "")]


def test_folio_chat_takes_an_explicit_mmproj(files, tmp_path, capfd, monkeypatch):
    picture = tmp_path / "red.png"
    picture.write_bytes(png(31, (48, 40)))
    monkeypatch.setattr("sys.stdin", io.StringIO("what is it?\n"))  # then EOF: the end
    model = str(files / "alone" / MODEL)
    mmproj = str(files / "paired" / "mmproj-SmolVLM-tiny-F32.gguf")
    assert main(["chat", "--model", model, "--mmproj", mmproj, "--image", str(picture),
                 "--max-tokens", "2", "--device", "cpu"]) == 0
    out = capfd.readouterr().out
    assert "error:" not in out and out.count("> ") == 2  # answered, then the end
    # Without it the same model reads text only, and the image is refused.
    monkeypatch.setattr("sys.stdin", io.StringIO("what is it?\n"))
    assert main(["chat", "--model", model, "--image", str(picture), "--max-tokens", "2",
                 "--device", "cpu"]) == 0
    assert "error: messages[0].content[0].type: 'image'" in capfd.readouterr().out


def test_folio_refuses_a_bad_mmproj_path(files, capsys, monkeypatch):
    model = str(files / "alone" / MODEL)
    assert main(["chat", "--model", model, "--mmproj", "/no/such.gguf"]) == 2
    assert "EngineConfig.mmproj: /no/such.gguf is not a file" in capsys.readouterr().err
    monkeypatch.setattr("engine.serve.server.check_port_free", lambda *a: None)
    assert main(["serve", "--port", "0", "--model", model, "--mmproj",
                 str(files / "alone" / MODEL)]) == 2
    assert "not an mmproj file" in capsys.readouterr().err


def test_serve_gives_mmproj_to_its_model_alone(files):
    mmproj = str(files / "paired" / "mmproj-SmolVLM-tiny-F32.gguf")
    hosted = HostedServe(str(files / "alone" / MODEL), [str(files / "other")], "5m", 4.0,
                         EngineConfig(num_gpu_blocks=64, block_size=8, mmproj=mmproj))
    try:
        models = hosted.start()
        with models.host.lease(hosted.name) as lease:
            assert lease.worker.llm.prompts.vision is not None
        assert hosted.host.config.mmproj is None  # the library's other models: their own
    finally:
        hosted.stop()
