"""Settings ▸ Engine: device, weights and memory for chats."""

from __future__ import annotations

from PySide6.QtWidgets import QCheckBox, QComboBox, QSpinBox

from desktop_app.data.engine_settings import EngineSettings
from desktop_app.data.settings import ChatSettings
from desktop_app.dialogs.settings_dialog import SettingsDialog

CARDS = ["NVIDIA H200", "NVIDIA L4"]


def make(qtbot, engine=None, cards=CARDS) -> SettingsDialog:
    dialog = SettingsDialog(None, ChatSettings(), engine=engine or EngineSettings(),
                            cuda_names=cards)
    qtbot.addWidget(dialog)
    return dialog


def test_the_widgets_and_their_choices(qtbot):
    dialog = make(qtbot)
    assert dialog.tabs.tabText(dialog.tabs.count() - 1) == "Engine"
    device = dialog.findChild(QComboBox, "deviceSetting")
    assert [device.itemText(i) for i in range(device.count())] == [
        "Auto (CUDA 0: NVIDIA H200)", "CPU", "CUDA 0: NVIDIA H200", "CUDA 1: NVIDIA L4"]
    assert [device.itemData(i) for i in range(device.count())] == [
        "auto", "cpu", "cuda:0", "cuda:1"]
    weights = dialog.findChild(QComboBox, "weightsSetting")
    assert [weights.itemText(i) for i in range(weights.count())] == [
        "As stored in the file", "bfloat16", "float32"]
    precision = dialog.findChild(QComboBox, "cpuPrecisionSetting")
    assert [precision.itemText(i) for i in range(precision.count())] == [
        "Exact (16-bit activations)", "Fast (8-bit, as llama.cpp)"]
    assert precision.currentData() == 16 and precision.accessibleName() == "CPU precision"
    memory = dialog.findChild(QSpinBox, "chatMemorySetting")
    assert memory.text() == "Automatic" and memory.accessibleName() == "Memory for chats"
    speed = dialog.findChild(QComboBox, "speedSetting")
    assert [speed.itemText(i) for i in range(speed.count())] == [
        "Prompt lookup (drafts from the chat)", "Off", "MTP head (the model's own drafts)",
        "Draft model: choose a file…"]
    assert speed.currentData() == "ngram" and speed.accessibleName() == "Speed"


def test_without_cuda_auto_means_the_cpu(qtbot):
    dialog = make(qtbot, cards=[])
    device = dialog.findChild(QComboBox, "deviceSetting")
    assert [device.itemText(i) for i in range(device.count())] == ["Auto (CPU)", "CPU"]


def test_shows_and_returns_the_settings(qtbot):
    dialog = make(qtbot, EngineSettings("cuda:1", "bfloat16", 2048, 8))
    form = dialog.engine_form
    assert (form.device.currentData(), form.weights.currentData()) == ("cuda:1", "bfloat16")
    assert form.cpu_precision.currentData() == 8
    assert form.chat_memory.value() == 2048 and form.chat_memory.text() == "2048 MiB"
    form.device.setCurrentIndex(form.device.findData("cpu"))
    form.weights.setCurrentIndex(form.weights.findData("float32"))
    form.cpu_precision.setCurrentIndex(form.cpu_precision.findData(16))
    form.chat_memory.setValue(0)
    form.speed.setCurrentIndex(form.speed.findData("off"))
    dialog.accept()
    assert dialog.result_engine == EngineSettings("cpu", "float32", None, 16,
                                                  speculative="off")


def test_keep_chats_warm_on_disk(qtbot):
    dialog = make(qtbot)
    form = dialog.engine_form
    keep = dialog.findChild(QCheckBox, "keepWarmSetting")
    size = dialog.findChild(QSpinBox, "warmDiskSetting")
    assert keep.text() == "Keep chats warm on disk" and keep.isChecked()
    assert size.value() == 4 and size.text() == "4 GiB" and size.isEnabled()
    keep.setChecked(False)
    assert not size.isEnabled()
    keep.setChecked(True)
    size.setValue(10)
    assert form.settings() == EngineSettings(keep_warm_on_disk=True, warm_disk_gib=10)
    keep.setChecked(False)
    dialog.accept()
    assert dialog.result_engine.keep_warm_on_disk is False
    assert dialog.result_engine.to_engine_config().kv_disk_bytes == 0


def test_a_device_not_on_this_computer_is_kept_and_shown(qtbot):
    dialog = make(qtbot, EngineSettings(device="cuda:5"))
    form = dialog.engine_form
    assert form.device.currentText() == "cuda:5 (not found on this computer)"
    assert form.settings().device == "cuda:5"


def test_too_little_memory_keeps_the_dialog_open(qtbot):
    dialog = make(qtbot)
    dialog.engine_form.chat_memory.setValue(8)
    dialog.accept()
    assert dialog.result_engine is None and dialog.result_defaults is None
    assert "EngineSettings.chat_memory_mib must be" in dialog.error_label.text()


def test_no_engine_tab_without_engine_settings(qtbot):
    dialog = SettingsDialog(None, ChatSettings())
    qtbot.addWidget(dialog)
    assert dialog.engine_form is None and dialog.findChild(QComboBox, "deviceSetting") is None
    dialog.accept()
    assert dialog.result_engine is None
