"""Settings ▸ Engine ▸ Embedding model for documents: none, or a .gguf file or folder
checked when picked (a bad pick is said and the earlier choice stays), saved with the
engine settings and handed to the engine as EngineConfig.embedding_model."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QComboBox, QLabel

from desktop_app.data.engine_settings import EngineSettings
from desktop_app.data.settings import load_settings
from desktop_app.dialogs.embedding_box import NONE_LABEL, EmbeddingBox
from desktop_app.dialogs.settings_dialog import EngineForm
from tests.engine.embeddings.tiny_embedders import save_tiny_bert


def make(qtbot, value, chosen=""):
    messages: list[str] = []
    box = EmbeddingBox(value, messages.append, lambda parent, kind: chosen)
    qtbot.addWidget(box)
    return box, messages


def pick(box, kind: str) -> None:
    index = box.findData(kind)
    box.setCurrentIndex(index)
    box.activated.emit(index)


def test_a_folder_picked_becomes_the_embedding_model(qtbot, tmp_path):
    folder = str(save_tiny_bert(tmp_path / "bge-small"))
    box, messages = make(qtbot, None, chosen=folder)
    assert box.value() is None and box.currentText() == NONE_LABEL
    pick(box, "choose-folder")
    assert box.value() == folder and box.currentText() == "bge-small"
    assert messages == [""]
    assert EngineSettings(embedding_model=box.value()).to_engine_config() \
        .embedding_model == folder


@pytest.mark.parametrize(("make_path", "said"), [
    (lambda d: d / "missing", "no such file"),
    (lambda d: (d / "notes.txt").write_text("x") and d / "notes.txt", "not a model"),
    (lambda d: d, "no config.json"),
])
def test_a_bad_pick_is_said_and_the_earlier_choice_stays(qtbot, tmp_path, make_path, said):
    earlier = str(save_tiny_bert(tmp_path / "earlier"))
    bad = tmp_path / "bad"
    bad.mkdir()
    box, messages = make(qtbot, earlier, chosen=str(make_path(bad)))
    pick(box, "choose-file")
    assert box.value() == earlier
    assert messages[-1].startswith("Embedding model not changed:") and said in messages[-1]


def test_a_decoder_checkpoint_of_another_family_is_refused(qtbot, tmp_path):
    folder = tmp_path / "gemma"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gemma3"}')
    box, messages = make(qtbot, None, chosen=str(folder))
    pick(box, "choose-folder")
    assert box.value() is None and "not an embedding model Folio runs" in messages[-1]


def test_the_engine_form_row_shows_the_message_and_saves(qtbot, tmp_path):
    form = EngineForm(EngineSettings(embedding_model="/models/old.gguf"), cuda_names=[])
    qtbot.addWidget(form)
    box = form.findChild(QComboBox, "embeddingModelSetting")
    assert box.value() == "/models/old.gguf" and box.currentText() == "old.gguf"
    box._choose = lambda parent, kind: str(tmp_path / "nope")
    pick(box, "choose-file")
    error = form.findChild(QLabel, "embeddingModelError")
    assert not error.isHidden() and "no such file" in error.text()
    assert form.settings().embedding_model == "/models/old.gguf"
    pick(box, None)  # None: word search alone, and the message goes
    assert form.settings().embedding_model is None and error.isHidden()


def test_the_setting_is_saved_and_read_back(qtbot):
    from desktop_app.data.settings import save_settings

    settings = load_settings()
    settings.engine = EngineSettings(embedding_model="/models/bge-small-en-v1.5-q8_0.gguf")
    save_settings(settings)
    assert load_settings().engine.embedding_model == "/models/bge-small-en-v1.5-q8_0.gguf"
    with pytest.raises(ValueError, match=r"^EngineSettings\.embedding_model must be"):
        EngineSettings(embedding_model="  ")


def test_an_embedding_model_gone_from_disk_does_not_stop_the_app(tmp_path):
    from desktop_app.services.devices import engine_config_for

    folder = str(save_tiny_bert(tmp_path / "bge"))
    assert engine_config_for(EngineSettings(embedding_model=folder), 0).embedding_model \
        == folder
    gone = EngineSettings(embedding_model=str(tmp_path / "deleted"))
    assert engine_config_for(gone, 0).embedding_model is None
