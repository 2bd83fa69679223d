""""Continue" on a cut-off reply, through the real window: the starter model extends the
same message in place from its cached prompt, a reply cut off inside its thinking goes on
thinking, and the button shows only where a reply can be continued."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from desktop_app.controllers.chat_session import NO_CONTINUE_REMOTE
from desktop_app.data.settings import AppSettings, ChatSettings
from desktop_app.widgets.message_widget import MessageWidget
from tests.engine.text.reasoning.thinking_models import save_thinking_model
from tests.engine.tools.tool_models import scripted

TURN_TIMEOUT_MS = 90_000
BLOCK = 16  # the small_llm fixture's block size


def greedy(max_tokens: int | None) -> AppSettings:
    return AppSettings(chat_defaults=ChatSettings(
        max_tokens=max_tokens, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0,
        repetition_penalty=1.0))


def send(qtbot, window, text: str) -> None:
    window.conversation.composer.setPlainText(text)
    with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS):
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)


def test_continue_extends_the_cut_off_reply_in_place(qtbot, small_bridge, make_window,
                                                      captured_errors):
    window = make_window(small_bridge, greedy(8))
    send(qtbot, window, "Write a long poem about the sea and its old ships.")
    store, chat_id = window.store, window.controller.chat_id
    before = store.get_message(store.active_leaf(chat_id))
    assert before.role == "assistant" and before.metrics["finish_reason"] == "length"
    assert len(before.token_ids) == 8
    bubble = window.conversation.widget_for(before.id)
    assert bubble.continue_button.isVisible()

    with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS):
        qtbot.mouseClick(bubble.continue_button, Qt.MouseButton.LeftButton)

    assert not captured_errors
    assert store.active_leaf(chat_id) == before.id  # the same message, no new one
    after = store.get_message(before.id)
    assert after.token_ids[:8] == before.token_ids and len(after.token_ids) == 16
    assert after.content.startswith(before.content) and len(after.content) > len(
        before.content)
    assert after.metrics["finish_reason"] == "length"
    assert after.metrics["continued_tokens"] == 8
    # Its prompt was the first prompt and the reply so far, found in the prefix cache.
    prompt = before.metrics["num_prompt_tokens"] + 8
    assert after.metrics["num_prompt_tokens"] == prompt
    assert after.metrics["num_cached_tokens"] >= prompt - BLOCK
    bubble = window.conversation.widget_for(before.id)
    assert bubble.text() == after.content
    assert "continued after 8 tokens" in bubble.metrics_label.text()
    assert bubble.continue_button.isVisible()  # cut off again: it can go on
    # The gauge counts the continued reply once.
    assert window.conversation.context_gauge.value() == prompt + 8


def open_chat(qtbot, window, chat_id: int) -> dict[int, MessageWidget]:
    """The chat's bubbles by message id, once shown (rows added to a window on screen
    are shown on the next turn of the event loop)."""
    window.controller.open_chat(chat_id)
    bubbles = {w.message_id: w for w in window.conversation.rows()
               if isinstance(w, MessageWidget)}
    qtbot.waitUntil(lambda: all(b.isVisible() for b in bubbles.values()))
    return bubbles


def test_continue_shows_only_under_the_last_cut_off_reply(qtbot, fake_bridge, make_window,
                                                         captured_errors):
    window = make_window(fake_bridge)
    store = window.store
    chat = store.create_chat("c", ChatSettings())
    user = store.add_message(chat.id, None, "user", "Hi")
    cut = store.add_message(chat.id, user.id, "assistant", "Once upon",
                            metrics={"finish_reason": "length"})
    again = store.add_message(chat.id, cut.id, "user", "Go on")
    done = store.add_message(chat.id, again.id, "assistant", "The end.",
                             metrics={"finish_reason": "stop"})
    bubbles = open_chat(qtbot, window, chat.id)

    def shown(message_id: int) -> bool:
        return bubbles[message_id].continue_button.isVisible()

    assert not shown(cut.id)  # later turns answered it as it was
    assert not shown(done.id)  # complete
    assert not shown(user.id)

    stopped = store.add_message(chat.id, again.id, "assistant", "Half a",
                                metrics={"finish_reason": "abort"})
    store.set_active_leaf(chat.id, stopped.id)
    bubbles = open_chat(qtbot, window, chat.id)
    bubble = bubbles[stopped.id]
    assert shown(stopped.id)  # stopped with Stop: it can go on
    # A model without the engine's prompt builder (a server) cannot continue: said so.
    qtbot.mouseClick(bubble.continue_button, Qt.MouseButton.LeftButton)
    assert captured_errors == [("Could not continue the reply", NO_CONTINUE_REMOTE)]
    assert store.get_message(stopped.id).content == "Half a"
    # Another model's reply: its ids are not this model's, so it is not continued.
    other = store.add_message(chat.id, again.id, "assistant", "Half b", model="other-model",
                              metrics={"finish_reason": "length"})
    store.set_active_leaf(chat.id, other.id)
    bubbles = open_chat(qtbot, window, chat.id)
    qtbot.mouseClick(bubbles[other.id].continue_button, Qt.MouseButton.LeftButton)
    assert "written by other-model" in captured_errors[-1][1]


def test_a_continuation_that_fails_leaves_the_reply_as_it_was(store):
    from desktop_app.controllers.stream import Stream
    from engine.outputs import TextDelta

    chat = store.create_chat("c", ChatSettings())
    user = store.add_message(chat.id, None, "user", "Hi")
    reply = store.add_message(chat.id, user.id, "assistant", "Once upon", [5, 6],
                              metrics={"finish_reason": "length", "num_prompt_tokens": 9})
    stream = Stream.continuing("r", store.get_message(reply.id), 11, {})
    stream.add(0, (TextDelta(" a time"),))
    assert stream.live() == {reply.id: ("Once upon a time", "")}
    stream.last_saved = 0.0
    stream.save_partial(store)
    assert stream.fail(store, "the engine stopped")
    kept = store.get_message(reply.id)
    assert (kept.content, kept.token_ids, kept.metrics, kept.status) == (
        "Once upon", [5, 6], {"finish_reason": "length", "num_prompt_tokens": 9}, "complete")


THOUGHT = "The user greets me. I greet back."
ANSWER = "Hello! How can I help?"
SCRIPT = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"
CUT = 24  # tokens of the first part: the opening tag and the start of the thinking


@pytest.fixture
def thinking_bridge(qtbot, tmp_path):
    from desktop_app.services.engine_bridge import EngineBridge
    from engine import LLM

    llm = LLM(str(save_thinking_model(tmp_path / "think")), num_gpu_blocks=64,
              max_model_len=512)
    bridge = EngineBridge(llm_factory=lambda source, config=None, progress=None: llm)
    with qtbot.waitSignal(bridge.modelLoaded, timeout=30000):
        bridge.load_model("thinking")
    bridge.sampler = scripted(llm)
    yield bridge
    bridge.shutdown()


def test_a_reply_cut_off_inside_its_thinking_goes_on_thinking(qtbot, thinking_bridge,
                                                              make_window, captured_errors):
    script = thinking_bridge.tokenizer.encode(SCRIPT, add_special_tokens=False)
    thinking_bridge.sampler.script = script
    window = make_window(thinking_bridge, greedy(CUT))
    send(qtbot, window, "Hi there")
    store, chat_id = window.store, window.controller.chat_id
    before = store.get_message(store.active_leaf(chat_id))
    assert before.content == "" and before.thinking and THOUGHT.startswith(before.thinking)
    assert before.metrics["finish_reason"] == "length"
    # The model goes on with the rest; the chat now lets it run to the end.
    thinking_bridge.sampler.script = script[CUT:]
    chat = store.get_chat(chat_id)
    chat.settings.max_tokens = None
    store.update_chat_settings(chat_id, chat.settings)
    bubble = window.conversation.widget_for(before.id)
    with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS):
        qtbot.mouseClick(bubble.continue_button, Qt.MouseButton.LeftButton)
    assert not captured_errors
    after = store.get_message(before.id)
    assert (after.thinking, after.content) == (THOUGHT, ANSWER)
    assert after.token_ids[:-1] == script  # then the end of its turn
    assert after.metrics["finish_reason"] == "stop"
    assert after.metrics["thinking_tokens"] > before.metrics["thinking_tokens"] > 0
    bubble = window.conversation.widget_for(before.id)
    assert bubble.text() == ANSWER and bubble.thinking.text() == THOUGHT
    assert not bubble.continue_button.isVisible()  # complete now
