"""Beam search in the app, through its controller: a chat with "Beam search" on sends a
message from the composer, the engine thread runs the search while the reply says it is
searching and the Memory dock's block map shows the beams sharing blocks, and the reply
ends with the finished beams as its candidates, best first, the very beams
``LLM.beam_search`` finds for the same prompt ids; Keep keeps one."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt

import engine.worker
from desktop_app.services.engine_bridge import EngineBridge
from desktop_app.widgets.candidates import CandidateColumn
from desktop_app.widgets.prompt_progress import searching
from engine import LLM, BeamSearchParams, EngineConfig
from tests.desktop_app.test_main_window import TURN_TIMEOUT_MS, active_branch, settings

CONFIG = dict(num_gpu_blocks=96, max_model_len=512, block_size=8, kv_cache_dtype="float32")
WIDTH, MAX_TOKENS = 4, 10
PAUSE_AFTER = 3  # beam steps before the engine thread waits for the test


def beam_settings(**chat):
    return settings(max_tokens=MAX_TOKENS, beam_search=True, beam_width=WIDTH, **chat)


def columns_of(window, store, chat_id: int) -> list[CandidateColumn]:
    """The columns of the chat's last turn, by its replies' ids (a group drawn before
    may still wait for its deletion among the view's children)."""
    leaf = store.get_message(store.active_leaf(chat_id))
    parent = leaf.parent_id if leaf.role == "assistant" else leaf.id
    replies = sorted((m for m in store.children(parent) if m.role == "assistant"),
                     key=lambda m: m.candidate_index or 0)
    return [window.conversation.widget_for(m.id) for m in replies]


@pytest.fixture
def bridge(qtbot, tiny_model_path):
    bridge = EngineBridge(engine_config=EngineConfig(**CONFIG))
    with qtbot.waitSignal(bridge.modelLoaded, timeout=60_000):
        bridge.load_model(str(tiny_model_path))
    yield bridge
    bridge.shutdown()


class PausedSearch:
    """A step hook on the engine thread: after ``PAUSE_AFTER`` steps of a beam search it
    waits until the test lets it go, so the GUI thread sees the search mid-way."""

    def __init__(self) -> None:
        self.steps = 0
        self.paused, self.resume = threading.Event(), threading.Event()

    def __call__(self, report) -> None:
        if any(rid.startswith("chat-") for rid in report.new_tokens):
            self.steps += 1
            if self.steps == PAUSE_AFTER:
                self.paused.set()
                self.resume.wait(60)


def test_a_beam_search_from_the_composer(qtbot, make_window, store, bridge, tiny_model_path,
                                         monkeypatch):
    # Every step refreshes the worker's KV snapshot (the dock reads that snapshot).
    monkeypatch.setattr(engine.worker, "STATS_INTERVAL_S", 0.0)
    worker = bridge.worker
    submitted = []
    submit = worker.submit
    monkeypatch.setattr(worker, "submit", lambda prompt, params, on_event: (
        submitted.append((prompt, params)), submit(prompt, params, on_event))[1])
    pause = PausedSearch()
    remove_hook = worker.llm.loop.add_hook(pause)
    window = make_window(bridge, beam_settings())
    window.new_chat()
    chat_id = window.controller.chat_id
    assert not window.candidates_spin.isEnabled()  # the width sets the replies

    window.conversation.composer.setPlainText("Name three colours of the sea.")
    qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(pause.paused.is_set, timeout=TURN_TIMEOUT_MS)
    try:
        # Mid-search: every beam's column waits, saying why nothing streams.
        columns = columns_of(window, store, chat_id)
        assert len(columns) == WIDTH and all(isinstance(c, CandidateColumn) for c in columns)
        for column in columns:
            # Shown in its column (the column itself may wait for the event loop to be
            # shown: the engine can pause before the GUI thread ran it).
            assert column.prompt_progress.isVisibleTo(column)
            assert column.prompt_progress.text().startswith(searching(WIDTH))
            assert column.text() == "" and not column.keep_button.isEnabled()
        [[prompt, params]] = submitted
        assert isinstance(params, BeamSearchParams)
        assert (params.beam_width, params.max_tokens, params.length_penalty) == (
            WIDTH, MAX_TOKENS, 1.0)
        # The dock's block map: the prompt's blocks held by several beams at once.
        window.vram_panel.refresh()
        cells = window.vram_panel.block_map.blocks
        shared = [c for c in cells if len(c.owners) > 1]
        assert shared
        assert all(c.state == "shared" for c in shared)
        request_id = bridge.in_flight()[0]
        owners = {o for c in cells for o in c.owners}
        assert len(owners) == WIDTH and all(o.startswith(request_id + ":") for o in owners)
        assert int(window.vram_panel.value("blocks_shared")) == len(shared)
    finally:
        with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS):
            pause.resume.set()
        remove_hook()
    qtbot.waitUntil(lambda: not bridge.active, timeout=TURN_TIMEOUT_MS)

    # The beams, best first, are the turn's candidates: those LLM.beam_search finds.
    columns = columns_of(window, store, chat_id)
    replies = [store.get_message(c.message_id) for c in columns]
    reference = LLM(str(tiny_model_path), config=EngineConfig(**CONFIG))
    [expected] = reference.beam_search([list(prompt.ids)], params)
    assert len(expected.outputs) == WIDTH
    assert [r.token_ids for r in replies] == [o.token_ids for o in expected.outputs]
    assert [r.content for r in replies] == [o.reply.content for o in expected.outputs]
    assert [r.metrics["num_generated_tokens"] for r in replies] == [
        len(o.token_ids) for o in expected.outputs]
    for column in columns:
        assert column.finished and not column.prompt_progress.isVisibleTo(column)
        assert f"beam search, width {WIDTH}" in column.metrics_label.text()
        assert "tok/s" not in column.metrics_label.text()
    # After the search every block is free again, or cached for the next turn.
    window.vram_panel.refresh()
    assert all(not c.owners and c.state in ("free", "cached")
               for c in window.vram_panel.block_map.blocks)

    # Keep works as for candidates: the kept beam is the chat's reply.
    kept = columns[1]
    qtbot.mouseClick(kept.keep_button, Qt.MouseButton.LeftButton)
    assert active_branch(store, chat_id)[-1].id == kept.message_id


