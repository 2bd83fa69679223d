"""Tool calls in chat turns: MCP tools shown to the model, its calls read from the reply,
run when the user says so, and the results sent back so the reply goes on.

Each chat's session (controllers.chat_session) asks this object at a few points:
``tool_request`` (the chat's tools, which the engine's prompt builder renders through the
model's own template; the engine reads each reply's calls, which arrive with the finished
candidate), ``finished`` and ``kept`` (a reply's calls become pending "tool" messages in
the chat tree, data.tool_records) and ``card`` (a tool message's card in the view). A
pending call waits for Run unless its tool is always allowed; the result arrives from the
ToolsBridge, is stored, and once every call of the reply has an answer
``continueRequested`` asks for the next reply after them: the same turn, continued.
``chatChanged`` says a chat's cards changed. A candidate's calls wait until the user keeps
it. Only local models read calls (a remote server gets no tools). The window wires the
signals and ``show_chat`` (the chat in view, whose tools the toolbar's button shows).
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from desktop_app.data import tool_records as records
from desktop_app.mcp.toolset import with_server, with_tool
from desktop_app.widgets.chat_tools import ChatToolsButton, ServerEntry
from desktop_app.widgets.tool_card import ToolCallCard, ToolCallView
from engine.tools.request import ToolRequest, tool_request

NO_FORMAT_NOTE = "This model has no tool-call format Folio reads: its tools stay off."
# Replies in a row whose calls run without asking (always allowed tools): past this, the
# next calls wait for Run, so a model that keeps calling cannot loop on its own.
MAX_AUTO_ROUNDS = 8


class ToolTurns(QObject):
    continueRequested = Signal(int, int)  # chat id, the last answer's id: go on after it
    chatChanged = Signal(int)  # chat id: its tool cards changed

    def __init__(self, store, bridge, tools_bridge, button: ChatToolsButton, app_settings,
                 persist: Callable[[object], object], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store, self.bridge = store, bridge
        self.tools = tools_bridge
        self.app_settings = app_settings
        self._persist = persist
        self._running: dict[str, int] = {}  # call id -> tool message id
        self.chat_id: int | None = None  # the chat in view
        self.button = button
        button.toggled_tool.connect(self._on_toggle)
        tools_bridge.callFinished.connect(self._on_result)
        tools_bridge.serversChanged.connect(self.refresh_button)
        for signal in (bridge.modelLoaded, bridge.modelUnloaded):
            signal.connect(lambda *_: self.refresh_button())
        self.refresh_button()

    # -- what the model is shown -------------------------------------------------------
    def model_tools(self):
        """What the local model can do with tools (engine.chat.tool_prompt.ModelTools);
        None for a remote model (it gets no tools) or none loaded."""
        prompts = self.bridge.prompts
        return None if prompts is None else prompts.tools

    def tool_request(self, chat) -> ToolRequest:
        """The tools a turn of ``chat`` shows the model: the chat's MCP tools, where the
        local model reads calls (earlier calls in the history are shown whatever this)."""
        model = self.model_tools()
        toolset = self.tools.toolset(chat.settings.tools)
        if model is None or not model.reads_calls or not toolset:
            return ToolRequest()
        return tool_request(toolset.definitions(), "auto", None)

    # -- what the model said -----------------------------------------------------------
    def finished(self, stream) -> None:
        """A request ended: a lone reply's calls are asked about (or run) at once."""
        if len(stream.message_ids) == 1:
            self._open_calls(stream.message_ids[0])

    def kept(self, message_id: int) -> None:
        self._open_calls(message_id)

    def _open_calls(self, reply_id: int) -> None:
        reply = self.store.get_message(reply_id)
        if not reply.tool_calls or reply.status != "complete" or self.store.children(reply_id):
            return
        toolset = self.tools.toolset(self.store.get_chat(reply.chat_id).settings.tools)
        auto = self._rounds(reply.id) <= MAX_AUTO_ROUNDS
        parent = reply.id
        for call in reply.tool_calls:
            tool = toolset.resolve(call["name"])
            server, name = (tool.server, tool.name) if tool else ("", call["name"])
            msg = self.store.add_message(reply.chat_id, parent, "tool", "",
                                         tool_call=records.record(call, server, name))
            parent = msg.id
            if tool is None:
                self._answer(msg.id, f"Error: no tool named {call['name']!r} is on in this "
                             "chat", records.ERROR)
            elif auto and self._always(server, name):
                self.run(msg.id)
        self.chatChanged.emit(reply.chat_id)
        self._continue_if_answered(parent)

    # -- the user's answer ---------------------------------------------------------------
    def run(self, message_id: int) -> None:
        msg = self.store.get_message(message_id)
        call = msg.tool_call
        if call is None or call["state"] != records.PENDING or str(message_id) in self._running:
            return
        try:
            arguments = records.arguments_of(call)
        except ValueError as exc:
            self._answer(message_id, f"Error: {exc}", records.ERROR)
            self._continue_if_answered(message_id)
            return
        self._running[str(message_id)] = message_id
        self.tools.call(str(message_id), call["server"], call["tool"], arguments)
        self.chatChanged.emit(msg.chat_id)

    def always_allow(self, message_id: int) -> None:
        call = self.store.get_message(message_id).tool_call
        key = f"{call['server']}/{call['tool']}"
        if key not in self.app_settings.always_allowed_tools:
            self.app_settings.always_allowed_tools.append(key)
            self._persist(self.app_settings)
        self.run(message_id)

    def deny(self, message_id: int) -> None:
        call = self.store.get_message(message_id).tool_call
        if call is None or call["state"] != records.PENDING or str(message_id) in self._running:
            return
        self._answer(message_id, records.DENIED_TEXT, records.DENIED)
        self._continue_if_answered(message_id)

    def _always(self, server: str, tool: str) -> bool:
        return f"{server}/{tool}" in self.app_settings.always_allowed_tools

    def _on_result(self, call_id: str, result) -> None:
        message_id = self._running.pop(call_id, None)
        if message_id is None:
            return
        try:
            self.store.get_message(message_id)
        except KeyError:
            return  # the chat was deleted while the tool ran
        self._answer(message_id, result.text, records.DONE if result.ok else records.ERROR)
        self._continue_if_answered(message_id)

    def _answer(self, message_id: int, text: str, state: str) -> None:
        msg = self.store.get_message(message_id)
        self.store.set_tool_result(message_id, text, {**msg.tool_call, "state": state})
        self.chatChanged.emit(msg.chat_id)

    def _continue_if_answered(self, message_id: int) -> None:
        """Once every call of a reply has its answer, the reply goes on after the last (the
        chat's session starts it unless that chat is generating)."""
        chain = self._chain(message_id)
        if not chain or any(m.tool_call["state"] == records.PENDING for m in chain):
            return
        last = chain[-1]
        if not self.store.children(last.id):
            self.continueRequested.emit(last.chat_id, last.id)

    def _rounds(self, reply_id: int) -> int:
        """Replies with calls since the user last wrote, this one included."""
        rounds = 0
        for msg in reversed(self.store.path_to(reply_id)):
            if msg.role == "user":
                break
            rounds += bool(msg.role == "assistant" and msg.tool_calls)
        return rounds

    def _chain(self, message_id: int) -> list:
        """The tool messages answering the calls of the reply this one answers."""
        msg = self.store.get_message(message_id)
        while msg.role == "tool" and msg.parent_id is not None:
            msg = self.store.get_message(msg.parent_id)
        chain, current = [], msg.id
        while True:
            tools = [m for m in self.store.children(current) if m.role == "tool"]
            if not tools:
                return chain
            chain.append(tools[0])
            current = tools[0].id

    # -- the view ------------------------------------------------------------------------
    def card(self, msg) -> ToolCallCard:
        call = msg.tool_call
        running = str(msg.id) in self._running
        card = ToolCallCard(ToolCallView(
            msg.id, call["name"], call["server"] or "no server", call["arguments"],
            "running" if running else call["state"], msg.content))
        card.runRequested.connect(self.run)
        card.alwaysRequested.connect(self.always_allow)
        card.denyRequested.connect(self.deny)
        return card

    @staticmethod
    def candidate_text(msg) -> str:
        """A candidate's text with the calls it would make, while it waits for Keep."""
        calls = "".join(f"\n\n`{c['name']}` `{c['arguments']}`" for c in msg.tool_calls or ())
        return msg.content + (f"{calls}\n\n*Keep this candidate to run its tool calls.*"
                              if calls else "")

    # -- the chat's Tools button ---------------------------------------------------------
    def show_chat(self, chat_id: int) -> None:
        """The chat in view changed (0: none)."""
        self.chat_id = chat_id or None
        self.refresh_button()

    def refresh_button(self) -> None:
        chat_id = self.chat_id
        selection = self.store.get_chat(chat_id).settings.tools if chat_id else {}
        entries = []
        for server in self.tools.config.servers:
            status = self.tools.statuses.get(server.name)
            known = self.tools.known_tools.get(server.name, ())
            chosen = selection.get(server.name, ())
            entries.append(ServerEntry(server.name, status.state if status else "starting",
                                       server.name in selection, tuple(
                                           (t.name, chosen is None or t.name in (chosen or ()))
                                           for t in known)))
        model = self.model_tools()
        note = ("Add MCP servers in Settings ▸ Tools." if not entries else
                "Open a chat to choose its tools." if chat_id is None else
                NO_FORMAT_NOTE if model is not None and not model.reads_calls else "")
        self.button.set_entries(entries, note)
        self.button.setEnabled(chat_id is not None or not entries)

    def _on_toggle(self, server: str, tool: str, on: bool) -> None:
        chat_id = self.chat_id
        if chat_id is None:
            return
        chat = self.store.get_chat(chat_id)
        known = self.tools.known_tools.get(server, ())
        if tool:
            info = next((t for t in known if t.name == tool), None)
            if info is None:
                return
            chat.settings.tools = with_tool(chat.settings.tools, info, on,
                                            [t.name for t in known])
        else:
            chat.settings.tools = with_server(chat.settings.tools, server, on)
        self.store.update_chat_settings(chat_id, chat.settings)
        self.refresh_button()

