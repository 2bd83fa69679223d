"""A chat's compare columns: the models of its "Compare with" setting answer each turn beside
the picker's model, in the same candidate group (one column per reply, each with Keep).

Each compared model gets the prompt its own prompt builder makes of the branch: the replies
it wrote go back as its own ids, another model's (the kept one, when it was not its own) as
text, so its prefix cache holds its whole conversation and each follow-up computes only
what the turn added. Keep chooses the reply the conversation continues with; every model
compared answers the next turn again. A compared model not loaded yet is loaded in the
background (EngineBridge.prepare): its columns join the group once it answers. Runs on the
GUI thread, for one ChatSession.
"""

from __future__ import annotations

from dataclasses import dataclass

from desktop_app.controllers.context_window import ContextTracker
from desktop_app.controllers.json_mode import reply_metrics
from desktop_app.controllers.stream import Stream
from desktop_app.data.beam_choice import beam_width, replies_of, turn_params


@dataclass(slots=True)
class _Waiting:
    source: str
    parent_id: int
    group: int


class CompareTurns:
    def __init__(self, session) -> None:
        self.session = session
        self._waiting: list[_Waiting] = []
        # Per compared model, where its overflow policy last cut (each its own context).
        self._contexts: dict[str, ContextTracker] = {}

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    @property
    def cut(self) -> bool:
        """Whether a compared model's overflow policy cut this chat's prompt: its session
        is kept while so, as for the picker's model's cut (ChatSession.idle), so that
        model's next prompts start the same way again."""
        chat_id = self.session.chat_id
        return any(context.note(chat_id) for context in self._contexts.values())

    def sources(self, chat) -> list[str]:
        """The chat's compared models, less the picker's own (it answers anyway)."""
        main = self.session.bridge.source
        return [s for s in chat.settings.compare_models if s != main]

    def start(self, chat, parent_id: int, group: int) -> None:
        """The turn after ``parent_id`` (a stored user message) gets a column from each
        compared model, in candidate group ``group``."""
        bridge = self.session.bridge
        for source in self.sources(chat):
            self._waiting.append(_Waiting(source, parent_id, group))
            bridge.prepare(source)  # companionReady at once when it is loaded

    def ready(self, source: str) -> None:
        """``source`` is loaded: its waiting turns are sent."""
        for wait in [w for w in self._waiting if w.source == source]:
            self._waiting.remove(wait)
            self._submit(wait)

    def failed(self, source: str, message: str) -> None:
        if any(w.source == source for w in self._waiting):
            self._waiting = [w for w in self._waiting if w.source != source]
            self.session.streamsChanged.emit(self.session.chat_id)
            self.session.errorRaised.emit("A compared model could not answer",
                                          f"{source}: {message}")

    def cancel(self) -> None:
        self._waiting.clear()

    def _submit(self, wait: _Waiting) -> None:
        session, store, bridge = self.session, self.session.store, self.session.bridge
        worker = bridge.hosted_worker(wait.source)
        if worker is None:  # unloaded again between its load and now: load it once more
            self._waiting.append(wait)
            bridge.prepare(wait.source)
            return
        chat = store.get_chat(session.chat_id)
        context = self._contexts.setdefault(wait.source, ContextTracker())
        try:
            plan = context.plan(store, worker, session.chat_id, wait.parent_id, None,
                                lambda messages: session.request(chat, messages))
            if plan.refused:
                raise ValueError(plan.refused)
            params = turn_params(chat.settings, plan.prompt,
                                 plan.context - plan.prompt_tokens, None,
                                 worker.beam_search_refusal)
            request_id = bridge.submit(plan.prompt if plan.prompt is not None
                                       else plan.messages, params, wait.source)
        except (RuntimeError, ValueError) as exc:
            session.errorRaised.emit("A compared model could not answer",
                                     f"{worker.model_name}: {exc}")
            return
        first = sum(1 for m in store.siblings(wait.group) if m.candidate_group == wait.group)
        replies = [store.add_message(session.chat_id, wait.parent_id, "assistant", "",
                                     status="streaming", model=worker.model_name,
                                     candidate_group=wait.group, candidate_index=first + i,
                                     activate=False) for i in range(replies_of(params))]
        session.streams[request_id] = Stream.started(
            request_id, session.chat_id, wait.parent_id, [m.id for m in replies],
            plan.prompt_tokens, reply_metrics(params), beam_width(params))
        session.streamsChanged.emit(session.chat_id)
        session.changed.emit(session.chat_id)
