"""Speculative decoding in the app, through its controller: Settings ▸ Engine ▸ Speed set to
prompt lookup reloads the model with it, a message that repeats itself sent from the
composer gets a reply whose metrics line says how many drafts the model kept, and the
Memory dock counts the blocks its rejected drafts gave back."""

from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6.QtWidgets import QComboBox

from desktop_app.data.engine_settings import EngineSettings
from desktop_app.data.metric_values import count
from desktop_app.services.engine_bridge import EngineBridge
from desktop_app.widgets.message_widget import MessageWidget
from tests.desktop_app.test_main_window import active_branch, send, settings

CONFIG = dict(num_gpu_blocks=96, max_model_len=512, block_size=8, kv_cache_dtype="float32")
SPEED_OFF = EngineSettings(device="cpu", speculative="off")


@pytest.fixture(scope="module")
def peaked_model(tmp_path_factory):
    """A tiny Llama whose greedy replies repeat (peaked logits): drafts copied from the
    chat are partly kept, partly rejected."""
    from tests.engine.tiny_models import peaked_weights, save_tiny_model, tiny_llama_config

    return save_tiny_model(tmp_path_factory.mktemp("models") / "peaked", tiny_llama_config(),
                           init=peaked_weights)


def test_prompt_lookup_from_the_speed_setting(qtbot, make_window, store, peaked_model,
                                              monkeypatch):
    # The app's own config for its settings, with a pool small enough for blocks of 8.
    import desktop_app.services.engine_bridge as bridge_module

    real = bridge_module.engine_config_for
    monkeypatch.setattr(bridge_module, "engine_config_for",
                        lambda s: replace(real(s), **CONFIG))
    bridge = EngineBridge(engine_config=bridge_module.engine_config_for(SPEED_OFF))
    with qtbot.waitSignal(bridge.modelLoaded, timeout=60_000):
        bridge.load_model(str(peaked_model))
    app = settings(max_tokens=40)
    app.engine = SPEED_OFF
    window = make_window(bridge, app)
    window.new_chat()
    try:
        text = "abc def ghi " * 6
        send(qtbot, window, text)
        plain = active_branch(store, window.controller.chat_id)[-1]
        assert not count(plain.metrics, "num_draft_tokens")
        assert "drafts" not in window.conversation.widget_for(plain.id).metrics_label.text()

        dialog = window.open_settings()
        speed = dialog.findChild(QComboBox, "speedSetting")
        speed.setCurrentIndex(speed.findData("ngram"))
        with qtbot.waitSignal(bridge.modelLoaded, timeout=60_000):
            dialog.accept()  # Speed changed: the model reloads with prompt lookup
        assert bridge.engine_config.speculative == "ngram"
        assert window.settings.engine.speculative == "ngram"

        window.new_chat()
        send(qtbot, window, text)
        reply = active_branch(store, window.controller.chat_id)[-1]
        # The same greedy reply, part of it checked as drafts.
        assert reply.token_ids == plain.token_ids
        drafted = count(reply.metrics, "num_draft_tokens")
        kept = count(reply.metrics, "num_accepted_draft_tokens")
        assert drafted and kept < drafted  # some drafts were rejected
        widget = window.conversation.widget_for(reply.id)
        assert isinstance(widget, MessageWidget)
        assert f"drafts {kept / drafted:.0%} accepted" in widget.metrics_label.text()
        window.vram_panel.refresh()
        rolled = window.vram_panel.value("rolled_back")
        assert rolled.endswith(" blocks since start") and int(rolled.split()[0]) > 0
    finally:
        bridge.shutdown()
