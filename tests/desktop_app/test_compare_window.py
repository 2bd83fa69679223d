"""Several local models in the app (services.model_shelf on the engine's ModelHost): a chat
compares two real tiny models of different families side by side, Keep continues with the
kept reply, and each model's follow-up finds its own history in its own prefix cache;
switching the picker's model away and back finds the first one warm."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from desktop_app.services.engine_bridge import EngineBridge
from desktop_app.widgets.candidates import CandidateGroup
from engine import EngineConfig
from tests.desktop_app.test_main_window import TURN_TIMEOUT_MS, active_branch, settings

CONFIG = dict(num_gpu_blocks=128, max_model_len=512, block_size=16)


@pytest.fixture(scope="module")
def second_model(tmp_path_factory):
    """A tiny random Gemma 2 folder: another family, vocabulary and template than the
    tiny Llama (``tiny_model_path``)."""
    from tests.engine.tiny_models import save_tiny_model, tiny_gemma_config

    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-gemma",
                           tiny_gemma_config(2), seed=1)


def loaded(qtbot, source) -> EngineBridge:
    bridge = EngineBridge(engine_config=EngineConfig(**CONFIG))
    load(qtbot, bridge, source)
    return bridge


def load(qtbot, bridge, source) -> None:
    with qtbot.waitSignal(bridge.modelLoaded, timeout=60_000):
        bridge.load_model(str(source))


def send_all(qtbot, window, text: str) -> None:
    """A turn, until every column's reply is stored and the engine is idle."""
    window.conversation.composer.setPlainText(text)
    qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.controller.generating, timeout=5_000)
    qtbot.waitUntil(lambda: not window.controller.generating, timeout=TURN_TIMEOUT_MS)
    qtbot.waitUntil(lambda: not window.bridge.active, timeout=10_000)


def group_of(window) -> CandidateGroup:
    [group] = window.conversation.findChildren(CandidateGroup)
    return group


def computed(reply) -> int:
    return reply.metrics["num_prompt_tokens"] - reply.metrics["num_cached_tokens"]


def test_two_models_answer_side_by_side_and_each_follow_up_computes_only_the_new_turn(
        qtbot, make_window, store, tiny_model_path, second_model):
    bridge = loaded(qtbot, tiny_model_path)
    app_settings = settings(max_tokens=12)
    app_settings.model_paths = [str(second_model)]  # added in the model manager before
    window = make_window(bridge, app_settings)
    window.new_chat()
    action = window.compare_button.action(str(second_model))
    assert action is not None and not action.isChecked()
    with qtbot.waitSignal(bridge.companionReady, timeout=60_000):
        action.setChecked(True)  # chosen: loaded at once, while the user types
    chat_id = window.controller.chat_id
    assert store.get_chat(chat_id).settings.compare_models == [str(second_model)]
    assert window.compare_button.text() == "Compare (1)"

    send_all(qtbot, window, "Hello there, which model are you?")
    group = group_of(window)
    main, other = bridge.model_name, bridge.hosted_worker(str(second_model)).model_name
    assert main != other
    assert [c.title.text() for c in group.columns] == [main, other]
    assert all(c.finished and "tokens ·" in c.metrics_label.text() for c in group.columns)
    first = {m.model: m for m in store.siblings(group.columns[0].message_id)}
    assert set(first) == {main, other}

    # Keep the compared model's reply: the conversation continues with its text.
    kept = group.columns[1]
    qtbot.mouseClick(kept.keep_button, Qt.MouseButton.LeftButton)
    assert active_branch(store, chat_id)[-1].id == kept.message_id
    send_all(qtbot, window, "Tell me more, please.")
    follow = {m.model: m for m in store.siblings(group_of(window).columns[0].message_id)}
    assert set(follow) == {main, other}
    for model, reply in follow.items():
        assert reply.parent_id == active_branch(store, chat_id)[-2].id  # the new question
        block = 16
        before = first[model].metrics["num_prompt_tokens"]
        # Each model's cache holds its first prompt (and its own reply, where kept): only
        # the new turn is computed, to a block.
        assert reply.metrics["num_cached_tokens"] >= before - block, model
        grew = reply.metrics["num_prompt_tokens"] - before
        assert 0 < computed(reply) <= grew + block, model
    # The kept model's own reply went back as its ids: it was cached too.
    kept_reply = follow[other]
    assert kept_reply.metrics["num_cached_tokens"] >= (
        first[other].metrics["num_prompt_tokens"] + len(first[other].token_ids) - 16)
    bridge.shutdown()


def test_switching_models_keeps_the_first_ones_cache(qtbot, make_window, store,
                                                    tiny_model_path, second_model):
    bridge = loaded(qtbot, tiny_model_path)
    window = make_window(bridge, settings(max_tokens=8))
    window.new_chat()
    send_all(qtbot, window, "A first question for the first model.")
    first_worker = bridge.worker
    load(qtbot, bridge, second_model)
    assert bridge.worker is not first_worker
    assert {m.name for m in bridge.hosted()} == {str(tiny_model_path), str(second_model)}
    send_all(qtbot, window, "A second question, for the second model.")
    load(qtbot, bridge, tiny_model_path)
    assert bridge.worker is first_worker  # still loaded: nothing was read again
    send_all(qtbot, window, "And back to the first model.")
    chat = active_branch(store, window.controller.chat_id)
    first_reply, last = chat[1], chat[-1]
    assert last.model == first_reply.model
    # Its first turn's prompt and reply are still in its cache (the other model's reply
    # between comes as text, computed with the new question).
    assert last.metrics["num_cached_tokens"] >= first_reply.metrics["num_prompt_tokens"] - 16
    bridge.shutdown()


def test_the_memory_dock_lists_both_models_and_its_block_map_switches(
        qtbot, make_window, store, tiny_model_path, second_model):
    bridge = loaded(qtbot, tiny_model_path)
    window = make_window(bridge, settings(max_tokens=8))
    panel = window.vram_panel
    assert panel.models.isHidden()  # one model: nothing to choose
    window.new_chat()
    send_all(qtbot, window, "Some blocks for the first model.")
    main_blocks = panel.last_kv.num_blocks
    load(qtbot, bridge, second_model)
    qtbot.waitUntil(lambda: len(panel.models.lines) == 2, timeout=5_000)
    assert not panel.models.isHidden()
    assert set(panel.models.lines) == {str(tiny_model_path), str(second_model)}
    assert all("weights" in line and "KV pool" in line for line in panel.models.lines.values())
    assert "idle" in panel.models.lines[str(tiny_model_path)]
    assert panel.models.lines[str(second_model)].endswith("the chats' model")
    # The dock shows the picker's model (now the second); switching shows the first's
    # pool, its cached blocks from the turn above included.
    assert panel.models.picker.currentData() == str(second_model)
    assert panel.last_kv.num_cached == 0
    first = panel.models.picker.findData(str(tiny_model_path))
    panel.models.picker.setCurrentIndex(first)
    panel.models.picker.activated.emit(first)
    assert panel.last_kv.num_cached > 0
    assert len(panel.block_map.blocks) == main_blocks
    bridge.shutdown()
