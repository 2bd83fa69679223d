"""A reply bubble fed a scripted thinking stream cut at every offset shows what the
one-piece reply shows: the same thinking in its section, the same answer below it; the
section is open while the thinking streams, folds when the answer starts, and says the
thinking's tokens and time once finished."""

from __future__ import annotations

from desktop_app.data.chat_schema import Message
from desktop_app.widgets.message_widget import MessageWidget, TurnItem
from desktop_app.widgets.thinking_section import thinking_summary
from engine.outputs import Thinking
from engine.text.reasoning import ThinkParser
from tests.desktop_app.data.test_metric_values import NAN, bad_metrics, shows_no_bad_number

REPLY = "<think>\nFirst **this**, then that.\n</think>\n\nThe answer is `42`."
METRICS = {"thinking_tokens": 12, "thinking_s": 1.25}


def bubble(qtbot) -> MessageWidget:
    widget = MessageWidget(TurnItem(Message(1, 1, None, "assistant", "", None,
                                            status="streaming")))
    qtbot.addWidget(widget)
    return widget


def stream(qtbot, cuts: list[int]) -> MessageWidget:
    widget, parser, start = bubble(qtbot), ThinkParser(), 0
    for cut in [*cuts, len(REPLY)]:
        for event in parser.feed(REPLY[start:cut]):
            if isinstance(event, Thinking):
                widget.append_thinking(event.text)
            else:
                widget.append(event.text)
        start = cut
    assert not parser.finish()
    return widget


def shown(widget: MessageWidget) -> tuple[str, str]:
    return widget.thinking.text(), widget.text()


def test_every_cut_renders_as_the_one_piece_reply(qtbot):
    whole = shown(stream(qtbot, []))
    assert whole == ("First **this**, then that.", "The answer is `42`.")
    for cut in range(len(REPLY) + 1):
        assert shown(stream(qtbot, [cut])) == whole, cut
    assert shown(stream(qtbot, list(range(len(REPLY))))) == whole


def test_open_while_thinking_folded_with_its_summary_after(qtbot):
    widget = bubble(qtbot)
    assert widget.thinking.isHidden()
    widget.append_thinking("Let me see")
    assert not widget.thinking.isHidden() and widget.thinking.is_open
    widget.append("Yes.")
    assert not widget.thinking.is_open
    widget.finish("Yes.", METRICS, "complete", "Let me see")
    assert widget.thinking.toggle.text() == thinking_summary(METRICS)
    assert thinking_summary(METRICS) == "Thought for 1.2 s · 12 tokens"
    widget.thinking.toggle.click()
    assert widget.thinking.is_open and not widget.thinking.body.isHidden()


def test_the_summary_shows_any_stored_metrics_sanely():
    for metrics in bad_metrics():
        assert shows_no_bad_number(thinking_summary(metrics)), metrics
    assert thinking_summary({"thinking_tokens": "12", "thinking_s": 1.0}) == ""
    assert thinking_summary({"thinking_tokens": 12, "thinking_s": NAN}) == "Thought · 12 tokens"
    assert thinking_summary({"thinking_tokens": 12.0, "thinking_s": -1}) == "Thought · 12 tokens"
    assert thinking_summary([METRICS]) == ""


def test_a_reply_with_any_stored_metrics_is_shown(qtbot):
    for metrics in bad_metrics():
        widget = MessageWidget(TurnItem(Message(1, 1, None, "assistant", "Yes.", None,
                                                metrics, thinking="Hm.")))
        qtbot.addWidget(widget)
        assert shows_no_bad_number(widget.metrics_label.text())
        assert shows_no_bad_number(widget.thinking.toggle.text())
