"""Each newer model family chats in the real window: tiny random Gemma 2, Gemma 3 and
Phi-4-mini-like folders (byte tokenizer, ChatML) through the bridge, the worker and the
engine, two turns each, the second finding the first in the prefix cache."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from desktop_app.data.settings import AppSettings, ChatSettings
from desktop_app.services.engine_bridge import EngineBridge
from tests.engine.tiny_models import save_tiny_model, tiny_gemma_config, tiny_phi3_config

pytestmark = pytest.mark.slow

CONFIGS = {
    "gemma2": lambda: tiny_gemma_config(2),
    "gemma3": lambda: tiny_gemma_config(3),
    "phi4-mini": lambda: tiny_phi3_config(partial_rotary_factor=0.75),
}


@pytest.fixture(params=list(CONFIGS))
def family_bridge(request, qtbot, tmp_path_factory):
    from engine import LLM

    path = save_tiny_model(tmp_path_factory.mktemp("models") / request.param,
                           CONFIGS[request.param]())
    bridge = EngineBridge(llm_factory=lambda source, config=None, progress=None: LLM(
        str(path), num_gpu_blocks=256, max_model_len=512))
    with qtbot.waitSignal(bridge.modelLoaded, timeout=60000):
        bridge.load_model(request.param)
    yield bridge
    bridge.shutdown()


def send(qtbot, window, text: str) -> None:
    window.conversation.composer.setPlainText(text)
    with qtbot.waitSignal(window.controller.turnFinished, timeout=60000):
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)


def test_two_turns_in_the_window(qtbot, family_bridge, make_window, store):
    # Short greedy replies: two turns fit the 512-token context whatever the random
    # weights say, and the test takes seconds.
    settings = AppSettings(chat_defaults=ChatSettings(max_tokens=24, temperature=0.0))
    window = make_window(family_bridge, settings)
    send(qtbot, window, "Hello, who are you?")
    send(qtbot, window, "And what can you do for me today?")
    path = store.path_to(store.active_leaf(window.controller.chat_id))
    assert [m.role for m in path] == ["user", "assistant", "user", "assistant"]
    first, second = path[1], path[3]
    assert first.status == second.status == "complete"
    assert first.token_ids and second.token_ids
    # The second turn's prompt starts with the first turn, exactly: whole blocks of it
    # come from the prefix cache.
    assert second.metrics["num_cached_tokens"] >= 16
