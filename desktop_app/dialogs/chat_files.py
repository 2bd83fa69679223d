"""File ▸ Export chat… and File ▸ Import chat…: pick a file, report errors.

The formats live in desktop_app.data (chat_export, chat_import, through ChatStore); this
module only asks for a path and shows what went wrong. Export: the save dialog's filter
picks Markdown (the open branch, for reading; its attachments written as files into
"<name> files" beside it and linked) or JSON (the whole tree, attachments embedded, to
import again).
Import: a JSON export becomes a new chat, or nothing is written and the error names why;
any failure, a bad file or the store's own, is shown, never left to the console.

Tests replace `save_file_name` / `open_file_name` (module attributes, looked up at call
time) instead of showing the native file dialogs.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QFileDialog, QWidget

from desktop_app.data.chat_import import ChatImportError
from desktop_app.dialogs import error_dialog

logger = logging.getLogger(__name__)

MARKDOWN_FILTER = "Markdown: the open branch (*.md)"
JSON_FILTER = "Folio JSON: every branch, can be imported (*.json)"
# A chat export is text; anything this big is not one (and would stall the GUI thread).
MAX_IMPORT_BYTES = 256 * 2**20


def save_file_name(parent: QWidget | None, title: str, suggested: str,
                   filters: str) -> tuple[str, str]:
    """(path, the chosen filter); path is "" when cancelled."""
    return QFileDialog.getSaveFileName(parent, title, suggested, filters)


def open_file_name(parent: QWidget | None, title: str, filters: str) -> tuple[str, str]:
    return QFileDialog.getOpenFileName(parent, title, "", filters)


class ChatFileActions(QObject):
    """The two actions; chatImported(chat_id) after a successful import."""

    chatImported = Signal(int)

    def __init__(self, store, current_chat: Callable[[], int | None], parent: QWidget) -> None:
        super().__init__(parent)
        self.store, self._current_chat, self._window = store, current_chat, parent
        self.export_action = QAction("Export chat…", parent)
        self.export_action.setObjectName("exportChatAction")
        self.export_action.setShortcut(QKeySequence("Ctrl+Shift+E"))
        self.export_action.setToolTip("Save this chat as Markdown (the open branch) or as "
                                      "JSON (every branch, to import again)")
        self.export_action.triggered.connect(self.export_chat)
        self.import_action = QAction("Import chat…", parent)
        self.import_action.setObjectName("importChatAction")
        self.import_action.setShortcut(QKeySequence("Ctrl+Shift+I"))
        self.import_action.setToolTip("Add a chat from a Folio JSON export")
        self.import_action.triggered.connect(self.import_chat)

    def export_chat(self) -> Path | None:
        chat_id = self._current_chat()
        if not chat_id:
            error_dialog.show_error(self._window, "Nothing to export",
                                    "Open or start a chat first, then export it.")
            return None
        chat = self.store.get_chat(chat_id)
        suggested = _file_stem(chat.title) + ".md"
        path_text, chosen = save_file_name(self._window, "Export chat", suggested,
                                           f"{MARKDOWN_FILTER};;{JSON_FILTER}")
        if not path_text:
            return None
        path = Path(path_text)
        as_json = chosen == JSON_FILTER or (chosen != MARKDOWN_FILTER
                                            and path.suffix.lower() == ".json")
        if not path.suffix:
            path = path.with_suffix(".json" if as_json else ".md")
        # Markdown links its attachments, written into "<name> files" beside it.
        folder = f"{path.stem} files"
        text = self.store.export_json(chat_id) if as_json else self.store.export_markdown(
            chat_id, folder=folder)
        try:
            if not as_json:
                _write_files(path.parent / folder, self.store.markdown_attachments(chat_id))
            _write_atomically(path, text)
        except OSError as err:
            error_dialog.show_error(self._window, "Could not export the chat",
                                    f"Could not write {path}: {err.strerror or err}")
            return None
        return path

    def import_chat(self) -> int | None:
        path_text, _ = open_file_name(self._window, "Import chat",
                                      "Folio JSON (*.json);;All files (*)")
        if not path_text:
            return None
        path = Path(path_text)
        title = "Could not import the chat"
        try:
            if path.stat().st_size > MAX_IMPORT_BYTES:
                raise ChatImportError(f"The file is {path.stat().st_size / 2**20:.0f} MiB; "
                                      "a Folio chat export is far smaller.")
            text = path.read_text(encoding="utf-8")
            chat = self.store.import_json(text)
        except OSError as err:
            error_dialog.show_error(self._window, title,
                                    f"Could not read {path}: {err.strerror or err}")
            return None
        except UnicodeDecodeError:
            error_dialog.show_error(self._window, title,
                                    f"{path.name} is not a Folio chat export: it is not "
                                    "UTF-8 text.")
            return None
        except ChatImportError as err:
            error_dialog.show_error(self._window, title, f"{path.name}: {err}\n\n"
                                    "Nothing was imported.")
            return None
        except Exception as err:  # noqa: BLE001 - the user must hear of any failure
            # A slot's exception would only reach the console; the store's transaction
            # has rolled back whatever was written.
            logger.exception("Importing %s failed", path)
            error_dialog.show_error(self._window, title,
                                    f"{path.name}: the import failed unexpectedly "
                                    f"({type(err).__name__}: {err}).\n\n"
                                    "Nothing was imported.")
            return None
        self.chatImported.emit(chat.id)
        return chat.id


def _file_stem(title: str) -> str:
    stem = re.sub(r'[\\/:*?"<>|\x00-\x1f]+', " ", title).strip(" .")
    return stem[:80] or "chat"


def _write_files(folder: Path, files: dict[str, bytes]) -> None:
    if not files:
        return
    folder.mkdir(exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".folio-export-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it owner-only
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
