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
