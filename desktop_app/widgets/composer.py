"""The composer: the message being written, long pastes folded into chips above it, and
the line that says why a dropped file or image was not attached.

Every paste and every drop (on the composer, or on the chat, which hands it here) goes
through `Composer.insertFromMimeData`, sorted by widgets.drops: files and images are
offered as attachments (`dropped`), a long text is folded into a chip (`pasteFolded`),
other text is inserted as usual.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, QMimeData, QObject, Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QToolButton, QWidget

from desktop_app.data.pasted_text import fold_label, should_fold
from desktop_app.widgets import drops

NOTICE_MS = 12_000  # how long the note on a drop stays
HINT_MS = 4_000  # how long "Type a message first" stays


class Composer(QPlainTextEdit):
    """Enter sends, Shift+Enter inserts a new line."""

    submitted = Signal()
    pasteFolded = Signal(str)  # a long text pasted or dropped: folded into a chip
    dropped = Signal(object)  # drops.Dropped with files or images

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("composer")
        self.setAccessibleName("Message to the model")
        self.setPlaceholderText("Message the model  (Enter to send, Shift+Enter for a new line)")
        self.setTabChangesFocus(True)
        self.setFixedHeight(72)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt override
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        super().keyPressEvent(event)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802 - Qt override
        # Files and pictures are accepted so that they reach insertFromMimeData and are
        # answered there, instead of being refused without a word.
        return source.hasUrls() or source.hasImage() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802 - Qt override
        if self.isReadOnly():
            return
        dropped = drops.classify(source)
        if dropped.has_attachments:
            self.dropped.emit(dropped)
        elif should_fold(dropped.text):
            self.pasteFolded.emit(dropped.text)
        elif dropped.text:
            self.insertPlainText(dropped.text)


class PasteChip(QFrame):
    """"Pasted text · 5,839 tokens" with Show (back into the composer, to edit) and ×."""

    def __init__(self, text: str, label: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("pasteChip")
        self.text = text
        self.label = QLabel(label)
        self.label.setObjectName("pasteChipLabel")
        self.label.setToolTip(text[:400])
        self.show_button = QToolButton()
        self.show_button.setText("Show")
        self.show_button.setToolTip("Put the pasted text back into the message, to edit it")
        self.remove_button = QToolButton()
        self.remove_button.setText("×")
        self.remove_button.setToolTip("Remove the pasted text")
        self.remove_button.setAccessibleName("Remove the pasted text")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 2, 2, 2)
        layout.addWidget(self.label)
        layout.addWidget(self.show_button)
        layout.addWidget(self.remove_button)


class PasteChips(QWidget):
    """The folded pastes of the draft, in the order they came."""

    changed = Signal()

    def __init__(self, composer: Composer, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("pasteChips")
        self._composer = composer
        self._chips: list[PasteChip] = []
        self.count_tokens: Callable[[str], int | None] = lambda _text: None
        self._layout = QHBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.addStretch(1)
        self.setVisible(False)

    def texts(self) -> list[str]:
        return [chip.text for chip in self._chips]

    def chips(self) -> list[PasteChip]:
        return list(self._chips)

    def add(self, text: str) -> PasteChip:
        chip = PasteChip(text, fold_label(text, self.count_tokens(text)))
        chip.show_button.clicked.connect(lambda: self._unfold(chip))
        chip.remove_button.clicked.connect(lambda: self._remove(chip))
        self._layout.insertWidget(len(self._chips), chip)
        self._chips.append(chip)
        self.setVisible(True)
        self.changed.emit()
        return chip

    def clear(self) -> None:
        for chip in list(self._chips):
            self._remove(chip, quiet=True)
        self.changed.emit()

    def set_locked(self, locked: bool) -> None:
        """A draft waiting for the model keeps its pastes as they are."""
        for chip in self._chips:
            chip.show_button.setEnabled(not locked)
            chip.remove_button.setEnabled(not locked)

    def _unfold(self, chip: PasteChip) -> None:
        self._composer.moveCursor(self._composer.textCursor().MoveOperation.End)
        typed = self._composer.toPlainText()
        self._composer.insertPlainText(("\n\n" if typed.strip() else "") + chip.text)
        self._remove(chip)

    def _remove(self, chip: PasteChip, quiet: bool = False) -> None:
        self._chips.remove(chip)
        self._layout.removeWidget(chip)
        chip.hide()
        chip.deleteLater()
        self.setVisible(bool(self._chips))
        if not quiet:
            self.changed.emit()


class ComposerNote(QLabel):
    """The line above the composer that says why Folio did not take what the user did: a
    send with nothing typed, a drop or paste it could not attach. It goes after a while;
    a hint about typing goes as soon as the user types (a drop's note outlives the edit the
    drop itself makes)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("composerNote")
        self.setWordWrap(True)
        self.setAccessibleName("Composer note")
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self.dismiss)
        self._until_typing = False
        self.setVisible(False)

    def show_note(self, text: str, shown_ms: int, until_typing: bool = False) -> None:
        self.setText(text)
        self.setVisible(bool(text))
        self._until_typing = until_typing
        self._timer.start(shown_ms)

    def on_typing(self) -> None:
        if self._until_typing:
            self.dismiss()

    def dismiss(self) -> None:
        self._timer.stop()
        self.clear()
        self.setVisible(False)


class DropForwarder(QObject):
    """Makes `target` (the conversation) take drops as the composer does: the same
    sorting, the same notice, text into the draft."""

    def __init__(self, composer: Composer, target: QWidget) -> None:
        super().__init__(target)
        self._composer, self._target = composer, target
        target.setAcceptDrops(True)
        target.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if watched is not self._target:
            return False
        kind = event.type()
        if kind in (QEvent.Type.DragEnter, QEvent.Type.DragMove):
            if self._composer.canInsertFromMimeData(event.mimeData()):
                event.acceptProposedAction()
                return True
        elif kind == QEvent.Type.Drop:
            self._composer.insertFromMimeData(event.mimeData())
            self._composer.setFocus()
            event.acceptProposedAction()
            return True
        return False
