"""Warm reopen in the app: a chat sent, the app's engine closed (its cached blocks kept on
disk) and a new one loaded on the same cache folder with the chat still open; the chat's
history is loaded ahead, and its next reply's metrics line says how many prompt tokens
came from disk."""

from __future__ import annotations

from desktop_app.data.settings import EngineSettings
from desktop_app.services.devices import engine_config_for
from desktop_app.services.engine_bridge import EngineBridge
from tests.desktop_app.test_main_window import active_branch, send, settings


def loaded_bridge(qtbot, model) -> EngineBridge:
    """A bridge with the app's automatic engine settings (the disk tier on)."""
    config = engine_config_for(EngineSettings())
    assert config.kv_disk_bytes > 0
    bridge = EngineBridge(engine_config=config)
    with qtbot.waitSignal(bridge.modelLoaded, timeout=60_000):
        bridge.load_model(str(model))
    return bridge


def test_a_chat_reopened_after_a_restart_says_its_prompt_came_from_disk(
        qtbot, make_window, store, tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.setenv("FOLIO_KV_CACHE_DIR", str(tmp_path / "kv"))
    first = loaded_bridge(qtbot, tiny_model_path)
    window = make_window(first, settings(max_tokens=8))
    send(qtbot, window, "Tell me about the warm disk cache of this app, please.")
    send(qtbot, window, "And how long does it keep the blocks of a chat around?")
    chat_id = window.controller.chat_id
    window.close()
    first.shutdown()  # the worker keeps the cached blocks on disk as the model unloads
    assert any((tmp_path / "kv").rglob("*.kvb"))

    second = EngineBridge(engine_config=engine_config_for(EngineSettings()))
    reopened = make_window(second, settings(max_tokens=8))
    assert reopened.controller.chat_id == chat_id  # the last chat is open at start
    with qtbot.waitSignal(second.modelLoaded, timeout=60_000):
        second.load_model(str(tiny_model_path))
    worker = second.worker
    # Loaded ahead once the model is in (the worker's stats show the cached blocks).
    qtbot.waitUntil(lambda: worker.kv_stats().num_cached > 0, timeout=30_000)
    read_ahead = worker.kv_stats().disk.hit_blocks
    send(qtbot, reopened, "One more question from the same chat.")
    reply = active_branch(store, chat_id)[-1]
    disk = reply.metrics["num_disk_tokens"]
    history = active_branch(store, chat_id)[-3]  # the last reply before the restart
    earlier = history.metrics["num_prompt_tokens"] + len(history.token_ids)
    block = worker.kv_stats().block_size
    assert disk == reply.metrics["num_cached_tokens"] and disk >= earlier - block
    assert read_ahead == disk // block  # every block was read ahead, none at the send
    footer = reopened.conversation.rows()[-1].metrics_label.text()
    assert f"cached, {disk} from disk" in footer
    second.shutdown()
