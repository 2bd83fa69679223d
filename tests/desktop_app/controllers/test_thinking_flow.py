"""Reasoning output in the real window, on a tiny model with a Qwen 3-style thinking
template whose replies a test scripts: the thinking streams into a "Thinking" section
above the answer, folds once the answer comes, with its tokens and time on its header and
the metrics line; the copy button and the stored answer leave it out, the store and the
exports keep it apart; the template's dropping of earlier thinking is followed and its
cost said; the per-chat Think switch reaches the template; candidates each show their
own; a model without reasoning shows neither section nor switch."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from tests.desktop_app.controllers.test_json_mode_flow import send
from tests.engine.text.reasoning.thinking_models import save_thinking_model
from tests.engine.tools.tool_models import scripted

THOUGHT = "The user greets me. I greet back."
ANSWER = "Hello! How can I help?"
REPLY = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"


@pytest.fixture(scope="module")
def thinking_llm(tmp_path_factory):
    from engine import LLM

    llm = LLM(str(save_thinking_model(tmp_path_factory.mktemp("think") / "model")),
              num_gpu_blocks=256, max_model_len=2048)
    sampler = scripted(llm)
    sampler.script = llm.tokenizer.encode(REPLY, add_special_tokens=False)
    return llm


@pytest.fixture
def thinking_bridge(qtbot, thinking_llm):
    from desktop_app.services.engine_bridge import EngineBridge

    bridge = EngineBridge(llm_factory=lambda source, config=None, progress=None: thinking_llm)
    with qtbot.waitSignal(bridge.modelLoaded, timeout=30000):
        bridge.load_model("thinking")
    prompts = []
    submit = bridge.submit

    def recording(prompt, params):
        prompts.append(prompt)
        return submit(prompt, params)

    bridge.submit = recording
    bridge.sent_prompts = prompts
    yield bridge
    bridge.shutdown()


def last_reply(window):
    controller = window.controller
    leaf = window.store.active_leaf(controller.chat_id)
    return window.store.get_message(leaf), window.conversation.widget_for(leaf)


def prompt_text(bridge, prompt) -> str:
    """The ids the engine ran for a turn (the prompt the app's planner built), as text."""
    return bridge.tokenizer.decode(prompt.ids, skip_special_tokens=False)


def test_thinking_folds_above_the_answer_and_stays_out_of_it(qtbot, thinking_bridge,
                                                             make_window):
    window = make_window(thinking_bridge)
    send(qtbot, window, "Hi there")
    message, widget = last_reply(window)
    assert (message.content, message.thinking) == (ANSWER, THOUGHT)
    assert message.metrics["thinking_tokens"] > 0
    section = widget.findChild(type(widget.thinking), "thinkingSection")
    assert section.isVisible() and not section.is_open
    toggle = section.findChild(type(section.toggle), "thinkingToggle")
    assert toggle.text().startswith("Thought for") and "tokens" in toggle.text()
    assert "thinking" in widget.metrics_label.text()
    qtbot.mouseClick(toggle, Qt.MouseButton.LeftButton)
    assert section.is_open and section.text() == THOUGHT
    assert widget.text() == ANSWER
    qtbot.mouseClick(widget.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == ANSWER
    markdown = window.store.export_markdown(window.controller.chat_id)
    answer_part = markdown.split("</details>")[-1]
    assert THOUGHT in markdown and THOUGHT not in answer_part and ANSWER in answer_part
    window.controller.render()  # from the store again: still apart
    _, widget = last_reply(window)
    assert not widget.thinking.isHidden() and widget.thinking.text() == THOUGHT


def test_earlier_thinking_is_dropped_as_the_template_does_and_its_cost_said(
        qtbot, thinking_bridge, make_window):
    window = make_window(thinking_bridge)
    send(qtbot, window, "Hi there")
    send(qtbot, window, "And again")
    second = prompt_text(thinking_bridge, thinking_bridge.sent_prompts[-1])
    assert THOUGHT not in second and ANSWER in second
    message, widget = last_reply(window)
    assert message.metrics["thinking_dropped_tokens"] > 0
    assert "recomputed" in widget.metrics_label.text()


def test_the_think_switch_reaches_the_template(qtbot, thinking_bridge, make_window):
    window = make_window(thinking_bridge)
    send(qtbot, window, "Hi there")
    button = window.findChild(type(window.conversation.think_button), "thinkButton")
    assert button.isVisible() and button.isChecked()
    last = prompt_text(thinking_bridge, thinking_bridge.sent_prompts[-1])
    assert not last.endswith("</think>\n\n")
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert not window.store.get_chat(window.controller.chat_id).settings.think
    send(qtbot, window, "Quick, please")
    assert prompt_text(thinking_bridge, thinking_bridge.sent_prompts[-1]).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_candidates_each_show_their_own_thinking(qtbot, thinking_bridge, make_window):
    from dataclasses import replace

    window = make_window(thinking_bridge)
    send(qtbot, window, "Hi there")
    chat_id = window.controller.chat_id
    settings = window.store.get_chat(chat_id).settings
    window.store.update_chat_settings(chat_id, replace(settings, num_candidates=2))
    send(qtbot, window, "Two answers")
    group = window.conversation.rows()[-1]
    assert len(group.columns) == 2
    for column in group.columns:
        assert not column.thinking.isHidden() and column.thinking.text() == THOUGHT
        assert column.text() == ANSWER
        assert window.store.get_message(column.message_id).thinking == THOUGHT


def test_a_model_without_reasoning_shows_no_section_and_no_switch(qtbot, fake_bridge,
                                                                  make_window):
    window = make_window(fake_bridge)
    send(qtbot, window, "hello")
    _, widget = last_reply(window)
    assert widget.thinking.isHidden()
    assert not window.conversation.think_button.isVisible()


def test_a_harmony_reply_shows_its_analysis_as_thinking(qtbot, make_window, tmp_path):
    from desktop_app.services.engine_bridge import EngineBridge
    from engine import LLM
    from tests.engine.text.reasoning.thinking_models import save_harmony_model

    llm = LLM(str(save_harmony_model(tmp_path / "harmony")), num_gpu_blocks=128,
              max_model_len=1024)
    scripted(llm).script = llm.tokenizer.encode(
        f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final"
        f"<|message|>{ANSWER}", add_special_tokens=False)
    bridge = EngineBridge(llm_factory=lambda source, config=None, progress=None: llm)
    with qtbot.waitSignal(bridge.modelLoaded, timeout=30000):
        bridge.load_model("harmony")
    try:
        window = make_window(bridge)
        send(qtbot, window, "Hi there")
        message, widget = last_reply(window)
        assert (message.content, message.thinking) == (ANSWER, THOUGHT)
        assert widget.text() == ANSWER and widget.thinking.text() == THOUGHT
        assert not window.conversation.think_button.isVisible()  # no switch in its template
    finally:
        bridge.shutdown()


def test_the_reasoning_effort_box_reaches_the_template_and_stays_with_the_chat(
        qtbot, make_window, tmp_path):
    """A template that reads reasoning_effort (the engine's harmony format, gpt-oss's):
    the composer's effort box shows (the Think switch does not: harmony has none), each
    turn's prompt carries the chat's level (the template's medium until one is chosen),
    the choice is stored with the chat and shown again when the chat is reopened."""
    from desktop_app.services.engine_bridge import EngineBridge
    from desktop_app.widgets.effort_box import ReasoningEffortBox
    from engine import LLM
    from tests.engine.text.reasoning.thinking_models import save_harmony_format_model

    path = save_harmony_format_model(tmp_path / "gpt-oss")
    llm = LLM(str(path), num_gpu_blocks=128, max_model_len=1024)
    scripted(llm).script = llm.tokenizer.encode(f"<|channel|>final<|message|>{ANSWER}",
                                                add_special_tokens=False)
    bridge = EngineBridge(llm_factory=lambda source, config=None, progress=None: llm)
    with qtbot.waitSignal(bridge.modelLoaded, timeout=30000):
        bridge.load_model("gpt-oss")
    prompts = []
    submit = bridge.submit
    bridge.submit = lambda prompt, params: prompts.append(prompt) or submit(prompt, params)

    def rendered(prompt) -> str:  # the ids the app's planner built, as text
        return llm.tokenizer.decode(prompt.ids, skip_special_tokens=False)

    try:
        window = make_window(bridge)
        send(qtbot, window, "Hi there")
        box = window.findChild(ReasoningEffortBox, "reasoningEffortBox")
        assert box.isVisible() and box.effort() is None
        assert not window.conversation.think_button.isVisible()
        assert "Reasoning: medium" in rendered(prompts[-1])
        chat_id = window.controller.chat_id
        high = box.findData("high")
        box.setCurrentIndex(high)
        box.activated.emit(high)  # as a user's pick
        assert window.store.get_chat(chat_id).settings.reasoning_effort == "high"
        send(qtbot, window, "Think hard")
        assert "Reasoning: high" in rendered(prompts[-1])
        window.controller.open_chat(window.controller.new_chat())
        assert box.isVisible() and box.effort() is None  # a new chat: the default
        window.controller.open_chat(chat_id)
        assert box.effort() == "high"
    finally:
        bridge.shutdown()


def test_a_template_without_the_setting_shows_no_effort_box(qtbot, thinking_bridge,
                                                            make_window):
    window = make_window(thinking_bridge)
    send(qtbot, window, "Hi there")
    assert window.conversation.think_button.isVisible()
    assert not window.conversation.effort_box.isVisible()
