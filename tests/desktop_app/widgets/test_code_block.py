"""Replies as segments: fenced code blocks highlighted by Pygments, each with its own copy
button, scrolling sideways; inline code tinted; streaming renders an open fence as code."""

from __future__ import annotations

import pytest
from pygments.styles import get_style_by_name
from pygments.token import Keyword, Name, String
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QToolButton

from desktop_app.widgets import code_block, theme
from desktop_app.widgets.code_block import CodeBlock, style_name
from desktop_app.widgets.markdown import MarkdownView, Segment, split_segments

CODE = 'def greet(name):\n    return f"Hello, {name}"\n\nprint(greet("Folio"))'
REPLY = f"Here is `greet`:\n\n```python\n{CODE}\n```\n\nCall it with a **name**."


def _color(style: str, token) -> str:
    return "#" + get_style_by_name(style).style_for_token(token)["color"].lower()


def test_split_segments_cuts_at_fences():
    assert split_segments(REPLY) == [
        Segment("text", "Here is `greet`:\n"),
        Segment("code", CODE, "python"),
        Segment("text", "\nCall it with a **name**."),
    ]
    # Tildes, a longer closing fence, an indented fence, the info string's first word.
    assert split_segments("~~~ js title=a.js\nx()\n~~~~\n") == [Segment("code", "x()", "js")]
    assert split_segments("  ```\n  a\n b\n  ```") == [Segment("code", "a\nb")]
    # Not fences: four spaces of indent, backticks in a backtick info string, two ticks.
    for text in ("    ```\n    x\n", "```a`b\nx", "``\nx\n``"):
        assert [s.kind for s in split_segments(text)] == ["text"]
    # A fence left open runs to the end (a reply still streaming).
    assert split_segments("Look:\n```py\nx = 1\ny") == [
        Segment("text", "Look:"), Segment("code", "x = 1\ny", "py", closed=False)]
    assert split_segments("a\n```\n\n```\n```c\n```") == [
        Segment("text", "a"), Segment("code", ""), Segment("code", "", "c")]


def test_code_block_is_highlighted_and_copies_the_code_alone(qtbot):
    view = MarkdownView(REPLY)
    qtbot.addWidget(view)
    [block] = view.code_blocks()
    assert block.code() == CODE and block.language() == "python"
    html = block.html().lower()
    style = style_name()
    assert style == code_block.LIGHT_STYLE  # the tests run the light theme
    for token in (Keyword, Name.Function, String):
        assert f"color:{_color(style, token)}" in html
    assert "font-weight:700" in html  # the default style's keywords are bold
    assert block.language_label.text() == "python"
    [button] = view.findChildren(QToolButton, "codeCopyButton")
    assert button is block.copy_button and button.accessibleName() == "Copy code"
    QGuiApplication.clipboard().setText("something else")
    button.click()
    assert QGuiApplication.clipboard().text() == CODE  # no fences, no language tag
    assert button.text() == "Copied"
    assert block.accessibleName() == "Code block, python"
    assert block.view.accessibleName() == "Code"


def test_each_block_has_its_own_copy_button(qtbot):
    view = MarkdownView("```sh\nls -l\n```\nand\n```\nplain text\n```")
    qtbot.addWidget(view)
    buttons = view.findChildren(QToolButton, "codeCopyButton")
    assert len(buttons) == 2
    copied = []
    for button in buttons:
        button.click()
        copied.append(QGuiApplication.clipboard().text())
    assert sorted(copied) == ["ls -l", "plain text"]
    unlabeled = view.code_blocks()[1]
    assert unlabeled.language_label.text() == "text"
    assert unlabeled.accessibleName() == "Code block"


def test_unknown_language_is_plain_text_and_keeps_the_code(qtbot):
    block = CodeBlock("\n  weird <stuff> \t\n\n", "no-such-language")
    qtbot.addWidget(block)
    assert block.view.toPlainText() == "\n  weird <stuff> \t\n\n"


def test_dark_theme_uses_the_dark_style(qtbot, monkeypatch):
    monkeypatch.setattr(theme, "_current", theme.DARK)
    assert style_name() == code_block.DARK_STYLE
    block = CodeBlock(CODE, "python")
    qtbot.addWidget(block)
    assert f"color:{_color(code_block.DARK_STYLE, Keyword)}" in block.html().lower()
    assert theme.DARK.code_bg in block.styleSheet()


def test_inline_code_is_monospace_and_tinted(qtbot):
    view = MarkdownView("Run `ls -l` now")
    qtbot.addWidget(view)
    [label] = view.text_labels()
    html = label.text()
    assert f"background-color:{theme.current().code_bg}" in html
    assert theme.monospace_font().family() in html or "monospace" in html
    assert not view.code_blocks()


def test_long_lines_scroll_sideways_instead_of_wrapping(qtbot):
    long_line = "x = [" + ", ".join(str(i) for i in range(200)) + "]"
    view = MarkdownView(f"Long:\n\n```python\n{long_line}\nshort = 1\n```")
    qtbot.addWidget(view)
    view.resize(300, 400)
    view.show()
    qtbot.waitExposed(view)
    [block] = view.code_blocks()
    code = block.view
    qtbot.waitUntil(lambda: code.horizontalScrollBar().maximum() > 0, timeout=2000)
    assert block.width() <= 300
    assert code.verticalScrollBar().maximum() == 0  # as tall as its two lines
    # Two lines, not wrapped: the first block is laid out as a single line.
    first = code.document().firstBlock()
    assert first.layout().lineCount() == 1
    assert code.height() >= code.heightForWidth(code.width())
    assert code.horizontalScrollBar().value() == 0  # shown from the start of the lines


