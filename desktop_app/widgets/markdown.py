"""Markdown rendering of messages: a reply is a column of segments, text and code.

`split_segments` cuts a reply at its top-level fenced code blocks. Text segments are rich
text in a word-wrapped QLabel: Qt's own CommonMark/GitHub importer
(QTextDocument.setMarkdown) does the parsing and we only restyle what it produced (inline
code gets the fixed-pitch font and a tint; code that is not a top-level fence, indented
or in a quote, becomes a one-cell table with padding and a background). Fenced code
segments are `CodeBlock`s: highlighted, with a copy button, scrolling sideways.
`MarkdownView` shows the segments and re-renders a streaming reply at most every
RENDER_INTERVAL_MS, touching only the segments that changed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from PySide6.QtCore import QEvent, Qt, QTimer
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
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from desktop_app.widgets import theme
from desktop_app.widgets.code_block import THEME_EVENTS, CodeBlock

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


def wrapped_text_policy(horizontal: QSizePolicy.Policy) -> QSizePolicy:
    """The size policy of word-wrapped text: its height follows its width.

    The height-for-width flag must be set again on any new policy (QLabel sets it for
    wrapped text, a plain QSizePolicy drops it): without it the layouts size a paragraph
    by its sizeHint, measured at QLabel's own narrow guess of a width. And the vertical
    policy may shrink (Preferred, not Minimum): a row's minimum height is otherwise that
    same narrow sizeHint, and the scroll area sizes its canvas to the sum of the
    minimums, so a long message left a band of empty space under the last reply."""
    policy = QSizePolicy(horizontal, QSizePolicy.Policy.Preferred)
    policy.setHeightForWidth(True)
    return policy


class ThrottledMarkdown:
    """Markdown text that streams in: `append()` only marks it dirty and a single-shot
    timer re-renders at most every RENDER_INTERVAL_MS, so a fast token stream costs one
    layout per interval instead of one per token and the event loop stays responsive.
    `set_markdown` and `flush` render at once. A widget mixes it in, calls `_start_text`
    from its constructor and implements `_render(streaming)`."""

    RENDER_INTERVAL_MS = 60

    def _start_text(self, text: str) -> None:
        self._markdown = ""
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(self.RENDER_INTERVAL_MS)
        self._timer.timeout.connect(self._render)
        self.set_markdown(text)

    def markdown(self) -> str:
        return self._markdown

    def set_markdown(self, text: str) -> None:
        """Show `text` now, fully rendered (a finished reply, or one loaded)."""
        self._markdown = text
        self._timer.stop()
        self._render(streaming=False)

    def append(self, delta: str) -> None:
        self._markdown += delta
        if not self._timer.isActive():
            self._timer.start()

    def flush(self) -> None:
        """Render now if an append is pending (before measuring or grabbing)."""
        if self._timer.isActive():
            self._timer.stop()
            self._render()


class MarkdownLabel(ThrottledMarkdown, QLabel):
    """A selectable, word-wrapped label showing Markdown."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageText")
        self.setWordWrap(True)
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.setOpenExternalLinks(True)
        self.setSizePolicy(wrapped_text_policy(QSizePolicy.Policy.Expanding))
        self._start_text(text)

    def _render(self, streaming: bool = True) -> None:
        self.setText(markdown_to_html(self._markdown) if self._markdown else "")


# -- segments: text and fenced code -------------------------------------------------------
@dataclass(slots=True, frozen=True)
class Segment:
    """A piece of a reply: Markdown text, or the code of a fenced block (fences and
    language tag left out). `closed` is False for a fence still open (a streaming reply)."""

    kind: str  # "text" or "code"
    text: str
    language: str = ""
    closed: bool = True


_OPEN_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")


def _closes(line: str, char: str, length: int) -> bool:
    stripped = line.strip(" ")
    return (len(line) - len(line.lstrip(" ")) <= 3 and len(stripped) >= length
            and stripped == char * len(stripped))


