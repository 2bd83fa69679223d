"""Compare turns on fake models with distinct names: columns per model, Keep's text is what
every model answers next, and a compared model that cannot load says so while the
picker's model answers."""

from __future__ import annotations

from PySide6.QtCore import Qt

from desktop_app.services.engine_bridge import EngineBridge
from tests.desktop_app.test_main_window import settings


def fake_bridge_of(qtbot, fake_engine, workers: dict):
    fake_llm, fake_worker = fake_engine

    def llm_for(source, config=None, progress=None):
        if source == "broken":
            raise FileNotFoundError("No model at broken")
        return fake_llm(name=f"model-{source}")

    def worker_for(llm):
        workers[llm.model_name] = fake_worker(llm)
        return workers[llm.model_name]

    bridge = EngineBridge(llm_factory=llm_for, worker_factory=worker_for)
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        bridge.load_model("a")
    return bridge


def send_all(qtbot, window, text: str) -> None:
    window.conversation.composer.setPlainText(text)
    qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.controller.generating, timeout=10_000)


def test_keep_chooses_the_text_every_compared_model_answers_next(qtbot, make_window, store,
                                                                 fake_engine):
    workers: dict = {}
    bridge = fake_bridge_of(qtbot, fake_engine, workers)
    window = make_window(bridge, settings(compare_models=["b"]))
    window.new_chat()
    send_all(qtbot, window, "Hello")
    chat_id = window.controller.chat_id
    leaf = store.active_leaf(chat_id)
    group = [m for m in store.siblings(leaf) if m.candidate_group is not None]
    assert sorted(m.model for m in group) == ["model-a", "model-b"]
    kept = next(m for m in group if m.model == "model-b")
    window.controller.keep(kept.id)
    assert store.active_leaf(chat_id) == kept.id
    send_all(qtbot, window, "And then?")
    for name in ("model-a", "model-b"):
        messages, _params = workers[name].submitted[-1]
        assert [m["content"] for m in messages[-2:]] == [kept.content, "And then?"], name
    # The picker's model is not compared with itself.
    assert window.compare_button.action("a") is None
    bridge.shutdown()


def test_a_compared_model_that_cannot_load_says_so(qtbot, make_window, store, fake_engine,
                                                   captured_errors):
    workers: dict = {}
    bridge = fake_bridge_of(qtbot, fake_engine, workers)
    window = make_window(bridge, settings(compare_models=["broken"]))
    window.new_chat()
    send_all(qtbot, window, "Hello")
    assert ("A compared model could not answer", "broken: No model at broken") in captured_errors
    reply = store.get_message(store.active_leaf(window.controller.chat_id))
    assert reply.model == "model-a" and reply.status == "complete"
    bridge.shutdown()


def bridge_with_contexts(qtbot, fake_engine, workers: dict, contexts: dict):
    """A bridge on fake models whose context windows ``contexts`` names (source -> tokens)."""
    fake_llm, fake_worker = fake_engine

    def llm_for(source, config=None, progress=None):
        return fake_llm(name=f"model-{source}", max_model_len=contexts.get(source, 2048))

    def worker_for(llm):
        workers[llm.model_name] = fake_worker(llm)
        return workers[llm.model_name]

    bridge = EngineBridge(llm_factory=llm_for, worker_factory=worker_for)
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        bridge.load_model("a")
    return bridge


def test_a_compared_reply_goes_on_when_the_pickers_model_changes(qtbot, make_window, store,
                                                                 fake_engine, captured_errors):
    workers: dict = {}
    bridge = fake_bridge_of(qtbot, fake_engine, workers)
    window = make_window(bridge, settings(compare_models=["b"]))
    with qtbot.waitSignal(bridge.companionReady, timeout=5000):
        bridge.prepare("b")
    workers["model-b"].gate.clear()  # b's reply stays in flight
    window.new_chat()
    chat_id = window.controller.chat_id
    window.conversation.composer.setPlainText("Hello")
    qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
    # The picker's model has answered; the compared one is still writing.
    qtbot.waitUntil(lambda: len(bridge.in_flight()) == 1
                    and bridge.in_flight()[0].startswith("b#"), timeout=10_000)
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        bridge.load_model("c")
    assert bridge.model_name == "model-c" and bridge.busy
    workers["model-b"].gate.set()
    qtbot.waitUntil(lambda: not window.controller.generating, timeout=10_000)
    replies = {m.model: m for m in store.siblings(store.active_leaf(chat_id))
               if m.candidate_group is not None}
    assert set(replies) == {"model-a", "model-b"}
    assert replies["model-b"].status == "complete"
    assert replies["model-b"].content == "Reply1 c1w1 c1w2 c1w3 c1w4 c1w5"
    assert captured_errors == []
    assert not bridge.busy
    # The chat goes on with the new picker's model, b compared again.
    send_all(qtbot, window, "And then?")
    latest = {m.model for m in store.siblings(store.active_leaf(chat_id))
              if m.candidate_group is not None}
    assert latest == {"model-c", "model-b"}
    bridge.shutdown()


def test_a_compared_models_context_cut_outlives_leaving_the_chat(qtbot, make_window, store,
                                                                fake_engine):
    # b's context is small: its overflow policy cuts the chat, a's (2048) does not.
    workers: dict = {}
    bridge = bridge_with_contexts(qtbot, fake_engine, workers, {"b": 130})
    window = make_window(bridge, settings(compare_models=["b"]))
    window.new_chat()
    chat_id = window.controller.chat_id
    for turn in range(3):
        send_all(qtbot, window, f"question {turn}, long enough to fill a part of the context")
        kept = next(m for m in store.siblings(store.active_leaf(chat_id))
                    if m.model == "model-a")
        window.controller.keep(kept.id)  # no candidates wait for Keep
    session = window.controller.sessions[chat_id]
    assert session.pending_group is None
    assert session.compare.cut and not session.context_note  # only b's prompt was cut
    sent_b = workers["model-b"].submitted[-1][0]
    window.new_chat()  # the chat goes out of view: its session is kept for b's cut
    assert window.controller.sessions.get(chat_id) is session
    window.open_chat(chat_id)
    send_all(qtbot, window, "ok")
    # b's prompt starts where its last cut left it (its prefix cache hits again), not
    # where a fresh cut would start.
    again = workers["model-b"].submitted[-1][0]
    assert again[0]["content"] == sent_b[0]["content"]
    assert len(again) < len(store.path_to(store.active_leaf(chat_id)))
    bridge.shutdown()
