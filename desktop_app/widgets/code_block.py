"""A fenced code block of a reply: a header with the language and a copy button over the
code, highlighted with Pygments, that scrolls sideways instead of wrapping.

The colors come from a light or a dark Pygments style picked by `theme.current().dark`;
the block's background is the theme's `code_bg`, so only the token colors are Pygments'.
"""

from __future__ import annotations

import time
from functools import lru_cache

from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.lexers.special import TextLexer
from pygments.styles import get_style_by_name
from pygments.token import Text, _TokenType
from pygments.util import ClassNotFound
from PySide6.QtCore import QEvent, QSize, Qt, QTimer
from PySide6.QtGui import (
    QBrush,
    QColor,
    QFont,
    QGuiApplication,
    QTextCharFormat,
    QTextCursor,
    QTextOption,
    QWheelEvent,
)
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QTextEdit,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop_app.widgets import theme

# The events a widget gets when apply_theme changes the app's palette and style sheet.
THEME_EVENTS = (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange,
                QEvent.Type.StyleChange)

LIGHT_STYLE = "default"
DARK_STYLE = "github-dark"


def style_name(dark: bool | None = None) -> str:
    """The Pygments style for the light or dark theme (the current one by default)."""
    if dark is None:
        dark = theme.current().dark
    return DARK_STYLE if dark else LIGHT_STYLE


@lru_cache(maxsize=64)
def lexer_for(language: str) -> Lexer:
    """The lexer for a fence's language tag; plain text when unknown or absent. The lexer
    keeps the code as it is (no stripped or added newlines), so the tokens join back to
    exactly the code."""
    name = language.strip().lower()
    options = dict(stripnl=False, ensurenl=False, stripall=False)
    if name:
        try:
            return get_lexer_by_name(name, **options)
        except ClassNotFound:
            pass
    return TextLexer(**options)


_formats: dict[tuple[str, _TokenType], QTextCharFormat] = {}


def token_format(style: str, token: _TokenType) -> QTextCharFormat:
    """The char format of a Pygments token type in a Pygments style (cached)."""
    fmt = _formats.get((style, token))
    if fmt is None:
        spec = get_style_by_name(style).style_for_token(token)
        fmt = QTextCharFormat()
        if spec.get("color"):
            fmt.setForeground(QBrush(QColor("#" + spec["color"])))
        if spec.get("bold"):
            fmt.setFontWeight(QFont.Weight.Bold)
        if spec.get("italic"):
            fmt.setFontItalic(True)
        if spec.get("underline"):
            fmt.setFontUnderline(True)
        _formats[(style, token)] = fmt
    return fmt


def highlight_tokens(code: str, language: str) -> list[tuple[_TokenType, str]]:
    """Pygments tokens of `code`; their texts join back to `code` exactly."""
    tokens = [(tok, text) for tok, text in lexer_for(language).get_tokens(code) if text]
    if "".join(text for _, text in tokens) != code:  # a lexer that rewrote the text
        return [(Text, code)]
    return tokens


