"""Chat turns: from the composer to the engine and back into the store and the view.

Runs on the GUI thread only. It appends user messages to the chat store, submits the
active branch (with the exact token ids of earlier replies, so the engine's prefix cache
finds their blocks) through the bridge, streams tokens into the view, saves partial text
a few times a second (a crash loses little), and stores the final text, token ids and
metrics. Alternates (candidates, regenerations, edits) are siblings in the chat tree.

Several chats may stream at once (the engine batches them): each stream belongs to its
chat, the view shows the one open (its partial text keeps growing when you switch to it),
and Stop stops the chat in view only. What is sent must fit the model's context: the
chat's overflow policy (data.context_policy) picks the messages, measured by the loaded
model's prompt builder (controllers.context_window), and the prompt it measured is what
the engine runs; the stored chat is never shortened. The engine reads every reply: each
delta arrives as typed parts (answer text, thinking) and the finished candidate carries
its answer, thinking and tool calls; nothing here parses a reply.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from PySide6.QtCore import QObject, QTimer, Signal

from desktop_app.controllers import context_window
from desktop_app.controllers.context_window import ContextTracker, branch_tokens
from desktop_app.controllers.json_mode import JsonModeController, reply_metrics
from desktop_app.controllers.pending_send import PendingSend
from desktop_app.controllers.thinking import DROPPED_METRIC, ThinkingControls
from desktop_app.data.context_policy import ContextPlan
from desktop_app.data.settings import AppSettings, ChatSettings
from desktop_app.widgets.conversation_view import ConversationView, GroupItem
from desktop_app.widgets.message_widget import TurnItem
from engine.chat import ChatRequest
from engine.outputs import ReplyMessage, TextDelta, Thinking
from engine.tools.request import ToolRequest

SAVE_INTERVAL_S = 0.25
GAUGE_DELAY_MS = 150
DEFAULT_TITLE = "New chat"
TITLE_LENGTH = 48


@dataclass(slots=True)
class Stream:
    request_id: str
    chat_id: int
    parent_id: int
    message_ids: list[int]
    texts: list[str]
    last_saved: float = 0.0
    prompt_tokens: int = 0  # as measured when it was sent (the gauge, while streaming)
    reply_metrics: dict | None = None  # what the replies record of how they were asked
    thinking: list[str] = field(default_factory=list)  # a reasoning model's, per reply


def metrics_dict(metrics) -> dict:
    return asdict(metrics) if metrics is not None else {}


def title_from(text: str) -> str:
    """A chat title from its first message: one line, Markdown marks dropped."""
    line = " ".join(text.replace("`", "").replace("*", "").replace("#", "").split())
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1].rstrip() + "…"


class ChatController(QObject):
    chatOpened = Signal(int)  # chat id (0: none)
    chatsChanged = Signal()  # titles or activity order changed
    generatingChanged = Signal(bool)  # whether the chat in view is generating
    streamsChanged = Signal()  # a chat started or stopped generating (generating_chats)
    errorRaised = Signal(str, str)  # title, text
    turnFinished = Signal(int)  # chat id

    def __init__(self, store, bridge, view: ConversationView, app_settings: AppSettings,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.bridge = bridge
        self.view = view
        self.app_settings = app_settings
        self.chat_id: int | None = None
        self.streams: dict[str, Stream] = {}
        # chat id -> candidate group whose columns wait for "Keep" (view state only: after
        # a restart the kept, or first, candidate shows with its "‹ i/n ›" navigator).
        self.pending_group: dict[int, int] = {}
        # Where each chat's overflow policy last cut, so the next prompts start the same
        # way and the prefix cache hits again.
        self.context = ContextTracker()
        # A message sent while the first model loads waits for it.
        self.pending = PendingSend(bridge, view, self._send_to, self)
        # MCP tool calls in turns: the window wires its controllers.tool_turns.ToolTurns.
        self.tools = None
        self.json_mode = JsonModeController(self, view.json_button)
        self.thinking = ThinkingControls(self)
        view.sendRequested.connect(self.send)
        view.stopRequested.connect(self.stop)
        view.regenerateRequested.connect(self.regenerate)
        view.switchRequested.connect(self.switch)
        view.editSubmitted.connect(self.edit)
        view.keepRequested.connect(self.keep)
        bridge.tokenArrived.connect(self._on_token)
        bridge.requestFinished.connect(self._on_finished)
        bridge.requestFailed.connect(self._on_failed)
        for signal in (bridge.modelLoaded, bridge.modelUnloaded):
            signal.connect(lambda *_: self.update_gauge())
            signal.connect(lambda *_: self.thinking.refresh())
        bridge.modelLoaded.connect(lambda *_: self._load_ahead())
        # The gauge counts the draft too: re-measured once typing pauses.
        self._gauge_timer = QTimer(self)
        self._gauge_timer.setSingleShot(True)
        self._gauge_timer.setInterval(GAUGE_DELAY_MS)
        self._gauge_timer.timeout.connect(lambda: self.update_gauge(recount=False))
        self._gauge_base = 0  # tokens the chat in view holds, as last counted
        view.composer.textChanged.connect(self._gauge_timer.start)

    # -- chats -----------------------------------------------------------------------------
    @property
    def generating(self) -> bool:
        """Whether any chat is generating."""
        return bool(self.streams)

    def is_generating(self, chat_id: int | None) -> bool:
        return chat_id is not None and any(s.chat_id == chat_id for s in self.streams.values())

    def generating_chats(self) -> set[int]:
        return {s.chat_id for s in self.streams.values()}

    def new_chat(self) -> int:
        defaults = ChatSettings.from_dict(self.app_settings.chat_defaults.to_dict())
        chat = self.store.create_chat(DEFAULT_TITLE, defaults)
        self.chatsChanged.emit()
        self.open_chat(chat.id)
        return chat.id

    def open_chat(self, chat_id: int | None) -> None:
        self.chat_id = chat_id
        self.render()
        self.chatOpened.emit(chat_id or 0)
        self._load_ahead()

    def _load_ahead(self) -> None:
        """The chat in view (opened, or there when a model loads) gets its history's KV
        blocks from disk now, while the user types, not when the next turn is sent."""
        leaf = None if self.chat_id is None else self.store.active_leaf(self.chat_id)
        if leaf is not None and self.bridge.is_loaded and not self.is_generating(self.chat_id):
            # The whole branch, not the context plan: planning counts every token here
            # on the GUI thread, and the engine loads only what its pool has room for.
            chat = self.store.get_chat(self.chat_id)
            self.bridge.preload(self._request(chat, self.store.messages_for_engine(leaf)))

    def delete_chat(self, chat_id: int) -> None:
        for stream in [s for s in self.streams.values() if s.chat_id == chat_id]:
            self.bridge.cancel(stream.request_id)
            del self.streams[stream.request_id]
        self.store.delete_chat(chat_id)
        self.pending_group.pop(chat_id, None)
        self.context.forget(chat_id)
        self._set_generating()
        if self.chat_id == chat_id:
            self.open_chat(None)
        self.chatsChanged.emit()

    def render(self) -> None:
        if self.chat_id is None:
            self.view.show_items([])
        else:
            leaf = self.store.active_leaf(self.chat_id)
            self.view.show_items(self.branch_items(leaf) if leaf is not None else [])
        self.view.set_generating(self.is_generating(self.chat_id))
        self.json_mode.refresh()
        self.thinking.refresh()
        self.update_gauge()

    def branch_items(self, leaf_id: int) -> list:
        live = {mid: s.texts[i] for s in self.streams.values()
                for i, mid in enumerate(s.message_ids)}
        thought = {mid: s.thinking[i] for s in self.streams.values()
                   for i, mid in enumerate(s.message_ids) if s.thinking}
        items: list = []
        pending = self.pending_group.get(self.chat_id)
        for msg in self.store.path_to(leaf_id):
            if msg.id in live:
                msg.content = live[msg.id]  # fresher than the last partial save
            msg.thinking = thought.get(msg.id, msg.thinking)
            if msg.role == "tool" and self.tools is not None:
                items.append(self.tools.card(msg))
            elif msg.role == "assistant" and pending is not None and msg.candidate_group == pending:
                group = [s for s in self.store.siblings(msg.id) if s.candidate_group == pending]
                group.sort(key=lambda m: m.candidate_index or 0)
                for m in group:
                    m.content = live.get(m.id, m.content)
                    m.thinking = thought.get(m.id, m.thinking)
                    if self.tools is not None:
                        m.content = self.tools.candidate_text(m)
                items.append(GroupItem(group))
            else:
                position, count = self.store.sibling_position(msg.id)
                items.append(TurnItem(msg, position, count))
        return items

    # -- turns -----------------------------------------------------------------------------
    def send(self, text: str) -> None:
        text = text.strip()
        if not text or self.is_generating(self.chat_id) or self.pending.waiting:
            return
        if not self.bridge.is_loaded:
            if self.bridge.is_loading:
                self.pending.hold(self.chat_id, text)
                return
            self.errorRaised.emit("No model loaded", "Load a model from the model picker in "
                                  "the toolbar, then send your message again.")
            return
        self._send_to(self.chat_id, text)

    def _send_to(self, chat_id: int | None, text: str) -> None:
        """Send `text` in chat `chat_id` (a new chat for None or a chat deleted since)."""
        try:
            chat = self.store.get_chat(chat_id) if chat_id is not None else None
        except KeyError:
            chat = None
        if chat is None:
            chat = self.store.get_chat(self.new_chat())
        leaf = self.store.active_leaf(chat.id)
        plan = self._plan(chat.id, leaf, text)
        if plan is None:
            return  # refused: nothing stored, the draft stays in the composer
        self.pending_group.pop(chat.id, None)  # continuing keeps the candidate on screen
        user = self.store.add_message(chat.id, leaf, "user", text)
        if chat.title == DEFAULT_TITLE and leaf is None:
            self.store.rename_chat(chat.id, title_from(text))
        self.view.clear_composer()
        self._generate(chat.id, user.id, plan)
        self.chatsChanged.emit()

    def edit(self, message_id: int, text: str) -> None:
        """A new user message beside the edited one: a new branch from that point."""
        if not self.bridge.is_loaded:
            return
        old = self.store.get_message(message_id)
        if self.is_generating(old.chat_id):
            return
        plan = self._plan(old.chat_id, old.parent_id, text)
        if plan is None:
            return
        self.pending_group.pop(old.chat_id, None)
        new = self.store.add_message(old.chat_id, old.parent_id, "user", text)
        self._generate(old.chat_id, new.id, plan)

    def regenerate(self, message_id: int = 0) -> None:
        """Add alternates to a reply (0: the last one); the prompt is submitted again and
        the engine's prefix cache shares its blocks instead of recomputing them."""
        if self.is_generating(self.chat_id) or self.chat_id is None or not self.bridge.is_loaded:
            return
        if message_id:
            target = self.store.get_message(message_id)
        else:
            leaf = self.store.active_leaf(self.chat_id)
            if leaf is None:
                return
            target = self.store.get_message(leaf)
        parent_id = target.parent_id if target.role == "assistant" else target.id
        if parent_id is None:
            return
        plan = self._plan(self.chat_id, parent_id)
        if plan is None:
            return
        self.pending_group.pop(self.chat_id, None)
        self._generate(self.chat_id, parent_id, plan)

    def keep(self, message_id: int) -> None:
        msg = self.store.get_message(message_id)
        self.pending_group.pop(msg.chat_id, None)
        self.store.set_active_leaf(msg.chat_id, self.store.leaf_of(message_id))
        if self.tools is not None:
            self.tools.kept(message_id)  # its tool calls may run now
        if msg.chat_id == self.chat_id:
            self.render()

    def continue_after(self, chat_id: int, parent_id: int) -> None:
        """The reply after tool results: the same turn, continued."""
        if self.bridge.is_loaded and not self.is_generating(chat_id):
            self._generate(chat_id, parent_id)

    def switch(self, message_id: int, step: int) -> None:
        """Show the previous / next alternate of a turn, with that branch's later turns."""
        if self.is_generating(self.chat_id):
            return
        siblings = self.store.siblings(message_id)
        ids = [m.id for m in siblings]
        target = ids[max(0, min(len(ids) - 1, ids.index(message_id) + step))]
        msg = siblings[ids.index(target)]
        self.pending_group.pop(msg.chat_id, None)
        self.store.set_active_leaf(msg.chat_id, self.store.leaf_of(target))
        self.render()

    def stop(self) -> None:
        """Stop the replies of the chat in view (other chats keep generating), or take
        back a message waiting for the model."""
        self.pending.cancel()
        for stream in list(self.streams.values()):
            if stream.chat_id == self.chat_id:
                self.bridge.cancel(stream.request_id)

    def stop_all(self) -> None:
        for stream in list(self.streams.values()):
            self.bridge.cancel(stream.request_id)

    # -- the context window ----------------------------------------------------------------
    def _plan(self, chat_id: int, leaf_id: int | None, new_text: str | None = None
              ) -> ContextPlan | None:
        """What to send for a reply after `leaf_id` (plus a new user message `new_text`),
        under the chat's overflow policy; None when it is refused (the user is told)."""
        chat = self.store.get_chat(chat_id)
        try:
            plan = self.context.plan(self.store, self.bridge, chat_id, leaf_id, new_text,
                                     lambda messages: self._request(chat, messages))
        except ValueError as exc:  # the model's template or its tools refuse the chat
            self.errorRaised.emit("Could not start the reply", str(exc))
            return None
        if plan.refused:
            self.errorRaised.emit("Context full", plan.refused)
            return None
        return plan

    def update_gauge(self, recount: bool = True) -> None:
        """The context gauge: what the engine counted for the chat in view (its last
        reply's prompt and reply tokens), plus the draft being typed. recount=False (while
        typing) reuses the last count instead of reading the store."""
        total = self.bridge.max_model_len if self.bridge.is_loaded else None
        if recount:
            live = [s for s in self.streams.values() if s.chat_id == self.chat_id]
            self._gauge_base = (0 if self.chat_id is None else live[0].prompt_tokens if live
                                else self.current_chat_tokens())
        used, notes = self._gauge_base, []
        if self.context.note(self.chat_id):
            notes.append(self.context.note(self.chat_id))
        draft = self.view.composer.toPlainText().strip() if total else ""
        if draft:
            extra = context_window.text_tokens(self.bridge.tokenizer, draft)
            used += extra
            notes.append(f"including about {extra:,} tokens of your draft")
        self.view.set_context(used, total, "\n".join(notes))

    def _request(self, chat, messages: list[dict]) -> ChatRequest:
        """The turn as the engine's prompt builder takes it: the messages with the chat's
        tools and the template options of its Think switch and effort."""
        tools = self.tools.tool_request(chat) if self.tools is not None else ToolRequest()
        return ChatRequest(messages, tools, self.thinking.options(chat))

    def _generate(self, chat_id: int, parent_id: int, plan: ContextPlan | None = None) -> None:
        chat = self.store.get_chat(chat_id)
        try:
            params = chat.settings.to_sampling_params()
            if plan is None:
                plan = self._plan(chat_id, parent_id)
                if plan is None:
                    return
            # The prompt the planner measured (a local model), else the messages.
            request_id = self.bridge.submit(plan.prompt if plan.prompt is not None
                                            else plan.messages, params)
        except (RuntimeError, ValueError) as exc:
            self.render()
            self.errorRaised.emit("Could not start the reply", str(exc))
            return
        recomputed = plan.prompt.recomputed if plan.prompt is not None else 0
        replies = self.store.add_candidates(chat_id, parent_id, params.n,
                                            model=self.bridge.model_name)
        if params.n > 1:
            self.pending_group[chat_id] = replies[0].candidate_group
        self.streams[request_id] = Stream(request_id, chat_id, parent_id,
                                          [m.id for m in replies], [""] * len(replies),
                                          time.monotonic(), plan.prompt_tokens,
                                          {**reply_metrics(params),
                                           **({DROPPED_METRIC: recomputed} if recomputed
                                              else {})},
                                          [""] * len(replies))
        self._set_generating()
        if chat_id == self.chat_id:
            self.render()

    # -- engine events -----------------------------------------------------------------------
    def _on_token(self, request_id: str, index: int, parts: tuple) -> None:
        stream = self.streams.get(request_id)
        if stream is None or not 0 <= index < len(stream.texts):
            return
        # A call's parts are not shown as they stream: it comes whole with the reply.
        thought = "".join(p.text for p in parts if isinstance(p, Thinking))
        text = "".join(p.text for p in parts if isinstance(p, TextDelta))
        self._show(stream, index, thought, text)
        now = time.monotonic()
        if now - stream.last_saved >= SAVE_INTERVAL_S:
            stream.last_saved = now
            for mid, partial, thinking in zip(stream.message_ids, stream.texts,
                                              stream.thinking, strict=True):
                self.store.set_partial(mid, partial, thinking)

    def _show(self, stream: Stream, index: int, thought: str, text: str) -> None:
        """A delta of a reply's thinking and answer, into the stream and the view."""
        stream.thinking[index] += thought
        stream.texts[index] += text
        if stream.chat_id != self.chat_id:
            return
        if thought:
            self.view.append_thinking(stream.message_ids[index], thought)
        if text:
            self.view.append_text(stream.message_ids[index], text)

    def _on_finished(self, request_id: str, output) -> None:
        stream = self.streams.pop(request_id, None)
        if stream is None:
            return
        base = metrics_dict(output.metrics)
        by_index = {c.index: c for c in output.outputs}
        for i, mid in enumerate(stream.message_ids):
            done = by_index.get(i)
            reply = (done.reply or ReplyMessage(done.text)) if done is not None else \
                ReplyMessage(stream.texts[i])
            # A remote server sends text only: no ids, so the next turn re-tokenizes it.
            token_ids = list(done.token_ids) if done is not None and done.token_ids else None
            reason = done.finish_reason if done is not None else "abort"
            calls = [{"id": c.id, "name": c.name, "arguments": c.arguments}
                     for c in reply.calls] or None
            think_metrics = ({"thinking_tokens": reply.thinking_tokens,
                              "thinking_s": reply.thinking_s}
                             if reply.thinking_tokens else {})
            thinking = reply.reasoning if reply.reasoning is not None else stream.thinking[i]
            self.store.finish_message(mid, reply.content, token_ids,
                                      {**base, "finish_reason": reason,
                                       **(stream.reply_metrics or {}), **think_metrics},
                                      tool_calls=calls, thinking=thinking)
            if stream.chat_id == self.chat_id:
                shown = self.store.get_message(mid)
                if self.tools is not None and len(stream.message_ids) > 1:
                    shown.content = self.tools.candidate_text(shown)
                self.view.finish_message(shown)
        if self.tools is not None:
            self.tools.finished(stream)
        self._set_generating()
        self.update_gauge()
        self.chatsChanged.emit()
        self.turnFinished.emit(stream.chat_id)

    def _on_failed(self, request_id: str, message: str) -> None:
        stream = self.streams.pop(request_id, None)
        if stream is None:
            return
        for mid, text, thought in zip(stream.message_ids, stream.texts, stream.thinking,
                                      strict=True):
            if text or thought:
                self.store.finish_message(mid, text, None, {"error": message}, "interrupted",
                                          thinking=thought)
            else:
                self.store.delete_message(mid)
        if not any(stream.texts) and not any(stream.thinking):
            self.pending_group.pop(stream.chat_id, None)
            self.store.set_active_leaf(stream.chat_id, stream.parent_id)
        self._set_generating()
        if stream.chat_id == self.chat_id:
            self.render()
        self.chatsChanged.emit()
        advice = ("Check that the server is running, then regenerate the reply or send "
                  "again." if getattr(self.bridge, "is_remote", False) else
                  "Shorten the message, start a new chat, or load a model with a longer "
                  "context, then try again.")
        self.errorRaised.emit("The reply failed", f"{message}\n\nYour chat is saved: nothing "
                              f"was lost. {advice}")

    def _set_generating(self) -> None:
        here = self.is_generating(self.chat_id)
        self.view.set_generating(here)
        self.generatingChanged.emit(here)
        self.streamsChanged.emit()

    # -- for the VRAM panel ------------------------------------------------------------------
    def chat_of_owner(self, owner: str) -> str | None:
        stream = self.streams.get(owner.rsplit(":", 1)[0])
        if stream is None:
            return None
        try:
            return self.store.get_chat(stream.chat_id).title
        except KeyError:
            return None

    def current_chat_tokens(self) -> int:
        """Tokens of the open branch as of its last reply (what the context holds)."""
        return branch_tokens(self.store, self.chat_id)
