"""Context overflow end to end: the starter model with its context capped at 256 tokens, a
12-turn chat under each overflow policy, the context gauge, and the "Context full" note."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from desktop_app.data.context_policy import KEEP_LATEST, STOP, TRUNCATE_MIDDLE
from desktop_app.data.settings import AppSettings, ChatSettings

CONTEXT = 256  # the small_llm fixture's max_model_len
TURNS = 12
TURN_TIMEOUT_MS = 90_000
SYSTEM = "You are a terse assistant. Answer in one short sentence."


def app_settings(**chat) -> AppSettings:
    values = dict(max_tokens=16, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0,
                  repetition_penalty=1.0)
    values.update(chat)
    return AppSettings(chat_defaults=ChatSettings(**values))


def spy_submit(bridge) -> list:
    """The messages of every request the worker receives (the app sends the prompt its
    planner built: the messages it was built from)."""
    sent: list = []
    worker = bridge.worker
    real = worker.submit

    def submit(prompt, params, on_event):
        sent.append(list(prompt.request.messages))
        return real(prompt, params, on_event)

    worker.submit = submit
    return sent


def question(k: int) -> str:
    return f"Question {k}: name one fact about the number {k}."


def send(qtbot, window, text: str) -> None:
    window.conversation.composer.setPlainText(text)
    with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS):
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)


def set_chat_settings(qtbot, window, policy: str) -> None:
    """Through the settings dialog, as a user would: the system prompt and the policy."""
    dialog = window.open_settings()
    form = dialog.chat_form
    form.system_prompt.setPlainText(SYSTEM)
    combo = form.findChild(type(form.overflow_policy), "overflowPolicy")
    assert combo is form.overflow_policy
    combo.setCurrentIndex(combo.findData(policy))
    dialog.accept()
    chat = window.store.get_chat(window.controller.chat_id)
    assert chat.settings.system_prompt == SYSTEM
    assert chat.settings.overflow_policy == policy


def stored(window) -> list:
    store = window.store
    return store.path_to(store.active_leaf(window.controller.chat_id))


def check_gauge_reads_the_engine(window) -> None:
    reply = stored(window)[-1]
    gauge = window.conversation.context_gauge
    engine_count = reply.metrics["num_prompt_tokens"] + len(reply.token_ids)
    assert gauge.maximum() == CONTEXT
    assert gauge.value() == min(engine_count, CONTEXT)
    assert gauge.text() == f"{engine_count:,} / {CONTEXT} tokens"
    assert gauge.property("nearFull") is (engine_count >= 0.85 * CONTEXT)


def check_whole_messages(sent: list[dict], path) -> None:
    """Every message sent is a stored message, whole, in order (system prompt first)."""
    assert sent[0] == {"role": "system", "content": SYSTEM}
    stored_messages = [(m.role, m.content) for m in path]
    positions = [stored_messages.index((m["role"], m["content"])) for m in sent[1:]]
    assert positions == sorted(positions)
    assert sent[-1]["role"] == "user"
    for m, pos in zip(sent[1:], positions, strict=True):
        if m["role"] == "assistant":
            assert m["token_ids"] == path[pos].token_ids  # exact ids: the prefix cache
            assert sent[sent.index(m) - 1]["role"] == "user"  # never without its question


@pytest.mark.parametrize("policy", [KEEP_LATEST, TRUNCATE_MIDDLE])
def test_a_long_chat_keeps_answering_within_a_small_context(
        qtbot, small_bridge, make_window, captured_errors, policy):
    window = make_window(small_bridge, app_settings())
    window.new_chat()
    set_chat_settings(qtbot, window, policy)
    sent = spy_submit(small_bridge)
    cut_turns = reused_after_cut = 0
    for k in range(TURNS):
        send(qtbot, window, question(k))
        assert captured_errors == []
        path = stored(window)
        assert len(path) == 2 * (k + 1)  # the store holds every turn
        messages = sent[-1]
        check_whole_messages(messages, path[:-1])
        assert messages[-1]["content"] == question(k)
        reply = path[-1]
        # What the app measured is what the engine counted, and it left room for the reply.
        prompt = reply.metrics["num_prompt_tokens"]
        assert prompt == len(small_bridge.tokenizer.encode_chat(messages))
        assert prompt <= CONTEXT - 16
        assert reply.metrics["finish_reason"] in ("stop", "length")
        check_gauge_reads_the_engine(window)
        if len(messages) - 1 < len(path) - 1:
            cut_turns += 1
            previous = sent[-2]
            if len(previous) - 1 < 2 * k - 1 and messages[:len(previous)] == previous:
                # Same cut as the turn before: this prompt extends that one, and the
                # engine's prefix cache serves it (all but the last partial blocks).
                before = path[-3]  # the previous reply
                assert reply.metrics["num_cached_tokens"] >= (
                    before.metrics["num_prompt_tokens"] - 32)
                reused_after_cut += 1
            if policy == TRUNCATE_MIDDLE:
                assert messages[1]["content"] == question(0)  # the first turn stays
                assert messages[2]["role"] == "assistant"
    assert len(sent) == TURNS
    assert cut_turns >= 3  # the chat outgrew the context and kept going
    assert reused_after_cut >= 1  # after a cut, the prefix cache takes over again
    assert len(stored(window)) == 2 * TURNS
    assert small_bridge.kv_stats().num_used == 0


def test_stop_at_the_limit_refuses_the_turn_that_would_overflow(
        qtbot, small_bridge, make_window, captured_errors):
    window = make_window(small_bridge, app_settings())
    window.new_chat()
    set_chat_settings(qtbot, window, STOP)
    sent = spy_submit(small_bridge)
    finished: list[int] = []
    window.controller.turnFinished.connect(finished.append)
    for k in range(TURNS):
        window.conversation.composer.setPlainText(question(k))
        before = len(sent)
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: bool(captured_errors) or len(finished) > k,  # noqa: B023
                        timeout=TURN_TIMEOUT_MS)
        if captured_errors:
            break
        messages = sent[-1]
        assert len(messages) == 1 + 2 * k + 1  # everything, never cut
        check_gauge_reads_the_engine(window)
    else:
        pytest.fail("the chat never reached the context limit")
    assert k >= 2
    [(title, text)] = captured_errors
    assert title == "Context full"
    assert "Context full" in text and "Start a new chat" in text
    assert len(sent) == before  # nothing sent
    assert len(stored(window)) == 2 * k  # nothing stored
    assert window.conversation.composer.toPlainText() == question(k)  # the draft is kept
    assert not window.controller.generating
    # The gauge shows how full it is, the draft included, in amber.
    gauge = window.conversation.context_gauge
    qtbot.waitUntil(lambda: "of your draft" in gauge.toolTip())
    assert gauge.property("nearFull") is True
