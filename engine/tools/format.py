"""``ToolFormat``: how one family writes tool calls, and what the server needs to know to
read them, to start a reply with one, and to show calls back to a template."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Marker:
    """Text that opens a call region."""

    text: str
    # True: the marker is the first character of the call's JSON (Llama 3's bare "{"),
    # so it stays in the body.
    in_body: bool = False
    # True: only where a call may start without one (the reply's start, after a call),
    # so a brace in prose is never read as a call.
    leading_only: bool = False


def openai_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass(slots=True, frozen=True)
class ToolFormat:
    name: str
    markers: tuple[Marker, ...]
    # Closes a region; None: the region is the one JSON value after the marker.
    end: str | None
    # A template that holds one of these speaks this format (a family may have several).
    template_hints: tuple[str, ...]
    # The reply's start that makes the model write a call (tool_choice "required") or a
    # call of the named function: no constraint on what follows, only where it begins.
    required_prefix: str
    named_prefix: str  # with {name} for the function's name, JSON-escaped
    # Between two calls, beyond whitespace (Llama 3's "; ").
    separators: str = ""
    # Tokens that end a call turn without being end-of-text (Llama 3's <|eom_id|>).
    stop_markers: tuple[str, ...] = ()
    # Arguments key the family writes (Llama 3's "parameters"), for render_calls.
    arguments_key: str = "arguments"
    # One call region holds a list of calls (Mistral, Phi-4-mini) or one call (Hermes).
    list_per_region: bool = False
    # The template reads the tools as JSON text on the system message (Phi-4-mini's
    # message['tools']) rather than from its ``tools`` variable.
    system_tools: bool = False
    new_id: Callable[[], str] = openai_call_id

    def prefix(self, function: str | None) -> str:
        if function is None:
            return self.required_prefix
        return self.named_prefix.format(name=json.dumps(function)[1:-1])

    def render_calls(self, calls: list[dict]) -> str:
        """Assistant tool calls as the model writes them, for a template that has no place
        for ``tool_calls``: the model still sees what it called."""
        objects = [{"name": c["name"], self.arguments_key: c["arguments"]} for c in calls]
        marker = next(m.text for m in self.markers if not m.in_body)
        if self.list_per_region:
            return marker + json.dumps(objects, ensure_ascii=False) + (self.end or "")
        return "".join(marker + json.dumps(o, ensure_ascii=False) + (self.end or "")
                       for o in objects)
