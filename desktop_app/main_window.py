"""The main window: chat sidebar, conversation, Memory dock, toolbar, dialogs (its menus
and keys: window_menus).

It builds the controllers with the collaborators they use and declares here how they talk:
the chat in view (``ChatController.chatOpened``) reaches the composer's Think, JSON and
Tools controls, ToolTurns asks the controller to go on after tool results and to show a
chat again, and the memory panel is handed the controller's answers for block owners and
the open chat's size."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QAction, QCloseEvent
from PySide6.QtWidgets import (
    QComboBox,
    QDockWidget,
    QLabel,
    QMainWindow,
    QProgressBar,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QToolBar,
    QWidget,
)

from desktop_app.controllers.chat_controller import ChatController
from desktop_app.controllers.compare_choice import CompareChoice
from desktop_app.controllers.dock_lookups import DockLookups
from desktop_app.controllers.json_mode import JsonModeController
from desktop_app.controllers.load_display import LoadDisplay
from desktop_app.controllers.serve_switch import ServeSwitch
from desktop_app.controllers.thinking import ThinkingControls
from desktop_app.controllers.tool_turns import ToolTurns
from desktop_app.data import kv_precision
from desktop_app.data.beam_choice import SAMPLING_ONLY_NOTE
from desktop_app.data.model_templates import template_config
from desktop_app.data.settings import MAX_CANDIDATES, AppSettings, config_dir, save_settings
from desktop_app.dialogs import error_dialog
from desktop_app.dialogs.settings_dialog import SettingsDialog
from desktop_app.services import devices, sources
from desktop_app.services.tools_bridge import ToolsBridge
from desktop_app.widgets import theme
from desktop_app.widgets.chat_list import ChatList
from desktop_app.widgets.chat_tools import ChatToolsButton
from desktop_app.widgets.compare_button import CompareButton
from desktop_app.widgets.conversation_view import ConversationView
from desktop_app.widgets.vram_panel import VramPanel
from desktop_app.window_menus import WindowMenus

STARTER = sources.STARTER
CANDIDATES_TIP = "Replies generated side by side for each message"
_display_name = sources.display_name


class MainWindow(QMainWindow):
    def __init__(self, store, bridge, settings: AppSettings,
                 persist: Callable[[AppSettings], object] = save_settings,
                 tools: ToolsBridge | None = None) -> None:
        super().__init__()
        self.setObjectName("mainWindow")
        self.setWindowTitle("Folio")
        self.setWindowIcon(theme.app_icon())
        self.store, self.bridge, self.settings = store, bridge, settings
        self._persist = persist
        # What the loaded model was loaded from (the bridge may arrive already loaded).
        self._current_source: str | None = bridge.source if bridge.is_loaded else None

        self.chat_list = ChatList()
        self.conversation = ConversationView()
        view = self.conversation
        # MCP servers' tools (mcp.json in the config folder), per chat.
        self.tools = tools if tools is not None else ToolsBridge(config_dir(), parent=self)
        self.tools_button = ChatToolsButton()  # on the toolbar
        self.tool_turns = ToolTurns(store, bridge, self.tools, self.tools_button, settings,
                                    persist, self)
        self.thinking = ThinkingControls(store, bridge, view.think_button, view.effort_box,
                                         self)
        self.json_mode = JsonModeController(store, view.json_button, view, self)
        self.controller = ChatController(store, bridge, view, settings, self.tool_turns,
                                         self.thinking, self)
        for shows_chat in (self.thinking.show_chat, self.json_mode.show_chat,
                           self.tool_turns.show_chat):
            self.controller.chatOpened.connect(shows_chat)
        self.tool_turns.continueRequested.connect(self.controller.continue_after)
        self.tool_turns.chatChanged.connect(self.controller.refresh_chat)
        sources.register_remembered_keys(bridge, settings)
        self.serve = ServeSwitch(bridge, settings, persist, self)  # the API on localhost
        self.serve_label = QLabel("")
        self.serve_label.setObjectName("serveStatus")
        self.serve_label.setAccessibleName("API server")
        self.statusBar().addPermanentWidget(self.serve_label)
        self.serve.statusChanged.connect(self.serve_label.setText)
        self.serve.errorRaised.connect(lambda t, m: error_dialog.show_error(self, t, m))
        splitter = QSplitter()
        splitter.setObjectName("mainSplitter")
        splitter.addWidget(self.chat_list)
        splitter.addWidget(self.conversation)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([250, 900])
        splitter.setHandleWidth(1)
        self.setCentralWidget(splitter)

        # The dock's chat look-ups, kept between its refreshes (controllers.dock_lookups).
        self.dock_lookups = DockLookups(store, self.controller, self)
        self.vram_panel = VramPanel(bridge, chat_of_owner=self.dock_lookups.chat_of_owner,
                                    chat_tokens=self.dock_lookups.open_chat_tokens,
                                    in_open_chat=self.dock_lookups.in_open_chat)
        self.vram_dock = QDockWidget("Memory", self)
        self.vram_dock.setObjectName("vramDock")
        self.vram_dock.setWidget(self.vram_panel)
        self.vram_dock.setMinimumWidth(280)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.vram_dock)

        self._build_toolbar()
        self.compare = CompareChoice(store, self.controller, bridge, settings, persist,
                                     self.compare_button, self)
        self.menus = WindowMenus(self)  # File, Help, Ctrl+N / Ctrl+R / Esc
        # The load's plain steps and the empty chat's welcome (controllers.load_display).
        self.load_display = LoadDisplay(bridge, self.load_progress,
                                        self.load_progress_action, self.statusBar(),
                                        view.welcome, self)
        view.welcome.promptChosen.connect(self._use_example)
        view.welcome.modelsRequested.connect(self.open_model_manager)

        self.chat_list.chatSelected.connect(self.open_chat)
        self.chat_list.newChatRequested.connect(self.new_chat)
        self.chat_list.renameRequested.connect(self._rename_chat)
        self.dock_lookups.invalidate_on(self.chat_list.renameRequested)
        self.chat_list.deleteRequested.connect(self.controller.delete_chat)
        self.chat_list.searchChanged.connect(lambda _text: self.refresh_chats())
        self.controller.chatsChanged.connect(self.refresh_chats)
        self.controller.streamsChanged.connect(
            lambda: self.chat_list.set_generating(self.controller.generating_chats()))
        self.controller.chatOpened.connect(self._on_chat_opened)
        self.controller.errorRaised.connect(lambda t, m: error_dialog.show_error(self, t, m))
        bridge.activityChanged.connect(self.vram_panel.set_busy)
        bridge.hostedChanged.connect(self.vram_panel.refresh)  # a model (un)loaded
        bridge.modelLoaded.connect(self._on_model_loaded)
        bridge.modelLoadFailed.connect(self._on_model_load_failed)
        bridge.modelUnloaded.connect(self._on_model_unloaded)

        self._restore_layout()
        self.refresh_chats()
        chats = store.list_chats()
        self.controller.open_chat(chats[0].id if chats else None)
        self.vram_panel.refresh()
        self.conversation.composer.setFocus()
        self.serve.start()
        self.tools.start()

    # -- construction --------------------------------------------------------------------
    def _build_toolbar(self) -> None:
        bar = QToolBar("Main")
        bar.setObjectName("mainToolbar")
        bar.setMovable(False)
        bar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.addToolBar(bar)
        # Ctrl+N lives on the window; the sidebar has the visible "New chat" button.
        self.new_chat_action = QAction(theme.icon("new-chat"), "New chat", self)
        self.new_chat_action.triggered.connect(self.new_chat)
        self.addAction(self.new_chat_action)
        self.model_picker = QComboBox()
        self.model_picker.setObjectName("modelPicker")
        self.model_picker.setAccessibleName("Model")
        self.model_picker.setMinimumWidth(240)
        self.model_picker.setToolTip("The model replies come from; pick one to load it")
        self.model_picker.activated.connect(self._on_picker_activated)
        bar.addWidget(self.model_picker)
        self.load_progress = QProgressBar()
        self.load_progress.setObjectName("loadProgress")
        self.load_progress.setRange(0, 100)
        self.load_progress.setFixedWidth(140)
        self.load_progress.setVisible(False)
        self.load_progress_action = bar.addWidget(self.load_progress)
        self.load_progress_action.setVisible(False)
        self.models_action = bar.addAction(theme.icon("model"), "Models…",
                                           self.open_model_manager)
        bar.addSeparator()
        bar.addWidget(QLabel(" Candidates "))
        self.candidates_spin = QSpinBox()
        self.candidates_spin.setObjectName("candidatesSpin")
        self.candidates_spin.setRange(1, MAX_CANDIDATES)
        self.candidates_spin.setToolTip(CANDIDATES_TIP)
        self.candidates_spin.valueChanged.connect(self._on_candidates_changed)
        bar.addWidget(self.candidates_spin)
        self.compare_button = CompareButton()  # its choice: controllers.compare_choice
        bar.addWidget(self.compare_button)
        bar.addWidget(self.tools_button)
        spacer = QWidget()
        spacer.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        bar.addWidget(spacer)
        self.vram_action = self.vram_dock.toggleViewAction()
        self.vram_action.setIcon(theme.icon("memory"))
        self.vram_action.setText("Memory")
        self.vram_action.setToolTip("Show or hide the memory panel")
        bar.addAction(self.vram_action)
        self.settings_action = bar.addAction(theme.icon("settings"), "Settings",
                                             self.open_settings)
        self._fill_model_picker()

    def _use_example(self, text: str) -> None:
        """An example prompt from the welcome: in the composer, to send or change."""
        self.conversation.composer.setPlainText(text)
        self.conversation.composer.setFocus()

    def _fill_model_picker(self) -> None:
        self.model_picker.blockSignals(True)
        self.model_picker.clear()
        for source in sources.picker_sources(self.settings, self._current_source):
            self.model_picker.addItem(_display_name(source), source)
        if self._current_source is None:
            self.model_picker.insertItem(0, "No model loaded", None)
        index = self.model_picker.findData(self._current_source)
        self.model_picker.setCurrentIndex(max(0, index))
        self.model_picker.blockSignals(False)

    # -- chats -----------------------------------------------------------------------------
    def new_chat(self) -> int:
        chat_id = self.controller.new_chat()
        self.conversation.composer.setFocus()
        return chat_id

    def open_chat(self, chat_id: int) -> None:
        if chat_id != self.controller.chat_id:
            self.controller.open_chat(chat_id)

    def refresh_chats(self) -> None:
        chats = self.store.list_chats(self.chat_list.search.text().strip())
        self.chat_list.set_chats(chats, self.controller.chat_id)

    def _rename_chat(self, chat_id: int, title: str) -> None:
        self.store.rename_chat(chat_id, title)
        self.refresh_chats()

    def _on_chat_opened(self, chat_id: int) -> None:
        self.chat_list.select(chat_id or None)
        self.vram_panel.refresh()  # the headroom is the open chat's
        chat = self.store.get_chat(chat_id).settings if chat_id else self.settings.chat_defaults
        self.candidates_spin.blockSignals(True)
        self.candidates_spin.setValue(chat.num_candidates)
        self.candidates_spin.blockSignals(False)
        # A beam search's width sets its replies (data.beam_choice).
        self.candidates_spin.setEnabled(not chat.beam_search)
        self.candidates_spin.setToolTip(SAMPLING_ONLY_NOTE if chat.beam_search else
                                        CANDIDATES_TIP)

    def _on_candidates_changed(self, value: int) -> None:
        if self.controller.chat_id is None:
            self.settings.chat_defaults.num_candidates = value
            self._persist(self.settings)
            return
        chat = self.store.get_chat(self.controller.chat_id)
        chat.settings.num_candidates = value
        self.store.update_chat_settings(chat.id, chat.settings)

    # -- models ----------------------------------------------------------------------------
    def load_model(self, source: str) -> None:
        choice = self.settings.model_templates.get(source)
        config = None if choice is None else template_config(
            self.bridge.engine_config or self.settings.engine.to_engine_config(), choice,
            source)
        self.bridge.load_model(source, config)

    def _on_picker_activated(self, index: int) -> None:
        source = self.model_picker.itemData(index)
        if source and source != self._current_source:
            self.load_model(source)

    def _on_model_loaded(self, name: str) -> None:
        source = self.bridge.source
        self._current_source = source
        if source:
            self.settings.last_model = source
            if source != STARTER and not self.bridge.is_remote:
                self.settings.remember_model_path(source)
            self._persist(self.settings)
        self._fill_model_picker()
        self.vram_panel.refresh()

    def _on_model_load_failed(self, source: str, message: str) -> None:
        self._fill_model_picker()
        still = (f"Folio keeps using {self.bridge.model_name}." if self.bridge.is_loaded
                 else "No model is loaded now.")
        error_dialog.show_error(self, "Could not load the model",
                                sources.load_failure_text(source, message, still))

    def _on_model_unloaded(self) -> None:
        self._current_source = None
        self._fill_model_picker()
        self.vram_panel.refresh()

    def open_model_manager(self) -> None:
        # Imported on first use: it pulls in huggingface_hub (downloads), a quarter of a
        # second at startup that most sessions never need.
        from desktop_app.dialogs.model_manager import ModelManagerDialog

        dialog = ModelManagerDialog(self.bridge, self.settings, self._persist, self)
        dialog.loadRequested.connect(self.load_model)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()
        self.model_manager = dialog

    # -- settings --------------------------------------------------------------------------
    def open_settings(self) -> SettingsDialog:
        chat = self.store.get_chat(self.controller.chat_id) if self.controller.chat_id else None
        dialog = SettingsDialog(chat.settings if chat else None, self.settings.chat_defaults,
                                parent=self, serve=(self.settings.serve_enabled,
                                                    self.settings.serve_port),
                                theme=self.settings.theme, engine=self.settings.engine,
                                tools=self.tools,
                                model=kv_precision.shape_of_source(self.bridge.source),
                                mtp_missing=devices.mtp_missing(self.bridge.source),
                                beam_refusal=self.bridge.beam_search_refusal)
        dialog.accepted.connect(lambda: self.apply_settings(dialog))
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def apply_settings(self, dialog: SettingsDialog) -> None:
        if dialog.result_chat is not None and self.controller.chat_id is not None:
            self.store.update_chat_settings(self.controller.chat_id, dialog.result_chat)
        if dialog.result_defaults is not None:
            self.settings.chat_defaults = dialog.result_defaults
            self._persist(self.settings)
        if dialog.result_serve is not None:
            self.serve.apply(*dialog.result_serve)
        if dialog.result_theme is not None and dialog.result_theme != self.settings.theme:
            self.set_theme(dialog.result_theme)
        if dialog.result_engine is not None and dialog.result_engine != self.settings.engine:
            self.settings.engine = dialog.result_engine
            self._persist(self.settings)
            self.bridge.apply_engine_settings(dialog.result_engine)  # reloads a local model
        self._on_chat_opened(self.controller.chat_id or 0)

    def set_theme(self, choice: str) -> None:
        """Settings ▸ Theme (system, light, dark): applied at once and kept."""
        self.settings.theme = choice
        self._persist(self.settings)
        theme.apply_theme(None, choice)
        self.retheme()

    def retheme(self) -> None:
        """The system switched light/dark: icons are tinted per theme, so redo them."""
        for action, name in ((self.new_chat_action, "new-chat"), (self.models_action, "model"),
                             (self.vram_action, "memory"), (self.settings_action, "settings"),
                             (self.menus.quit_action, "quit"),
                             (self.menus.docs_action, "help")):
            action.setIcon(theme.icon(name))
        self.chat_list.retheme()
        self.conversation.retheme()
        self.controller.render()

    # -- window state ----------------------------------------------------------------------
    def _restore_layout(self) -> None:
        if self.settings.window_geometry:
            self.restoreGeometry(QByteArray.fromBase64(self.settings.window_geometry.encode()))
        else:
            self.resize(1320, 820)
        # The Memory dock is for people who look under the hood: closed on a first run,
        # and then as the user last left it (saveState keeps whether it is open).
        if not (self.settings.dock_state and self.restoreState(
                QByteArray.fromBase64(self.settings.dock_state.encode()))):
            self.vram_dock.hide()

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt override
        self.controller.stop_all()
        self.settings.window_geometry = bytes(self.saveGeometry().toBase64()).decode()
        self.settings.dock_state = bytes(self.saveState().toBase64()).decode()
        self._persist(self.settings)
        self.vram_panel.timer.stop()
        self.serve.shutdown()
        self.tools.shutdown()
        self.bridge.shutdown()
        self.controller.leave()  # last: nothing it raises may skip the shutdowns above
        super().closeEvent(event)

