"""The sidebar: chats newest activity first, search over titles and text, new/rename/delete."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLineEdit,
    QListView,
    QMenu,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from desktop_app.widgets import message_box, theme

ChatIdRole = Qt.ItemDataRole.UserRole + 1
GeneratingRole = Qt.ItemDataRole.UserRole + 2  # True while a reply streams in that chat


def confirm(parent: QWidget, title: str, text: str) -> bool:
    """Ask yes/no; tests monkeypatch this module function instead of clicking a dialog."""
    return message_box.ask(parent, title, text)


def relative_time(stamp: float, now: float | None = None) -> str:
    age = (time.time() if now is None else now) - stamp
    if age < 60:
        return "just now"
    if age < 3600:
        return f"{int(age // 60)} min ago"
    if age < 86400:
        return f"{int(age // 3600)} h ago"
    if age < 7 * 86400:
        days = int(age // 86400)
        return f"{days} day{'s' if days > 1 else ''} ago"
    return time.strftime("%Y-%m-%d", time.localtime(stamp))


@dataclass(slots=True)
class ChatRow:
    chat_id: int
    title: str
    updated_at: float


class ChatListModel(QAbstractListModel):
    """Rows of chats; editing a title in place emits `renamed` (the store is not touched)."""

    renamed = Signal(int, str)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._rows: list[ChatRow] = []
        self._generating: set[int] = set()
        self._bold = QFont()
        self._bold.setBold(True)

    def set_chats(self, chats: Sequence) -> None:
        self.beginResetModel()
        self._rows = [ChatRow(c.id, c.title, c.updated_at) for c in chats]
        self.endResetModel()

    def set_generating(self, chat_ids) -> None:
        """Mark the chats whose replies are streaming (bold, with a dot)."""
        chat_ids = set(chat_ids)
        changed = chat_ids ^ self._generating
        self._generating = chat_ids
        for i, row in enumerate(self._rows):
            if row.chat_id in changed:
                index = self.index(i)
                self.dataChanged.emit(index, index)

    def is_generating(self, chat_id: int) -> bool:
        return chat_id in self._generating

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex | None = None) -> int:  # noqa: N802
        return 0 if parent is not None and parent.isValid() else len(self._rows)

    def data(self, index, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row = self._rows[index.row()]
        generating = row.chat_id in self._generating
        if role == Qt.ItemDataRole.DisplayRole:
            return ("● " if generating else "") + (row.title or "Untitled")
        if role == Qt.ItemDataRole.EditRole:
            return row.title or "Untitled"
        if role == Qt.ItemDataRole.ToolTipRole:
            note = "\nWriting a reply…" if generating else ""
            return f"{row.title}\nLast activity: {relative_time(row.updated_at)}{note}"
        if role == Qt.ItemDataRole.FontRole and generating:
            return self._bold
        if role == ChatIdRole:
            return row.chat_id
        if role == GeneratingRole:
            return generating
        return None

    def flags(self, index):
        base = super().flags(index)
        return base | Qt.ItemFlag.ItemIsEditable if index.isValid() else base

    def setData(self, index, value, role: int = Qt.ItemDataRole.EditRole) -> bool:  # noqa: N802
        title = str(value).strip()
        if not index.isValid() or role != Qt.ItemDataRole.EditRole or not title:
            return False
        row = self._rows[index.row()]
        if title != row.title:
            row.title = title
            self.dataChanged.emit(index, index)
            self.renamed.emit(row.chat_id, title)
        return True

    def row_of(self, chat_id: int) -> int:
        return next((i for i, r in enumerate(self._rows) if r.chat_id == chat_id), -1)

    def chat_ids(self) -> list[int]:
        return [r.chat_id for r in self._rows]

    def titles(self) -> list[str]:
        return [r.title for r in self._rows]


class ChatList(QWidget):
    chatSelected = Signal(int)
    newChatRequested = Signal()
    renameRequested = Signal(int, str)
    deleteRequested = Signal(int)  # already confirmed by the user
    searchChanged = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("sidebar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.model = ChatListModel(self)
        self.model.renamed.connect(self.renameRequested)

        self.new_button = QPushButton(theme.icon("new-chat"), "New chat")
        self.new_button.setObjectName("newChatButton")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.clicked.connect(self.newChatRequested)
        self.search = QLineEdit()
        self.search.setObjectName("chatSearch")
        self.search.setPlaceholderText("Search chats")
        self.search.setClearButtonEnabled(True)
        self._search_icon = self.search.addAction(theme.icon("search", theme.current().muted),
                                                  QLineEdit.ActionPosition.LeadingPosition)
        self.search.textChanged.connect(self.searchChanged)

        self.view = QListView()
        self.view.setObjectName("chatList")
        self.view.setAccessibleName("Chats")
        self.view.setModel(self.model)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed)
        self.view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.view.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.view.setUniformItemSizes(True)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.view.customContextMenuRequested.connect(self._context_menu)
        self.view.selectionModel().currentChanged.connect(self._on_current_changed)

        self.rename_button = QPushButton(theme.icon("rename"), "")
        self.rename_button.setObjectName("flatButton")
        self.rename_button.setToolTip("Rename the selected chat (F2)")
        self.rename_button.clicked.connect(self.edit_current_title)
        self.delete_button = QPushButton(theme.icon("delete"), "")
        self.delete_button.setObjectName("flatButton")
        self.delete_button.setToolTip("Delete the selected chat")
        self.delete_button.clicked.connect(self.delete_current)

        top = QHBoxLayout()
        top.addWidget(self.new_button, 1)
        top.addWidget(self.rename_button)
        top.addWidget(self.delete_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 10, 6, 10)
        layout.setSpacing(8)
        layout.addLayout(top)
        layout.addWidget(self.search)
        layout.addWidget(self.view, 1)
        self._quiet = False

    def retheme(self) -> None:
        self.new_button.setIcon(theme.icon("new-chat"))
        self.rename_button.setIcon(theme.icon("rename"))
        self.delete_button.setIcon(theme.icon("delete"))
        self._search_icon.setIcon(theme.icon("search", theme.current().muted))

    # -- contents ------------------------------------------------------------------------
    def set_chats(self, chats: Sequence, current_id: int | None) -> None:
        """Replace the rows, keeping `current_id` selected without re-emitting it."""
        self._quiet = True
        try:
            self.model.set_chats(chats)
            self.select(current_id)
        finally:
            self._quiet = False

    def set_generating(self, chat_ids) -> None:
        """Mark the chats whose replies are streaming."""
        self.model.set_generating(chat_ids)

    def select(self, chat_id: int | None) -> None:
        row = self.model.row_of(chat_id) if chat_id is not None else -1
        if row < 0:
            self.view.clearSelection()
            return
        self.view.setCurrentIndex(self.model.index(row))

    def current_chat_id(self) -> int | None:
        index = self.view.currentIndex()
        return index.data(ChatIdRole) if index.isValid() else None

    # -- actions ----------------------------------------------------------------------------
    def edit_current_title(self) -> None:
        index = self.view.currentIndex()
        if index.isValid():
            self.view.edit(index)

    def delete_current(self) -> None:
        chat_id = self.current_chat_id()
        if chat_id is None:
            return
        title = self.view.currentIndex().data(Qt.ItemDataRole.EditRole)
        if confirm(self, "Delete chat", f"Delete “{title}” and all its messages? "
                   "This cannot be undone."):
            self.deleteRequested.emit(chat_id)

    def _on_current_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if current.isValid() and not self._quiet:
            self.chatSelected.emit(current.data(ChatIdRole))

    def _context_menu(self, pos) -> None:
        index = self.view.indexAt(pos)
        if not index.isValid():
            return
        self.view.setCurrentIndex(index)
        menu = QMenu(self)
        menu.addAction(theme.icon("rename"), "Rename", self.edit_current_title)
        menu.addAction(theme.icon("delete"), "Delete…", self.delete_current)
        menu.exec(self.view.viewport().mapToGlobal(pos))