class CodeView(QTextEdit):
    """The code itself: read-only, selectable, never wrapped; as tall as its lines, with a
    horizontal scroll bar when a line is wider than the view."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("codeView")
        self.setAccessibleName("Code")
        self.setReadOnly(True)
        self.setUndoRedoEnabled(False)
        self.setLineWrapMode(QTextEdit.LineWrapMode.NoWrap)
        self.setWordWrapMode(QTextOption.WrapMode.NoWrap)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        # Only the family is set: the size follows the app's font, like the reply's text.
        font = QFont()
        font.setFamilies(_mono_families())
        font.setFixedPitch(True)
        self.setFont(font)
        self.document().setDocumentMargin(8)
        policy = QSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)
        self.horizontalScrollBar().rangeChanged.connect(lambda *_: self.updateGeometry())
        self.document().documentLayout().documentSizeChanged.connect(
            lambda *_: self.updateGeometry())

    def _content_height(self) -> int:
        return int(self.document().size().height() + 0.999)

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt override
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt override
        frame = 2 * self.frameWidth()
        height = self._content_height() + frame
        if self.document().idealWidth() > width - frame:
            height += self.horizontalScrollBar().sizeHint().height()
        return height

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        width = int(self.document().idealWidth()) + 2 * self.frameWidth()
        return QSize(width, self.heightForWidth(max(self.width(), 1)))

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(40, self.heightForWidth(max(self.width(), 1)))

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        if self.height() != self.heightForWidth(self.width()):
            self.updateGeometry()

    def wheelEvent(self, event: QWheelEvent) -> None:  # noqa: N802 - Qt override
        # Up and down scroll the conversation; only sideways wheels scroll the code (and
        # Ctrl+wheel does not zoom one block).
        delta = event.angleDelta()
        if abs(delta.x()) > abs(delta.y()) and not (
                event.modifiers() & Qt.KeyboardModifier.ControlModifier):
            super().wheelEvent(event)
        else:
            event.ignore()


class CodeBlock(QFrame):
    """One fenced code block: language and copy button over the highlighted code."""

    def __init__(self, code: str = "", language: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("codeBlock")
        self._code: str | None = None
        self._language = ""
        self._style = ""
        # What the document shows: tokens (None: not highlighted yet) of which code.
        self._shown: list[tuple[_TokenType | None, str]] = []
        self._tokens_code: str | None = None
        self._tokens_language = ""
        self._lex_s = 0.0
        self._dark: bool | None = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(1, 1, 1, 1)
        layout.setSpacing(0)
        header = QWidget()
        header.setObjectName("codeHeader")
        row = QHBoxLayout(header)
        row.setContentsMargins(10, 2, 4, 2)
        row.setSpacing(4)
        self.language_label = QLabel()
        self.language_label.setObjectName("codeLanguage")
        row.addWidget(self.language_label)
        row.addStretch(1)
        self.copy_button = QToolButton()
        self.copy_button.setObjectName("codeCopyButton")
        self.copy_button.setText("Copy")
        self.copy_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.copy_button.setToolTip("Copy this code")
        self.copy_button.setAccessibleName("Copy code")
        self.copy_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.copy_button.clicked.connect(self.copy_to_clipboard)
        row.addWidget(self.copy_button)
        layout.addWidget(header)
        self.view = CodeView()
        layout.addWidget(self.view)
        policy = QSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)
        self._restore_label = QTimer(self)
        self._restore_label.setSingleShot(True)
        self._restore_label.setInterval(1200)
        self._restore_label.timeout.connect(lambda: self.copy_button.setText("Copy"))
        self._defer = QTimer(self)
        self._defer.setSingleShot(True)
        self._defer.timeout.connect(self._highlight)
        self._apply_theme()
        self.set_code(code, language)

    # -- content -------------------------------------------------------------------------
    # While a reply streams, the code grows a little each render. Lexing is the costly part
    # (Pygments re-lexes the whole block: ~7 ms per 100 lines), so a streaming update of a
    # block that took long to lex appends the new text unstyled at once and re-highlights
    # after a pause proportional to that cost; the document is only rewritten from the
    # first token that changed. A final update (streaming=False) always highlights now.
    FAST_LEX_S = 0.008
    MAX_DEFER_MS = 1000

    def code(self) -> str:
        return self._code or ""

    def language(self) -> str:
        return self._language

    def set_code(self, code: str, language: str = "", streaming: bool = False) -> None:
        """Show `code` highlighted as `language`; nothing is redone when nothing changed."""
        language = language.strip()
        if language != self._language or self._code is None:
            self.language_label.setText(language or "text")
            self.setAccessibleName(f"Code block, {language}" if language else "Code block")
        old = self.code()
        self._code, self._language = code, language
        done = (self._tokens_code == code and self._tokens_language == language
                and self._style == style_name())
        if done:
            self._defer.stop()
            return
        slow = self._lex_s > self.FAST_LEX_S
        if streaming and slow and code.startswith(old) and language == self._tokens_language:
            self._append_plain(code[len(old):])
            if not self._defer.isActive():
                self._defer.start(min(self.MAX_DEFER_MS, int(5000 * self._lex_s)))
            return
        self._highlight()

    def html(self) -> str:
        """The highlighted code as Qt rich text (the token colors are in its spans)."""
        return self.view.document().toHtml()

    def copy_to_clipboard(self) -> None:
        QGuiApplication.clipboard().setText(self.code())
        self.copy_button.setText("Copied")
        self._restore_label.start()

    def _base_format(self) -> QTextCharFormat:
        base = QTextCharFormat()
        base.setFontFamilies(_mono_families())
        base.setFontFixedPitch(True)
        return base

    def _append_plain(self, text: str) -> None:
        if not text:
            return
        cursor = QTextCursor(self.view.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text, self._base_format())
        self._shown.append((None, text))
        self._rewind_cursor()

    def _rewind_cursor(self) -> None:
        """Inserted text pushes the view's own cursor to the end, and the view scrolls to
        follow it: put it back at the start, leaving the scroll where it was (and any
        selection the reader made alone)."""
        cursor = self.view.textCursor()
        if cursor.hasSelection() or cursor.position() == 0:
            return
        bar = self.view.horizontalScrollBar()
        value = bar.value()
        cursor.setPosition(0)
        self.view.setTextCursor(cursor)
        bar.setValue(value)

    def _highlight(self) -> None:
        self._defer.stop()
        style = style_name()
        started = time.perf_counter()
        tokens = highlight_tokens(self.code(), self._language)
        self._lex_s = time.perf_counter() - started
        shown = self._shown if style == self._style else []
        same = 0
        for (tok_a, text_a), (tok_b, text_b) in zip(shown, tokens, strict=False):
            if tok_a is not tok_b or text_a != text_b:
                break
            same += 1
        offset = sum(len(text) for _, text in tokens[:same])
        doc = self.view.document()
        cursor = QTextCursor(doc)
        cursor.beginEditBlock()
        if same == 0:
            doc.clear()
            cursor = QTextCursor(doc)
        else:
            cursor.setPosition(offset)
            cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
            cursor.removeSelectedText()
        base = self._base_format()
        for token, text in tokens[same:]:
            fmt = QTextCharFormat(base)
            fmt.merge(token_format(style, token))
            cursor.insertText(text, fmt)
        cursor.endEditBlock()
        self._rewind_cursor()
        self._style = style
        self._shown = tokens
        self._tokens_code, self._tokens_language = self.code(), self._language
        self.view.updateGeometry()
        self.updateGeometry()

    # -- theme ---------------------------------------------------------------------------
    def _apply_theme(self) -> None:
        c = theme.current()
        self._dark = c.dark
        self.copy_button.setIcon(theme.icon("copy", c.muted))
        self.setStyleSheet(
            f"#codeBlock {{ background: {c.code_bg}; border: 1px solid {c.border};"
            f" border-radius: 6px; }}"
            f" #codeHeader {{ background: transparent; border-bottom: 1px solid {c.border}; }}"
            f" #codeLanguage {{ color: {c.muted}; }}"
            f" QToolButton#codeCopyButton {{ color: {c.muted}; border: none; padding: 1px 6px;"
            f" background: transparent; }}"
            f" QToolButton#codeCopyButton:hover {{ color: {c.text}; background: {c.surface};"
            f" border-radius: 4px; }}"
            f" #codeView {{ background: {c.code_bg}; color: {c.text}; border: none; }}")

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt override
        """apply_theme swaps the app's palette and style sheet: follow a light/dark switch."""
        super().changeEvent(event)
        if (event.type() in THEME_EVENTS and self._dark is not None
                and theme.current().dark != self._dark):
            self._apply_theme()
            self._highlight()

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt override
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt override
        return self.layout().totalHeightForWidth(width)


def _mono_families() -> list[str]:
    family = theme.monospace_font().family()
    return [family] if family == "monospace" else [family, "monospace"]
