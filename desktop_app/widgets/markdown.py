"""Markdown to rich-text HTML for QLabel / QTextBrowser, with boxed monospace code blocks.

Qt's own CommonMark/GitHub importer (QTextDocument.setMarkdown) does the parsing; we only
restyle what it produced: each run of fenced or indented code lines becomes a one-cell
table (padding and a background, which plain blocks cannot have) in the fixed-pitch font,
and inline code gets the same font and a tint.
"""

from __future__ import annotations

import re

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import (
    QColor,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
    QTextLength,
    QTextTableFormat,
)
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

from desktop_app.widgets import theme

_BODY_STYLE = re.compile(r"<body style=\"[^\"]*\">")


def markdown_to_html(text: str, code_background: str | None = None) -> str:
    """Render Markdown `text` as Qt rich-text HTML; the label's own font is kept."""
    doc = render_document(text, code_background)
    # The exported body pins the document's default font; drop it so the widget's
    # font (and the user's font size) applies.
    return _BODY_STYLE.sub("<body>", doc.toHtml(), count=1)


def render_document(text: str, code_background: str | None = None) -> QTextDocument:
    doc = QTextDocument()
    doc.setMarkdown(text, QTextDocument.MarkdownFeature.MarkdownDialectGitHub)
    background = QColor(code_background or theme.current().code_bg)
    _style_inline_code(doc, background)
    for first, last in reversed(_code_runs(doc)):
        _box_code_run(doc, first, last, background)
    return doc


def _is_code_block(block: QTextBlock) -> bool:
    fmt = block.blockFormat()
    # Fenced blocks carry the fence; indented ones only an (empty) language.
    return fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or fmt.hasProperty(
        QTextFormat.Property.BlockCodeLanguage)


def _code_runs(doc: QTextDocument) -> list[tuple[QTextBlock, QTextBlock]]:
    runs: list[tuple[QTextBlock, QTextBlock]] = []
    block = doc.begin()
    while block.isValid():
        if _is_code_block(block):
            first = last = block
            nxt = block.next()
            while nxt.isValid() and _is_code_block(nxt):
                last = nxt
                nxt = nxt.next()
            runs.append((first, last))
            block = nxt
        else:
            block = block.next()
    return runs


def _box_code_run(doc: QTextDocument, first: QTextBlock, last: QTextBlock,
                  background: QColor) -> None:
    lines = []
    block = first
    while True:
        lines.append(block.text())
        if block == last:
            break
        block = block.next()
    code = "\n".join(lines)

    cursor = QTextCursor(doc)
    cursor.setPosition(first.position())
    cursor.setPosition(last.position() + last.length() - 1, QTextCursor.MoveMode.KeepAnchor)
    cursor.removeSelectedText()
    cursor.setBlockFormat(QTextBlockFormat())

    table_fmt = QTextTableFormat()
    table_fmt.setBorder(0)
    table_fmt.setCellPadding(8)
    table_fmt.setCellSpacing(0)
    table_fmt.setTopMargin(4)
    table_fmt.setBottomMargin(4)
    table_fmt.setBackground(background)
    table_fmt.setWidth(QTextLength(QTextLength.Type.PercentageLength, 100))
    table = cursor.insertTable(1, 1, table_fmt)

    char_fmt = QTextCharFormat()
    char_fmt.setFontFamilies(_mono_families())
    char_fmt.setFontFixedPitch(True)
    block_fmt = QTextBlockFormat()
    # Long lines wrap inside the box instead of widening the whole conversation.
    block_fmt.setNonBreakableLines(False)
    cursor.setBlockFormat(block_fmt)
    cursor.insertText(code, char_fmt)

    # insertTable leaves the emptied block in front of the table: fold it into the
    # previous paragraph so no blank line shows above the box.
    before = QTextCursor(doc)
    before.setPosition(table.firstPosition() - 1)
    empty = before.block()
    if empty.text() == "" and empty.previous().isValid():
        QTextCursor(empty).deletePreviousChar()


def _style_inline_code(doc: QTextDocument, background: QColor) -> None:
    block = doc.begin()
    while block.isValid():
        if not _is_code_block(block):
            it = block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                fmt = fragment.charFormat()
                if "monospace" in (fmt.fontFamilies() or []):
                    cursor = QTextCursor(doc)
                    cursor.setPosition(fragment.position())
                    cursor.setPosition(fragment.position() + fragment.length(),
                                       QTextCursor.MoveMode.KeepAnchor)
                    tint = QTextCharFormat()
                    tint.setBackground(background)
                    tint.setFontFamilies(_mono_families())
                    cursor.mergeCharFormat(tint)
                it += 1
        block = block.next()


def _mono_families() -> list[str]:
    family = theme.monospace_font().family()
    return [family] if family == "monospace" else [family, "monospace"]


class MarkdownLabel(QLabel):
    """A selectable, word-wrapped label showing Markdown.

    While a reply streams, `append()` only marks the text dirty; a single-shot timer
    re-renders at most every RENDER_INTERVAL_MS, so a fast token stream costs one layout
    per interval instead of one per token and the event loop stays responsive.
    """

    RENDER_INTERVAL_MS = 60

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageText")
        self.setWordWrap(True)
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.setOpenExternalLinks(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Minimum)
        self._markdown = ""
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(self.RENDER_INTERVAL_MS)
        self._timer.timeout.connect(self._render)
        self.set_markdown(text)

    def markdown(self) -> str:
        return self._markdown

    def set_markdown(self, text: str) -> None:
        self._markdown = text
        self._timer.stop()
        self._render()

    def append(self, delta: str) -> None:
        self._markdown += delta
        if not self._timer.isActive():
            self._timer.start()

    def flush(self) -> None:
        """Render now if an append is pending (before measuring or grabbing)."""
        if self._timer.isActive():
            self._timer.stop()
            self._render()

    def _render(self) -> None:
        self.setText(markdown_to_html(self._markdown) if self._markdown else "")
