"""A conversation to answer, as every front end hands it to the engine.

``ChatRequest`` is what the app, ``folio chat``, ``LLM.chat`` and ``folio serve`` build from
their own input: the messages (content as text or as a list of parts), the tools the reply
may call and how, and the template's reasoning switches. ``PromptBuilder`` (prompt.py)
makes it into prompt ids once; nothing else renders a chat template.

A message is a dict: ``role`` (system, user, assistant or tool), ``content`` (a string, or
OpenAI's list of parts: ``{"type": "text", "text": ...}``), and where they apply:
``token_ids`` (an earlier reply's exact ids, spliced so its blocks are found in the prefix
cache), ``reasoning_content`` (an earlier reply's thinking; the builder shows it as the
template wants), ``tool_calls`` and ``tool_call_id``.

``continue_reply``: the last message is a reply cut short (max tokens, Stop) that the
model goes on writing: the prompt is the one that reply answered, then the reply's own
ids, its turn left open (prompt.py), so the prefix cache finds all of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.text.reasoning.options import TemplateOptions
from engine.tools.request import ToolRequest

# Text parts are read here; a vision model's image parts by engine/vision/prompt.py.
TEXT_PART = "text"


@dataclass(slots=True, frozen=True)
class ChatRequest:
    messages: tuple[dict, ...]
    tools: ToolRequest = field(default_factory=ToolRequest)
    options: TemplateOptions = field(default_factory=TemplateOptions)
    continue_reply: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.messages, str) or not isinstance(self.messages, Sequence):
            raise ValueError("messages must be a list of {role, content} dicts")
        object.__setattr__(self, "messages", tuple(self.messages))
        if not isinstance(self.tools, ToolRequest):
            raise ValueError("tools must be a ToolRequest (engine.tools.request.tool_request)")
        if not isinstance(self.options, TemplateOptions):
            raise ValueError("options must be a TemplateOptions")
        if not isinstance(self.continue_reply, bool):
            raise ValueError("continue_reply must be true or false")
        if self.continue_reply:
            _check_continued(self.messages)

    @property
    def has_tool_history(self) -> bool:
        """Earlier calls or results are in the conversation (shown whatever the tools)."""
        return any(m.get("role") == "tool" or m.get("tool_calls") for m in self.messages)


def _check_continued(messages: tuple) -> None:
    """A reply to continue is the conversation's last message, an assistant's without
    tool calls (a call is whole or not at all: it is never continued)."""
    last = messages[-1] if messages else None
    if not isinstance(last, dict) or last.get("role") != "assistant":
        raise ValueError("continue_reply: the last message must be the assistant's reply "
                         "to continue")
    if last.get("tool_calls"):
        raise ValueError("continue_reply: a reply that called tools cannot be continued")
    if len(messages) < 2:
        raise ValueError("continue_reply: a reply to continue needs the messages it "
                         "answers before it")


def content_text(content, where: str) -> str:
    """A message's content as the text its template renders; ValueError naming the part
    that is not text (this engine's models read text only)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where}: must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != TEXT_PART:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"{where}[{j}].type: {kind!r} parts are not supported; this "
                             "model reads text only")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"{where}[{j}].text: a text part needs its text")
        texts.append(part["text"])
    return "".join(texts)