def _stream(view: MarkdownView, text: str, step: int) -> list[list[Segment]]:
    seen = []
    for i in range(0, len(text), step):
        view.append(text[i:i + step])
        view.flush()
        seen.append(view.segments())
    return seen


def _rendering(view: MarkdownView) -> list[tuple[str, str]]:
    out = []
    for widget in view.segment_widgets():
        if isinstance(widget, CodeBlock):
            out.append(("code", widget.html()))
        else:
            out.append(("text", widget.text()))
    return out


@pytest.mark.parametrize("slow_lexer", [False, True])
def test_streaming_renders_an_open_fence_as_code_and_ends_as_one_shot(qtbot, monkeypatch,
                                                                     slow_lexer):
    if slow_lexer:  # every block counts as slow to lex: updates are deferred while streaming
        monkeypatch.setattr(CodeBlock, "FAST_LEX_S", -1.0)
        monkeypatch.setattr(CodeBlock, "MAX_DEFER_MS", 30)
    view = MarkdownView("")
    qtbot.addWidget(view)
    open_part = REPLY[:REPLY.index('print(greet("Folio"))')]
    seen = _stream(view, open_part, 7)
    assert seen[-1][-1] == Segment("code", open_part.split("```python\n")[1], "python",
                                   closed=False)
    [block] = view.code_blocks()
    assert block.code() == 'def greet(name):\n    return f"Hello, {name}"\n\n'
    if slow_lexer:
        qtbot.waitUntil(lambda: block._tokens_code == block.code(), timeout=2000)
    assert f"color:{_color(style_name(), Keyword)}" in block.html().lower()
    _stream(view, REPLY[len(open_part):], 5)
    assert view.code_blocks() == [block]  # the same widget grew: no re-creation
    view.set_markdown(REPLY)  # the finished reply, as MessageWidget.finish does
    one_shot = MarkdownView(REPLY)
    qtbot.addWidget(one_shot)
    assert view.segments() == one_shot.segments()
    assert _rendering(view) == _rendering(one_shot)


def test_streaming_text_only_touches_the_last_segment(qtbot):
    view = MarkdownView("Intro\n\n```c\nint x;\n```\n\nMore")
    qtbot.addWidget(view)
    first, block, _ = view.segment_widgets()
    view.append(" and more")
    view.flush()
    assert view.segment_widgets()[:2] == [first, block]
    assert view.segments()[-1].text.endswith("More and more")


def test_markdown_view_throttles_streaming(qtbot):
    view = MarkdownView("")
    qtbot.addWidget(view)
    view.append("**bo")
    view.append("ld**")
    assert view.segments() == []  # not rendered yet: one render per interval
    assert view.markdown() == "**bold**"
    qtbot.waitUntil(lambda: view.segments() == [Segment("text", "**bold**")], timeout=1000)
    assert "font-weight:700" in view.text_labels()[0].text()


def test_a_theme_switch_recolors_blocks_and_inline_code(qtbot, qapp, monkeypatch):
    view = MarkdownView(REPLY)
    qtbot.addWidget(view)
    [block], [label, _] = view.code_blocks(), view.text_labels()
    assert f"color:{_color(code_block.LIGHT_STYLE, Keyword)}" in block.html().lower()
    try:
        monkeypatch.setenv("FOLIO_THEME", "dark")
        theme.apply_theme(qapp)
        qapp.processEvents()
        assert f"color:{_color(code_block.DARK_STYLE, Keyword)}" in block.html().lower()
        assert f"background-color:{theme.DARK.code_bg}" in label.text()
        assert block.code() == CODE
    finally:
        monkeypatch.setenv("FOLIO_THEME", "light")
        theme.apply_theme(qapp)
    qapp.processEvents()
    assert f"color:{_color(code_block.LIGHT_STYLE, Keyword)}" in block.html().lower()


def test_only_sideways_wheels_scroll_the_code(qtbot, qapp):
    """Up and down wheels are left to the conversation (Qt hands an ignored wheel event
    on to the parent widgets); sideways ones scroll the code."""
    from PySide6.QtCore import QPoint, QPointF, Qt
    from PySide6.QtGui import QWheelEvent

    block = CodeBlock("x = [" + ", ".join(map(str, range(100))) + "]\ny = 2", "python")
    qtbot.addWidget(block)
    block.resize(250, 200)
    block.show()
    qtbot.waitExposed(block)
    hbar = block.view.horizontalScrollBar()
    qtbot.waitUntil(lambda: hbar.maximum() > 0, timeout=2000)
    target = block.view.viewport()

    def wheel(dx: int, dy: int) -> QWheelEvent:
        event = QWheelEvent(QPointF(target.rect().center()), QPointF(0, 0), QPoint(0, 0),
                            QPoint(dx, dy), Qt.MouseButton.NoButton,
                            Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase,
                            False)
        qapp.sendEvent(target, event)
        return event

    assert not wheel(0, -120).isAccepted()
    assert hbar.value() == 0
    assert wheel(-120, 0).isAccepted()
    assert hbar.value() > 0
