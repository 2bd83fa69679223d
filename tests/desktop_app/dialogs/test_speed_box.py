"""Settings ▸ Engine ▸ Speed: prompt lookup, off, or a draft model chosen as a file."""

from __future__ import annotations

import pytest

from desktop_app.data.engine_settings import EngineSettings
from desktop_app.dialogs.speed_box import SpeedBox


def make(qtbot, value, chosen=""):
    asked = []

    def choose(parent):
        asked.append(parent)
        return chosen

    box = SpeedBox(value, choose)
    qtbot.addWidget(box)
    return box, asked


def test_the_choices_and_a_stored_draft_model(qtbot):
    box, _ = make(qtbot, "draft:/models/SmolLM2-135M-Q8_0.gguf")
    assert [box.itemText(i) for i in range(box.count())] == [
        "Prompt lookup (drafts from the chat)", "Off", "MTP head (the model's own drafts)",
        "Draft model: SmolLM2-135M-Q8_0.gguf", "Draft model: choose a file…"]
    assert box.value() == "draft:/models/SmolLM2-135M-Q8_0.gguf"


def test_choosing_a_file_makes_it_the_draft_model(qtbot):
    box, asked = make(qtbot, "ngram", chosen="/m/small.gguf")
    box.activated.emit(box.count() - 1)
    box.setCurrentIndex(box.findData("draft:/m/small.gguf"))
    assert asked == [box]
    assert box.value() == "draft:/m/small.gguf"
    assert EngineSettings(speculative=box.value()).to_engine_config().draft_model == \
        "/m/small.gguf"


def test_a_cancelled_choice_keeps_the_earlier_one(qtbot):
    box, asked = make(qtbot, "off")
    box.setCurrentIndex(box.count() - 1)
    box.activated.emit(box.count() - 1)
    assert asked and box.value() == "off"


@pytest.mark.parametrize("value", ["draft:", "draft:  ", "lookup"])
def test_bad_stored_values_name_the_field(value):
    with pytest.raises(ValueError, match=r"^EngineSettings\.speculative must be"):
        EngineSettings(speculative=value)


def test_the_mtp_head_is_offered_only_for_a_model_that_has_one(qtbot):
    box, _ = make(qtbot, "ngram")  # no model loaded: greyed out, the reason in its tip
    item = box.model().item(box.findData("mtp"))
    assert not item.isEnabled()
    assert item.toolTip().startswith("Not available: no model is loaded.")
    offered = SpeedBox("ngram", mtp_missing=None)
    qtbot.addWidget(offered)
    assert offered.model().item(offered.findData("mtp")).isEnabled()
    offered.setCurrentIndex(offered.findData("mtp"))
    assert EngineSettings(speculative=offered.value()).to_engine_config().speculative == "mtp"


def test_the_mtp_reason_reaches_the_engine_tab(qtbot):
    from desktop_app.dialogs.settings_dialog import EngineForm

    form = EngineForm(EngineSettings(), cuda_names=[],
                      mtp_missing="this model has no MTP head")
    qtbot.addWidget(form)
    item = form.speed.model().item(form.speed.findData("mtp"))
    assert not item.isEnabled() and "this model has no MTP head" in item.toolTip()
