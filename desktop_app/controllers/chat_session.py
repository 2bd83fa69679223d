"""One chat's turns: a ``ChatSession`` for each chat with a reply in flight or open.

It owns what belongs to that chat alone: its streams (request id -> the ``Stream`` whose
replies it writes; several chats stream at once, each into its own session), the
candidates waiting for Keep, and where its overflow policy last cut. It appends user
messages to the store, plans what is sent (the chat's overflow policy, measured by the
loaded model's prompt builder, controllers.context_window: the prompt it measured is what
the engine runs, and the stored chat is never shortened), submits through the bridge, and
stores each reply's text, token ids (so the engine's prefix cache finds their blocks next
turn) and metrics. Alternates (candidates, regenerations, edits) are siblings in the chat
tree. "Continue" extends the branch's last reply in place when it was cut off: the engine
builds the prompt it answered with the reply's own ids after it, its turn left open
(engine/chat/continued.py), so the prefix cache finds all of it.

It never touches the view: the ChatController routes the bridge's events for its request
ids here and shows what it emits when its chat is the one open (``replyDelta`` as replies
stream, ``changed`` when its branch must be drawn again). Runs on the GUI thread only.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QObject, Signal

from desktop_app.controllers.compare_turns import CompareTurns
from desktop_app.controllers.context_window import ContextTracker, branch_tokens
from desktop_app.controllers.json_mode import reply_metrics
from desktop_app.controllers.stream import Stream
from desktop_app.controllers.thinking import DROPPED_METRIC, ThinkingControls
from desktop_app.controllers.tool_turns import ToolTurns
from desktop_app.data.attachments import Attachment, with_prompt_modes
from desktop_app.data.attachments import message_content as attached_content
from desktop_app.data.beam_choice import beam_width, replies_of, turn_params
from desktop_app.data.chat_titles import DEFAULT_TITLE, title_from
from desktop_app.data.context_policy import ContextPlan
from desktop_app.widgets.conversation_view import GroupItem
from desktop_app.widgets.message_widget import TurnItem
from engine.chat import ChatRequest

NO_CONTINUE_REMOTE = ("A server's reply cannot be continued: its API has no way to go on "
                      "with a reply. Regenerate it, or raise Max tokens in Settings first.")


class ChatSession(QObject):
    replyDelta = Signal(int, int, str, str)  # chat id, reply id, its thinking, its text
    readingChanged = Signal(int, str)  # chat id, request id: its prompt read further, or done
    replyFinished = Signal(int, object)  # chat id, the finished reply as it shows
    changed = Signal(int)  # chat id: its branch must be shown again
    streamsChanged = Signal(int)  # chat id: a reply started or ended
    messageSent = Signal()  # the user's message is stored: the draft is sent
    chatsChanged = Signal()  # its title or activity order changed
    turnFinished = Signal(int)  # chat id
    errorRaised = Signal(str, str)  # title, text

    def __init__(self, chat_id: int, store, bridge, tools: ToolTurns,
                 thinking: ThinkingControls, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.chat_id = chat_id
        self.store, self.bridge = store, bridge
        self.tools, self.thinking = tools, thinking
        self.streams: dict[str, Stream] = {}
        # The candidate group whose columns wait for "Keep" (view state only: after a
        # restart the kept, or first, candidate shows with its "‹ i/n ›" navigator).
        self.pending_group: int | None = None
        # Where the overflow policy last cut, so the next prompts start the same way and
        # the prefix cache hits again.
        self.context = ContextTracker()
        self.compare = CompareTurns(self)  # the columns of its "Compare with" models

    @property
    def generating(self) -> bool:
        return bool(self.streams) or self.compare.waiting

    @property
    def idle(self) -> bool:
        """Nothing to keep once it is out of view: no reply, candidates or cut (the
        picker's model's, or a compared model's)."""
        return (not self.generating and self.pending_group is None and not self.context_note
                and not self.compare.cut)

    def owns(self, request_id: str) -> bool:
        return request_id in self.streams

    # -- what the view shows -----------------------------------------------------------
    @property
    def context_note(self) -> str:
        return self.context.note(self.chat_id)

    def context_tokens(self) -> int:
        """What the context holds: the prompt measured for the reply streaming, else the
        engine's count of the branch as of its last reply."""
        live = next(iter(self.streams.values()), None)
        return live.prompt_tokens if live else branch_tokens(self.store, self.chat_id)

    def items(self) -> list:
        """The open branch as the view's items, with the text streamed so far."""
        leaf = self.store.active_leaf(self.chat_id)
        if leaf is None:
            return []
        live = {mid: both for s in self.streams.values() for mid, both in s.live().items()}
        items: list = []
        for msg in self.store.path_to(leaf):
            msg.content, msg.thinking = live.get(msg.id, (msg.content, msg.thinking))
            if msg.role == "tool":
                items.append(self.tools.card(msg))
            elif msg.role == "assistant" and self.pending_group is not None and \
                    msg.candidate_group == self.pending_group:
                group = [m for m in self.store.siblings(msg.id)
                         if m.candidate_group == self.pending_group]
                group.sort(key=lambda m: m.candidate_index or 0)
                for m in group:
                    m.content, m.thinking = live.get(m.id, (m.content, m.thinking))
                    m.content = self.tools.candidate_text(m)
                items.append(GroupItem(group))
            else:
                position, count = self.store.sibling_position(msg.id)
                items.append(TurnItem(msg, position, count, last=msg.id == leaf,
                                      attachment_data=self.store.attachment_data))
        return items

    def preload(self) -> None:
        """Its history's KV blocks from disk now, while the user types, not when the next
        turn is sent."""
        leaf = self.store.active_leaf(self.chat_id)
        if leaf is not None and self.bridge.is_loaded and not self.generating:
            # The whole branch, not the context plan: planning counts every token here
            # on the GUI thread, and the engine loads only what its pool has room for.
            chat = self.store.get_chat(self.chat_id)
            self.bridge.preload(self.request(
                chat, self.store.messages_for_engine(leaf, self.bridge.model_name)))

    # -- turns -------------------------------------------------------------------------
    def send(self, text: str, attachments: list[Attachment] | tuple = ()) -> None:
        """attachments: the composer's images and documents, with their bytes."""
        chat = self.store.get_chat(self.chat_id)
        leaf = self.store.active_leaf(self.chat_id)
        plan = self.plan(leaf, text, attachments)
        if plan is None:
            return  # refused: nothing stored, the draft stays in the composer
        self.pending_group = None  # continuing keeps the candidate on screen
        # Each document's tokens and mode (whole or searched) as the engine built them.
        attachments = with_prompt_modes(attachments, plan.prompt)
        user = self.store.add_message(self.chat_id, leaf, "user", text,
                                      attachments=attachments)
        if chat.title == DEFAULT_TITLE and leaf is None:
            self.store.rename_chat(self.chat_id, title_from(text or attachments[0].name))
        self.messageSent.emit()
        self._generate(user.id, plan)
        self.chatsChanged.emit()

    def edit(self, message_id: int, text: str) -> None:
        """A new user message beside the edited one: a new branch from that point."""
        old = self.store.get_message(message_id)
        plan = self.plan(old.parent_id, text, old.attachments)
        if plan is None:
            return
        self.pending_group = None
        new = self.store.add_message(self.chat_id, old.parent_id, "user", text,
                                     attachments=old.attachments)  # the same files
        self._generate(new.id, plan)

    def regenerate(self, message_id: int = 0) -> None:
        """Add alternates to a reply (0: the last one); the prompt is submitted again and
        the engine's prefix cache shares its blocks instead of recomputing them."""
        target = message_id or self.store.active_leaf(self.chat_id)
        if not target:
            return
        msg = self.store.get_message(target)
        parent_id = msg.parent_id if msg.role == "assistant" else msg.id
        if parent_id is None:
            return
        plan = self.plan(parent_id)
        if plan is None:
            return
        self.pending_group = None
        self._generate(parent_id, plan)

    def continue_after(self, parent_id: int) -> None:
        """The reply after tool results: the same turn, continued."""
        self._generate(parent_id)

    def continue_reply(self, message_id: int) -> None:
        """Extend the branch's last reply, cut off at max tokens or stopped, in place."""
        msg = self.store.get_message(message_id)
        if msg.role != "assistant" or message_id != self.store.active_leaf(self.chat_id):
            return  # only the end of the branch: later turns answered it as it was
        if msg.model and msg.model != self.bridge.model_name:
            # Its ids are another vocabulary's: only the model that wrote it goes on.
            self.errorRaised.emit("Could not continue the reply", (
                f"This reply was written by {msg.model}. Load that model to continue it, "
                f"or regenerate it with {self.bridge.model_name}."))
            return
        if self.bridge.prompts is None:
            self.errorRaised.emit("Could not continue the reply", NO_CONTINUE_REMOTE)
            return
        chat = self.store.get_chat(self.chat_id)
        plan = self.plan(msg.parent_id)
        if plan is None:
            return
        reply = {"role": "assistant", "content": msg.content,
                 **({"token_ids": msg.token_ids} if msg.token_ids is not None else {}),
                 **({"reasoning_content": msg.thinking} if msg.thinking else {})}
        try:
            request = replace(self.request(chat, [*plan.messages, reply]),
                              continue_reply=True)
            prompt = self.bridge.prompts.build(request)
            # A beam search goes on with its best beam.
            params = turn_params(chat.settings, prompt,
                                 (self.bridge.max_model_len or 0) - len(prompt.ids), 1,
                                 self.bridge.beam_search_refusal)
            request_id = self.bridge.submit(prompt, params)
        except (RuntimeError, ValueError) as exc:
            self.errorRaised.emit("Could not continue the reply", str(exc))
            return
        self.pending_group = None
        self.streams[request_id] = Stream.continuing(request_id, msg, len(prompt.ids),
                                                     reply_metrics(params), beam_width(params))
        self.streamsChanged.emit(self.chat_id)
        self.changed.emit(self.chat_id)

    def keep(self, message_id: int) -> None:
        self.pending_group = None
        self.store.set_active_leaf(self.chat_id, self.store.leaf_of(message_id))
        self.tools.kept(message_id)  # its tool calls may run now
        self.changed.emit(self.chat_id)

    def switch(self, message_id: int, step: int) -> None:
        """Show the previous / next alternate of a turn, with that branch's later turns."""
        ids = [m.id for m in self.store.siblings(message_id)]
        target = ids[max(0, min(len(ids) - 1, ids.index(message_id) + step))]
        self.pending_group = None
        self.store.set_active_leaf(self.chat_id, self.store.leaf_of(target))
        self.changed.emit(self.chat_id)

    def stop(self) -> None:
        """Stop its replies; each ends as stopped (requestFinished follows)."""
        self.compare.cancel()
        for request_id in list(self.streams):
            self.bridge.cancel(request_id)

    def close(self) -> None:
        """The chat is deleted: its replies stop, and their events are not waited for."""
        self.stop()
        self.streams.clear()

    def request(self, chat, messages: list[dict]) -> ChatRequest:
        """The turn as the engine's prompt builder takes it: the messages with the chat's
        tools and the template options of its Think switch and effort."""
        return ChatRequest(messages, self.tools.tool_request(chat), self.thinking.options(chat))

    def plan(self, leaf_id: int | None, new_text: str | None = None,
             attachments: list[Attachment] | tuple = ()) -> ContextPlan | None:
        """What to send for a reply after `leaf_id` (plus a new user message `new_text`
        with its attachments), under the chat's overflow policy; None when it is refused
        (the user is told)."""
        chat = self.store.get_chat(self.chat_id)
        content = None if new_text is None else attached_content(
            new_text, attachments, self.store.attachment_data)
        try:
            plan = self.context.plan(self.store, self.bridge, self.chat_id, leaf_id, content,
                                     lambda messages: self.request(chat, messages))
        except ValueError as exc:  # the template, its tools or an attachment refuse it
            self.errorRaised.emit("Could not start the reply", str(exc))
            return None
        if plan.refused:
            self.errorRaised.emit("Context full", plan.refused)
            return None
        try:  # a beam search the model cannot run: refused before anything is stored
            self.turn_params(chat, plan)
        except ValueError as exc:
            self.errorRaised.emit("Could not start the reply", str(exc))
            return None
        return plan

    def turn_params(self, chat, plan: ContextPlan):
        """The engine params of a turn sent as ``plan``: sampling, or the chat's beam
        search (data.beam_choice); ValueError says why a beam search cannot run."""
        return turn_params(chat.settings, plan.prompt, plan.context - plan.prompt_tokens,
                           None, self.bridge.beam_search_refusal)

    def _generate(self, parent_id: int, plan: ContextPlan | None = None) -> None:
        chat = self.store.get_chat(self.chat_id)
        # A new turn (send, edit, regenerate) is compared; a tool call's continuation is
        # the same turn of the model that called.
        compare = plan is not None
        try:
            if plan is None:
                plan = self.plan(parent_id)
                if plan is None:
                    return
            # Sampling, or the chat's beam search (its beams are the candidates).
            params = self.turn_params(chat, plan)
            # The prompt the planner measured (a local model), else the messages.
            request_id = self.bridge.submit(plan.prompt if plan.prompt is not None
                                            else plan.messages, params)
        except (RuntimeError, ValueError) as exc:
            self.changed.emit(self.chat_id)
            self.errorRaised.emit("Could not start the reply", str(exc))
            return
        recomputed = plan.prompt.recomputed if plan.prompt is not None else 0
        count = replies_of(params)
        replies = self.store.add_candidates(self.chat_id, parent_id, count,
                                            model=self.bridge.model_name)
        compared = self.compare.sources(chat) if compare else []
        if count > 1 or compared:
            self.pending_group = replies[0].candidate_group
        self.streams[request_id] = Stream.started(
            request_id, self.chat_id, parent_id, [m.id for m in replies], plan.prompt_tokens,
            {**reply_metrics(params), **({DROPPED_METRIC: recomputed} if recomputed else {})},
            beam_width(params))
        if compared:
            self.compare.start(chat, parent_id, replies[0].candidate_group)
        self.streamsChanged.emit(self.chat_id)
        self.changed.emit(self.chat_id)

    # -- its requests' events (routed here by request id) ------------------------------
    def on_prompt_progress(self, request_id: str, progress) -> None:
        stream = self.streams[request_id]
        if not stream.answering:
            stream.reading = progress
            self.readingChanged.emit(self.chat_id, request_id)

    def on_token(self, request_id: str, index: int, parts: tuple) -> None:
        stream = self.streams[request_id]
        if not stream.answering:  # the prompt is read: its line goes before the text comes
            stream.answering = True
            self.readingChanged.emit(self.chat_id, request_id)
        delta = stream.add(index, parts)
        if delta is None:
            return
        self.replyDelta.emit(self.chat_id, stream.message_ids[index], *delta)
        stream.save_partial(self.store)

    def on_finished(self, request_id: str, output) -> None:
        stream = self.streams.pop(request_id)
        stream.finish(self.store, output)
        for mid in stream.message_ids:
            shown = self.store.get_message(mid)
            if len(stream.message_ids) > 1:
                shown.content = self.tools.candidate_text(shown)
            self.replyFinished.emit(self.chat_id, shown)
        self.tools.finished(stream)
        self.streamsChanged.emit(self.chat_id)
        self.chatsChanged.emit()
        self.turnFinished.emit(self.chat_id)

    def on_failed(self, request_id: str, message: str) -> None:
        stream = self.streams.pop(request_id)
        if not stream.fail(self.store, message):
            self.pending_group = None
            self.store.set_active_leaf(self.chat_id, stream.parent_id)
        self.streamsChanged.emit(self.chat_id)
        self.changed.emit(self.chat_id)
        self.chatsChanged.emit()
        advice = ("Check that the server is running, then regenerate the reply or send "
                  "again." if self.bridge.is_remote else
                  "Shorten the message, start a new chat, or load a model with a longer "
                  "context, then try again.")
        self.errorRaised.emit("The reply failed", f"{message}\n\nYour chat is saved: nothing "
                              f"was lost. {advice}")
