"""Markdown rendering: Qt's parser, our code-block boxes, throttled streaming updates."""

from __future__ import annotations

from PySide6.QtGui import QTextDocument, QTextFormat

from desktop_app.widgets.markdown import MarkdownLabel, markdown_to_html, render_document


def _tables(doc: QTextDocument) -> list:
    frames = doc.rootFrame().childFrames()
    return [f for f in frames if f.format().isTableFormat()]


def test_fenced_code_becomes_one_monospace_box(qapp):
    doc = render_document("Intro\n\n```python\nprint(1)\nx = 2\n```\n\nAfter", "#123456")
    [table] = _tables(doc)
    cell = table.cellAt(0, 0)
    cursor = cell.firstCursorPosition()
    cursor.setPosition(cell.lastCursorPosition().position(), cursor.MoveMode.KeepAnchor)
    assert cursor.selectedText().replace("\u2029", "\n") == "print(1)\nx = 2"
    assert cell.firstCursorPosition().charFormat().fontFixedPitch()
    assert table.format().background().color().name() == "#123456"
    assert doc.toPlainText().split("\n")[0] == "Intro"
    assert doc.toPlainText().split("\n")[-1] == "After"
    # No code-fence blocks are left outside the box.
    block = doc.begin()
    while block.isValid():
        if block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence):
            assert table.firstPosition() <= block.position() <= table.lastPosition()
        block = block.next()


def test_indented_code_and_two_blocks_get_boxes(qapp):
    doc = render_document("a\n\n    indented\n\nb\n\n```\nfenced\n```\n")
    assert len(_tables(doc)) == 2


def test_inline_code_is_monospace_and_tinted(qapp):
    html = markdown_to_html("use `ls -l` now", "#abcdef")
    assert "background-color:#abcdef" in html
    assert "ls -l" in html
    assert "<body>" in html  # the document's own font is dropped


def test_markdown_label_throttles_streaming(qtbot):
    label = MarkdownLabel("")
    qtbot.addWidget(label)
    label.append("**bo")
    label.append("ld**")
    assert label.text() == ""  # not rendered yet: one render per interval
    assert label.markdown() == "**bold**"
    qtbot.waitUntil(lambda: "font-weight:700" in label.text(), timeout=1000)
    label.append(" more")
    label.flush()
    assert "more" in label.text()
    label.set_markdown("plain")
    assert label.markdown() == "plain"
    assert "plain" in label.text()
