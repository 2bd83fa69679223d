"""Settings ▸ Engine ▸ KV cache precision: the choices a device offers, each with the
tokens it holds for the loaded model in the memory for chats, and the choice returned."""

from __future__ import annotations

from desktop_app.data.engine_settings import EngineSettings
from desktop_app.data.kv_precision import ModelShape, fit, fit_text
from desktop_app.data.settings import ChatSettings
from desktop_app.dialogs.settings_dialog import SettingsDialog
from tests.cpu_pool import NATIVE

STARTER = ModelShape(30, 3, 64, 8192)


def make(qtbot, engine=None, cards=(), model=STARTER) -> SettingsDialog:
    dialog = SettingsDialog(None, ChatSettings(), engine=engine or EngineSettings(),
                            cuda_names=list(cards), model=model)
    qtbot.addWidget(dialog)
    return dialog


def test_each_choice_shows_what_it_holds_in_the_memory_for_chats(qtbot):
    dialog = make(qtbot, EngineSettings(device="cpu", chat_memory_mib=256))
    box = dialog.engine_form.kv_precision
    assert box.accessibleName() == "KV cache precision"
    assert [box.itemData(i) for i in range(box.count())] == ["auto", "float16", "int8", "int4"]
    default = dialog.engine_form.kv_precision.texts()[0]
    # The CPU's default (engine/runner/device.py), with what it holds.
    assert default.startswith("Default: 8-bit (int8): " if NATIVE else "Default: 32-bit")
    texts = box.texts()[1:]
    assert texts == [
        f"16-bit (float16): {fit_text(fit(STARTER, 'float16', 256 << 20))}",
        f"8-bit (int8): {fit_text(fit(STARTER, 'int8', 256 << 20))}",
        f"4-bit (int4): {fit_text(fit(STARTER, 'int4', 256 << 20))}"]
    assert texts[0] == "16-bit (float16): 11,648 tokens in 256 MiB"
    # The memory changes: the counts follow before anything is picked.
    dialog.engine_form.chat_memory.setValue(512)
    assert box.texts()[1] == "16-bit (float16): 23,296 tokens in 512 MiB"
    dialog.engine_form.chat_memory.setValue(0)  # automatic
    assert box.texts()[2] == "8-bit (int8): 32,768 tokens in 377 MiB"
    assert box.currentData() == "auto"


def test_without_a_local_model_the_labels_alone(qtbot):
    dialog = make(qtbot, model=None)
    box = dialog.engine_form.kv_precision
    assert box.texts()[1:] == ["16-bit (float16)", "8-bit (int8)", "4-bit (int4)"]


def test_fp8_only_for_a_cuda_device(qtbot):
    dialog = make(qtbot, EngineSettings(device="cuda:0", kv_cache_dtype="fp8"),
                  cards=["NVIDIA H200"])
    form = dialog.engine_form
    assert [form.kv_precision.itemData(i) for i in range(form.kv_precision.count())] == [
        "auto", "int8", "int4", "fp8"]
    # (No CUDA here: the default is estimated for the device this machine has.)
    assert form.kv_precision.texts()[0].startswith("Default: ")
    assert form.kv_precision.value() == "fp8"
    form.device.setCurrentIndex(form.device.findData("cpu"))
    assert "fp8" not in [form.kv_precision.itemData(i) for i in range(form.kv_precision.count())]
    assert form.kv_precision.value() == "auto"
    # Back on the card, the stored choice returns (it was never picked away).
    form.device.setCurrentIndex(form.device.findData("cuda:0"))
    assert form.kv_precision.value() == "fp8"


def test_the_choice_is_returned_and_kept(qtbot):
    dialog = make(qtbot, EngineSettings(device="cpu", kv_cache_dtype="int8"))
    box = dialog.engine_form.kv_precision
    assert box.value() == "int8"
    box.setCurrentIndex(box.findData("int4"))
    dialog.accept()
    assert dialog.result_engine == EngineSettings(device="cpu", kv_cache_dtype="int4")
