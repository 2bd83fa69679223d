"""The chat settings' "Beam search" row: its values round-trip, the settings only sampling
reads are greyed out while it is on (their tooltips say why, and come back when it is
off), what the form does not show is kept, and a model that runs no beam search greys the
switch out with the reason."""

from __future__ import annotations

from desktop_app.data.beam_choice import SAMPLING_ONLY_NOTE
from desktop_app.data.settings import ChatSettings
from desktop_app.dialogs.settings_dialog import ChatSettingsForm

SAMPLING_BOXES = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                  "fixed_seed", "seed", "num_candidates")


def test_beam_search_greys_the_sampling_settings_out(qtbot):
    form = ChatSettingsForm(ChatSettings(seed=7))
    qtbot.addWidget(form)
    before = {name: getattr(form, name).toolTip() for name in SAMPLING_BOXES}
    assert all(getattr(form, name).isEnabled() for name in SAMPLING_BOXES)
    assert not form.beam.beam_width.isEnabled()

    form.beam.enabled.setChecked(True)
    for name in SAMPLING_BOXES:
        box = getattr(form, name)
        assert not box.isEnabled() and box.toolTip() == SAMPLING_ONLY_NOTE, name
    assert form.beam.beam_width.isEnabled() and form.beam.length_penalty.isEnabled()

    form.beam.enabled.setChecked(False)
    for name in SAMPLING_BOXES:
        box = getattr(form, name)
        assert box.isEnabled() and box.toolTip() == before[name], name


def test_values_round_trip_and_hidden_fields_are_kept(qtbot):
    chat = ChatSettings(json_mode=True, think=False, compare_models=["other.gguf"],
                        tools={"files": None}, beam_search=True, beam_width=6,
                        length_penalty=0.5)
    form = ChatSettingsForm(chat)
    qtbot.addWidget(form)
    assert form.beam.value() == (True, 6, 0.5)
    assert not form.temperature.isEnabled()  # shown greyed from the start
    assert form.settings() == chat
    form.beam.beam_width.setValue(8)
    form.beam.length_penalty.setValue(-1.25)
    form.beam.enabled.setChecked(False)
    changed = form.settings()
    assert (changed.beam_search, changed.beam_width, changed.length_penalty) == (
        False, 8, -1.25)
    assert (changed.json_mode, changed.think, changed.compare_models, changed.tools) == (
        True, False, ["other.gguf"], {"files": None})


def test_a_model_without_beam_search_greys_the_switch_out(qtbot):
    reason = "beam search does not run on models with linear-attention layers yet"
    form = ChatSettingsForm(ChatSettings(), beam_refusal=reason)
    qtbot.addWidget(form)
    assert not form.beam.enabled.isEnabled()
    assert form.beam.enabled.toolTip() == f"Not with the loaded model: {reason}"
    assert not form.settings().beam_search
    # A chat that has it on (chosen for another model) can still turn it off.
    form = ChatSettingsForm(ChatSettings(beam_search=True), beam_refusal=reason)
    qtbot.addWidget(form)
    assert form.beam.enabled.isEnabled() and reason in form.beam.enabled.toolTip()
    form.beam.enabled.setChecked(False)
    assert not form.beam.enabled.isEnabled() and not form.settings().beam_search
