"""Settings ▸ Engine from the main window: the choice is saved, the bridge reloads the
loaded model with the new EngineConfig, and a new app starts with the saved choice."""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QSpinBox

from desktop_app.data.settings import load_settings


def test_engine_settings_apply_persist_and_reload(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    loads: list[object] = []
    fake_bridge.load_model = lambda source, config=None: loads.append(fake_bridge.engine_config)
    dialog = window.open_settings()
    weights = dialog.findChild(QComboBox, "weightsSetting")
    weights.setCurrentIndex(weights.findData("float32"))
    dialog.findChild(QSpinBox, "chatMemorySetting").setValue(1024)
    dialog.accept()

    saved = load_settings().engine
    assert (saved.weights, saved.chat_memory_mib) == ("float32", 1024)
    assert len(loads) == 1  # the loaded model was reloaded once, with the new config
    assert loads[0].weights == "float32" and loads[0].kv_cache_memory_bytes == 1024 << 20

    # Opening the settings again without changes reloads nothing.
    window.open_settings().accept()
    assert len(loads) == 1


def test_a_new_window_starts_with_the_saved_engine_settings(qtbot, fake_bridge, make_window):
    from desktop_app.__main__ import build_window
    from desktop_app.data.engine_settings import EngineSettings
    from desktop_app.data.settings import save_settings

    settings = load_settings()
    settings.engine = EngineSettings(device="cpu", weights="bfloat16")
    save_settings(settings)
    window = build_window()
    qtbot.addWidget(window)
    config = window.bridge.engine_config
    assert (config.device, config.weights) == ("cpu", "bfloat16")
    window.vram_panel.timer.stop()
    window.bridge.shutdown()