def split_segments(markdown: str) -> list[Segment]:
    """Cut `markdown` at its top-level fenced code blocks (CommonMark fences: 3+ backticks
    or tildes, indented at most 3 spaces). A fence left open runs to the end, so a
    streaming reply shows its code so far. Blank text between blocks is dropped."""
    segments: list[Segment] = []
    text: list[str] = []

    def flush_text() -> None:
        joined = "\n".join(text)
        if joined.strip():
            segments.append(Segment("text", joined))
        text.clear()

    lines = markdown.split("\n")
    i = 0
    while i < len(lines):
        match = _OPEN_FENCE.match(lines[i])
        info = match.group(3) if match else ""
        if match is None or (match.group(2)[0] == "`" and "`" in info):
            text.append(lines[i])
            i += 1
            continue
        flush_text()
        indent, fence = len(match.group(1)), match.group(2)
        language = info.strip().split(" ", 1)[0] if info.strip() else ""
        code: list[str] = []
        i += 1
        closed = False
        while i < len(lines):
            if _closes(lines[i], fence[0], len(fence)):
                closed = True
                i += 1
                break
            line = lines[i]
            strip = min(indent, len(line) - len(line.lstrip(" ")))
            code.append(line[strip:])
            i += 1
        segments.append(Segment("code", "\n".join(code), language, closed))
    flush_text()
    return segments


class MarkdownView(ThrottledMarkdown, QWidget):
    """A message body: its segments top to bottom, text as MarkdownLabels, fenced code as
    CodeBlocks. Streaming text is throttled (ThrottledMarkdown); a render re-parses the
    segments and updates only those that changed (usually the last one)."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("markdownView")
        self.setAccessibleName("Message text")
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(6)
        self.setSizePolicy(wrapped_text_policy(QSizePolicy.Policy.Expanding))
        self._dark = theme.current().dark
        self._segments: list[Segment] = []
        self._widgets: list[QWidget] = []
        self._start_text(text)

    def segments(self) -> list[Segment]:
        """The segments shown now."""
        return list(self._segments)

    def segment_widgets(self) -> list[QWidget]:
        return list(self._widgets)

    def code_blocks(self) -> list[CodeBlock]:
        return [w for w in self._widgets if isinstance(w, CodeBlock)]

    def text_labels(self) -> list[MarkdownLabel]:
        return [w for w in self._widgets if isinstance(w, MarkdownLabel)]

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt override
        """On a light/dark switch, re-render the text (its inline code tint); the code
        blocks re-highlight themselves."""
        super().changeEvent(event)
        if event.type() in THEME_EVENTS and theme.current().dark != self._dark:
            self._dark = theme.current().dark
            for label in self.text_labels():
                label.set_markdown(label.markdown())

    def _render(self, streaming: bool = True) -> None:
        new = split_segments(self._markdown)
        keep = 0
        while (keep < min(len(new), len(self._segments))
               and new[keep].kind == self._segments[keep].kind):
            keep += 1
        for widget in self._widgets[keep:]:
            self._layout.removeWidget(widget)
            widget.hide()
            widget.setParent(None)
            widget.deleteLater()
        del self._widgets[keep:]
        for index, segment in enumerate(new):
            if index < keep:
                if segment != self._segments[index] or not streaming:
                    self._update(self._widgets[index], segment, streaming)
                continue
            widget = self._make(segment)
            self._widgets.append(widget)
            self._layout.addWidget(widget)
        self._segments = new

    @staticmethod
    def _make(segment: Segment) -> QWidget:
        if segment.kind == "code":
            return CodeBlock(segment.text, segment.language)
        label = MarkdownLabel(segment.text)
        label.setSizePolicy(wrapped_text_policy(QSizePolicy.Policy.Preferred))
        return label

    @staticmethod
    def _update(widget: QWidget, segment: Segment, streaming: bool) -> None:
        if isinstance(widget, CodeBlock):
            widget.set_code(segment.text, segment.language, streaming)
        elif widget.markdown() != segment.text:
            widget.set_markdown(segment.text)
