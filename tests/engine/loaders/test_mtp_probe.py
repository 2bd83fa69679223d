"""mtp_head_missing: whether a model on disk ships an MTP head, from its files' headers."""

from __future__ import annotations

import json

from engine.loaders.mtp_probe import mtp_head_missing
from tests.engine.tiny_models import save_tiny_model, tiny_llama_config, tiny_qwen35_config
from tests.engine.tiny_mtp import mtp_config, save_mtp_model


def test_a_folder_with_a_head_has_none_missing(tmp_path):
    assert mtp_head_missing(save_mtp_model(tmp_path / "m", mtp_config())) is None


def test_each_missing_part_is_named(tmp_path):
    assert mtp_head_missing(None) == "no model is loaded"
    assert "no MTP head" in mtp_head_missing(save_tiny_model(tmp_path / "l",
                                                             tiny_llama_config()))
    assert "no MTP head" in mtp_head_missing(save_tiny_model(tmp_path / "q",
                                                             tiny_qwen35_config()))
    stripped = save_tiny_model(tmp_path / "s", tiny_qwen35_config(mtp_num_hidden_layers=1))
    assert "no MTP weights" in mtp_head_missing(stripped)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert "GGUF files carry no MTP head" in mtp_head_missing(gguf)


def test_a_multimodal_release_reads_its_text_config(tmp_path):
    folder = save_mtp_model(tmp_path / "m", mtp_config())
    config = json.loads((folder / "config.json").read_text())
    wrapped = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
               "text_config": config}
    (folder / "config.json").write_text(json.dumps(wrapped))
    assert mtp_head_missing(folder) is None