def test_continue_goes_on_with_the_best_beam(qtbot, make_window, store, bridge):
    window = make_window(bridge, beam_settings())
    window.new_chat()
    chat_id = window.controller.chat_id
    window.conversation.composer.setPlainText("Count up from one.")
    with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS):
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
    columns = columns_of(window, store, chat_id)
    best = store.get_message(columns[0].message_id)
    assert best.metrics["finish_reason"] == "length"
    qtbot.mouseClick(columns[0].keep_button, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS):
        window.controller.continue_reply(best.id)
    reply = active_branch(store, chat_id)[-1]
    assert reply.id == best.id
    assert len(reply.token_ids) > len(best.token_ids)
    assert reply.token_ids[:len(best.token_ids)] == best.token_ids
    assert reply.metrics["beam_width"] == WIDTH


def test_a_hybrid_model_greys_beam_search_out_with_the_engines_reason(
        qtbot, make_window, store, captured_errors, tmp_path):
    from tests.engine.tiny_models import save_tiny_model, tiny_qwen35_config

    hybrid = save_tiny_model(tmp_path / "tiny-qwen35", tiny_qwen35_config())
    bridge = EngineBridge(engine_config=EngineConfig(**CONFIG))
    with qtbot.waitSignal(bridge.modelLoaded, timeout=60_000):
        bridge.load_model(str(hybrid))
    try:
        reason = bridge.worker.llm.engine.beam_search_refusal()
        assert "linear-attention" in reason and bridge.beam_search_refusal == reason
        window = make_window(bridge, beam_settings())  # new chats have it on
        window.new_chat()
        dialog = window.open_settings()
        for form in (dialog.chat_form, dialog.defaults_form):
            switch = form.beam.enabled
            assert reason in switch.toolTip()
            # On (chosen for a model that runs it): it may be turned off, not on again.
            assert switch.isChecked() and switch.isEnabled()
            switch.setChecked(False)
            assert not switch.isEnabled()
        dialog.reject()
        # Sent anyway (the chat had it on): refused before anything is stored, the
        # draft left in the composer.
        window.conversation.composer.setPlainText("Hello")
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
        assert captured_errors == [("Could not start the reply", f"Beam search: {reason}")]
        assert not window.controller.generating
        assert store.active_leaf(window.controller.chat_id) is None
        assert window.conversation.composer.toPlainText() == "Hello"
    finally:
        bridge.shutdown()


def test_a_servers_model_greys_beam_search_out(qtbot, make_window, store, captured_errors):
    from desktop_app.services.remote import RemoteWorker
    from tests.desktop_app.services.openai_stub import StubServer
    from tests.desktop_app.test_remote_window import KEY, add_and_load

    stub = StubServer(api_key=KEY, words=4, delay_s=0.002)
    bridge = EngineBridge()
    window = make_window(bridge, beam_settings())
    try:
        add_and_load(qtbot, window, stub.url, KEY)
        assert bridge.is_remote
        reason = RemoteWorker.beam_search_refusal
        assert bridge.beam_search_refusal == reason
        window.new_chat()
        dialog = window.open_settings()
        switch = dialog.chat_form.beam.enabled
        assert reason in switch.toolTip()
        switch.setChecked(False)  # on for the chat: it may be turned off, not on again
        assert not switch.isEnabled()
        dialog.reject()
        window.conversation.composer.setPlainText("Hello, server")
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
        assert captured_errors == [("Could not start the reply", f"Beam search: {reason}")]
        assert store.active_leaf(window.controller.chat_id) is None
    finally:
        bridge.shutdown()
        stub.stop()


def test_stop_ends_a_beam_search_and_frees_its_blocks(qtbot, make_window, store, bridge,
                                                      monkeypatch):
    monkeypatch.setattr(engine.worker, "STATS_INTERVAL_S", 0.0)
    pause = PausedSearch()
    remove_hook = bridge.worker.llm.loop.add_hook(pause)
    window = make_window(bridge, beam_settings())
    window.new_chat()
    window.conversation.composer.setPlainText("Name three colours of the sea.")
    qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(pause.paused.is_set, timeout=TURN_TIMEOUT_MS)
    try:
        with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS):
            window.controller.stop()
            pause.resume.set()
    finally:
        pause.resume.set()
        remove_hook()
    qtbot.waitUntil(lambda: not bridge.active, timeout=TURN_TIMEOUT_MS)
    columns = columns_of(window, store, window.controller.chat_id)
    assert len(columns) == WIDTH
    for column in columns:  # no beam had finished: each column says it stopped
        assert column.finished and column.keep_button.isEnabled()
        assert "Stopped" in column.metrics_label.text()
    window.vram_panel.refresh()
    assert all(not c.owners for c in window.vram_panel.block_map.blocks)
