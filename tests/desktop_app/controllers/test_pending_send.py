"""A message sent while the model loads (folio-app --model FILE): it waits on the composer
with the load's progress, goes out when the load finishes, and is kept, with the reason,
when the load fails. The real window, store and bridge on the fake engine."""

from __future__ import annotations

import threading

from PySide6.QtCore import Qt

from desktop_app.services.engine_bridge import EngineBridge
from tests.desktop_app.controllers.test_chat_flow import branch


class SlowLoad:
    """An llm_factory whose loads report half the weights read, then wait for `release`;
    a source named "broken" fails once released."""

    def __init__(self, fake_engine) -> None:
        self.fake_llm, self.fake_worker = fake_engine
        self.gate = threading.Event()
        self.workers = []

    def llm(self, source, config=None, progress=None):
        progress("weights", 0.5)
        assert self.gate.wait(10)
        if source == "broken":
            raise ValueError("broken: config.json is not valid JSON")
        return self.fake_llm(name=f"model-{source}")

    def worker(self, llm):
        self.workers.append(self.fake_worker(llm))
        return self.workers[-1]


def _window(qtbot, make_window, fake_engine, source):
    load = SlowLoad(fake_engine)
    bridge = EngineBridge(llm_factory=load.llm, worker_factory=load.worker)
    window = make_window(bridge)
    with qtbot.waitSignal(bridge.loadProgress, timeout=5000):
        window.load_model(source)  # what folio-app --model FILE does once the window shows
    return window, bridge, load


def _send_while_loading(qtbot, window, text):
    view = window.conversation
    view.composer.setPlainText(text)
    qtbot.mouseClick(view.send_button, Qt.MouseButton.LeftButton)


def test_a_message_sent_during_the_load_goes_out_when_it_finishes(qtbot, make_window,
                                                                  fake_engine,
                                                                  captured_errors, store):
    window, bridge, load = _window(qtbot, make_window, fake_engine, "model.gguf")
    view = window.conversation
    _send_while_loading(qtbot, window, "Hello while you load")
    assert captured_errors == []  # not refused
    note = view.pending_note
    assert note.isVisible() and note.cancel_button.isVisible()
    # Halfway through the weights, in the plain steps of widgets.load_steps.
    assert note.text() == ("Loading the model into memory… 48%. Your message is sent as "
                           "soon as it is ready.")
    assert view.composer.toPlainText() == "Hello while you load"
    assert view.composer.isReadOnly() and not view.send_button.isEnabled()
    assert store.list_chats() == []  # nothing stored until it is sent
    qtbot.keyClick(view.composer, Qt.Key.Key_Return)  # a second Enter queues nothing more
    with qtbot.waitSignal(window.controller.turnFinished, timeout=5000):
        load.gate.set()
    [worker] = load.workers
    [(messages, _params)] = worker.submitted
    assert messages[-1] == {"role": "user", "content": "Hello while you load"}
    assert branch(window) == [("user", "Hello while you load"),
                              ("assistant", "Reply1 c1w1 c1w2 c1w3 c1w4 c1w5")]
    assert not note.isVisible() and view.composer.toPlainText() == ""
    assert not view.composer.isReadOnly() and view.send_button.isEnabled()
    assert captured_errors == []


def test_a_failed_load_keeps_the_message_and_says_why(qtbot, make_window, fake_engine,
                                                      captured_errors, store):
    window, bridge, load = _window(qtbot, make_window, fake_engine, "broken")
    view = window.conversation
    _send_while_loading(qtbot, window, "Will you answer?")
    with qtbot.waitSignal(bridge.modelLoadFailed, timeout=5000):
        load.gate.set()
    assert view.composer.toPlainText() == "Will you answer?"
    assert not view.composer.isReadOnly() and view.send_button.isEnabled()
    assert view.pending_note.isVisible() and not view.pending_note.cancel_button.isVisible()
    assert view.pending_note.text() == (
        "Not sent: broken did not load (broken: config.json is not valid JSON). Your "
        "message is still here: load a model from the model picker, then send it again.")
    [(title, text)] = captured_errors
    assert title == "Could not load the model" and "config.json is not valid JSON" in text
    assert store.list_chats() == []
    # The user loads another model; the note goes with the new load, the message stays.
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        window.load_model("good")
    assert not view.pending_note.isVisible()
    with qtbot.waitSignal(window.controller.turnFinished, timeout=5000):
        qtbot.mouseClick(view.send_button, Qt.MouseButton.LeftButton)
    assert branch(window)[0] == ("user", "Will you answer?")


def test_dont_send_takes_the_message_back(qtbot, make_window, fake_engine, store):
    window, bridge, load = _window(qtbot, make_window, fake_engine, "model.gguf")
    view = window.conversation
    _send_while_loading(qtbot, window, "Never mind")
    qtbot.mouseClick(view.pending_note.cancel_button, Qt.MouseButton.LeftButton)
    assert not view.pending_note.isVisible() and not view.composer.isReadOnly()
    _send_while_loading(qtbot, window, "Never mind")
    assert window.controller.pending.waiting
    qtbot.keyClick(window, Qt.Key.Key_Escape)  # Esc takes it back as well
    assert not window.controller.pending.waiting and not view.composer.isReadOnly()
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        load.gate.set()
    qtbot.wait(50)
    assert load.workers[0].submitted == [] and store.list_chats() == []
    assert view.composer.toPlainText() == "Never mind"


def test_a_model_loading_for_real(qtbot, make_window, store, tiny_model_path):
    from engine import LLM
    from tests.desktop_app.test_main_window import TURN_TIMEOUT_MS, settings

    bridge = EngineBridge(llm_factory=lambda source, config=None, progress=None: LLM(
        source, num_gpu_blocks=64, progress=progress))
    window = make_window(bridge, settings(max_tokens=8))
    notes, ends = [], []
    bridge.loadProgress.connect(lambda *_: notes.append(window.conversation.pending_note.text()))
    bridge.modelLoadFailed.connect(lambda source, message: ends.append(message))
    window.controller.turnFinished.connect(lambda chat_id: ends.append("finished"))
    window.load_model(str(tiny_model_path))
    _send_while_loading(qtbot, window, "What is the capital of France?")
    assert window.controller.pending.waiting
    qtbot.waitUntil(lambda: bool(ends), timeout=TURN_TIMEOUT_MS)
    assert ends == ["finished"]
    # The loader's stages in plain steps, one percentage for the whole load up to "Ready".
    assert notes[0].startswith("Reading the model file… 0%. ")
    assert any(n.startswith("Loading the model into memory… 85%. ") for n in notes)
    assert notes[-1] == "Almost ready… 100%. Your message is sent as soon as it is ready."
    user, reply = store.path_to(store.active_leaf(window.controller.chat_id))
    assert user.content == "What is the capital of France?" and reply.token_ids
    bridge.shutdown()
