"""The context window of a chat: measuring prompts with the loaded model, applying the
chat's overflow policy (data.context_policy) and remembering where it last cut.

A local model's prompts are measured by the engine's own prompt builder
(``EngineBridge.prompts``, engine.chat.PromptBuilder) with the chat's tools and template
options, and each measured prompt is kept: the messages the policy chooses go to the
engine as the very prompt it measured (``ContextPlan.prompt``), so the count is the ids
the engine runs. A remote model has no builder here: the count is
``context_policy.estimate_tokens``, a conservative guess, and the messages are sent.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from desktop_app.data.context_policy import (
    CHARS_PER_TOKEN,
    ContextPlan,
    estimate_tokens,
    plan_context,
)
from desktop_app.data.metric_values import count
from engine.chat import ChatPrompt, ChatRequest, PromptBuilder

logger = logging.getLogger(__name__)
RequestFor = Callable[[list[dict[str, Any]]], ChatRequest]


class PromptMeasure:
    """``measure(messages)``: the tokens of the prompt the engine would run for them (the
    chat's tools and options added by ``request_for``); ``prompt(messages)`` that prompt,
    built once however often the policy measured it."""

    def __init__(self, prompts: PromptBuilder, request_for: RequestFor) -> None:
        self._prompts, self._request_for = prompts, request_for
        self._built: dict[tuple[int, ...], ChatPrompt] = {}

    def __call__(self, messages: Sequence[dict[str, Any]]) -> int:
        return len(self.prompt(messages).ids)

    def prompt(self, messages: Sequence[dict[str, Any]]) -> ChatPrompt:
        # The policy measures sublists of one list of message dicts: their identities
        # name a choice of messages.
        key = tuple(map(id, messages))
        built = self._built.get(key)
        if built is None:
            built = self._built[key] = self._prompts.build(self._request_for(list(messages)))
        return built


def text_tokens(tokenizer: Any, text: str) -> int:
    """Tokens of a draft message (template markers not included)."""
    if not text:
        return 0
    if tokenizer is None:
        return math.ceil(len(text) / CHARS_PER_TOKEN)
    try:
        return len(tokenizer.encode(text, add_special_tokens=False))
    except Exception:  # noqa: BLE001
        return math.ceil(len(text) / CHARS_PER_TOKEN)


class ContextTracker:
    """Per chat, where the last cut was made (the id of the first message kept after it,
    and how many turns it dropped): the next prompts cut at the same place, so they start
    the same way and the prefix cache hits again; and what the cut left out, for the
    gauge's tooltip."""

    def __init__(self) -> None:
        self._cuts: dict[int, tuple[int, int]] = {}
        self._notes: dict[int, str] = {}

    def forget(self, chat_id: int) -> None:
        self._cuts.pop(chat_id, None)
        self._notes.pop(chat_id, None)

    def note(self, chat_id: int | None) -> str:
        return self._notes.get(chat_id, "") if chat_id is not None else ""

    def plan(self, store, bridge, chat_id: int, leaf_id: int | None,
             new_text: str | list | None = None,
             request_for: RequestFor = ChatRequest) -> ContextPlan:
        """What to send for a reply after `leaf_id` (plus a new user message `new_text`: its
        text, or the engine's content parts when it has attachments) under the chat's
        policy; ``plan.refused`` says why when nothing may be sent.
        ``request_for(messages)``: the chat's request for those messages (its tools and
        template options), measured and built by the model's prompt builder; ValueError
        where that builder refuses them. ``bridge``: what the prompt is for (the bridge,
        or a compared model's worker): its ``model_name``, ``max_model_len``, ``prompts``."""
        chat = store.get_chat(chat_id)
        if leaf_id is not None:
            messages = store.messages_for_engine(leaf_id, getattr(bridge, "model_name", None))
            ids: list[int | None] = [m.id for m in store.path_to(leaf_id)]
        else:
            prompt = chat.settings.system_prompt
            messages = [{"role": "system", "content": prompt}] if prompt else []
            ids = []
        ids = [None] * (len(messages) - len(ids)) + ids  # the system prompt has no id
        if new_text is not None:
            messages.append({"role": "user", "content": new_text})
            ids.append(None)
        context = bridge.max_model_len
        if not context:
            return ContextPlan(messages, 0, 0, 0)
        anchor, dropped = self._cuts.get(chat_id, (None, 0))
        measure = (PromptMeasure(bridge.prompts, request_for) if bridge.prompts is not None
                   else estimate_tokens)
        plan = plan_context(messages, chat.settings.overflow_policy, int(context),
                            chat.settings.max_tokens, measure,
                            min_dropped=dropped if anchor in ids else 0)
        if plan.refused:
            return plan
        if isinstance(measure, PromptMeasure):
            plan.prompt = measure.prompt(plan.messages)
        if plan.cut:
            after = max(plan.dropped) + 1
            self._cuts[chat_id] = (ids[after] if after < len(ids) and ids[after] is not None
                                   else -1, plan.dropped_turns)
            self._notes[chat_id] = (
                f"{plan.dropped_turns} older turn{'s' if plan.dropped_turns != 1 else ''} "
                f"left out of what was sent (the saved chat is whole)")
        else:
            self.forget(chat_id)
        return plan


def branch_tokens(store, chat_id: int | None) -> int:
    """Tokens of a chat's open branch as of its last reply (what the context holds): the
    engine's count of that reply's prompt plus the reply. A reply without a usable count
    (a remote one, or a row of another version) is passed over for the one before."""
    if chat_id is None:
        return 0
    leaf = store.active_leaf(chat_id)
    if leaf is None:
        return 0
    for msg in reversed(store.path_to(leaf)):
        prompt = count(msg.metrics, "num_prompt_tokens") if msg.role == "assistant" else None
        if prompt is not None:
            # A continued reply's prompt held its ids from before; they count once.
            prompt -= min(prompt, count(msg.metrics, "continued_tokens") or 0)
            generated = (len(msg.token_ids) if msg.token_ids is not None
                         else count(msg.metrics, "num_generated_tokens") or 0)
            return prompt + generated
    return 0
