"""The main window's menus and keys: File (Export, Import, Quit), Help (Documentation,
About Folio), and the window-wide Ctrl+N, Ctrl+R and Esc.

Quit goes through the window's closeEvent like the title bar's close button, so the
layout is saved and the engine and servers shut down; Ctrl+R is enabled only while the
chat in view has a reply to regenerate (``ChatController.regenerateChanged``)."""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QAction, QKeySequence, QShortcut

from desktop_app.dialogs import about_dialog
from desktop_app.dialogs.chat_files import ChatFileActions
from desktop_app.widgets import theme


def quit_keys() -> list[QKeySequence]:
    """The platform's Quit keys, and Ctrl+Q where it has none (Windows)."""
    keys = QKeySequence.keyBindings(QKeySequence.StandardKey.Quit)
    ctrl_q = QKeySequence("Ctrl+Q")
    return keys if ctrl_q in keys else [*keys, ctrl_q]


class WindowMenus(QObject):
    """Builds the menu bar and the keys on `window` (a MainWindow) and keeps the actions."""

    def __init__(self, window) -> None:
        super().__init__(window)
        self.window = window
        controller = window.controller
        self.chat_files = ChatFileActions(window.store, lambda: controller.chat_id, window)
        self.chat_files.chatImported.connect(self._on_chat_imported)
        self.export_chat_action = self.chat_files.export_action
        self.import_chat_action = self.chat_files.import_action
        file_menu = window.menuBar().addMenu("&File")
        file_menu.setObjectName("fileMenu")
        file_menu.addAction(self.export_chat_action)
        file_menu.addAction(self.import_chat_action)
        file_menu.addSeparator()
        self.quit_action = QAction(theme.icon("quit"), "&Quit", window)
        self.quit_action.setObjectName("quitAction")
        self.quit_action.setShortcuts(quit_keys())
        self.quit_action.setMenuRole(QAction.MenuRole.QuitRole)
        self.quit_action.triggered.connect(window.close)
        file_menu.addAction(self.quit_action)

        help_menu = window.menuBar().addMenu("&Help")
        help_menu.setObjectName("helpMenu")
        self.docs_action = help_menu.addAction(theme.icon("help"), "&Documentation",
                                               lambda: about_dialog.open_docs(window))
        self.docs_action.setObjectName("docsAction")
        self.about_action = help_menu.addAction(theme.app_icon(), "&About Folio",
                                                self.show_about)
        self.about_action.setObjectName("aboutAction")
        self.about_action.setMenuRole(QAction.MenuRole.AboutRole)

        window.new_chat_action.setShortcut(QKeySequence.StandardKey.New)
        self.regenerate_action = QAction("Regenerate", window)
        self.regenerate_action.setShortcut(QKeySequence("Ctrl+R"))
        self.regenerate_action.triggered.connect(lambda: controller.regenerate(0))
        self.regenerate_action.setEnabled(controller.can_regenerate())
        controller.regenerateChanged.connect(self.regenerate_action.setEnabled)
        window.addAction(self.regenerate_action)
        stop = QShortcut(QKeySequence(Qt.Key.Key_Escape), window)
        stop.setContext(Qt.ShortcutContext.WindowShortcut)
        stop.activated.connect(controller.stop)

    def show_about(self) -> about_dialog.AboutDialog:
        window = self.window
        dialog = about_dialog.AboutDialog(about_dialog.about_facts(window.bridge, window.store),
                                          window)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def _on_chat_imported(self, chat_id: int) -> None:
        self.window.refresh_chats()
        self.window.open_chat(chat_id)
