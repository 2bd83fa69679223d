"""Mistral calls (v3 tokenizers: Mistral 7B v0.3, Nemo, Small 2409): ``[TOOL_CALLS]`` then
a JSON list, ``[{"name": ..., "arguments": {...}}, ...]``, ended by the list's own bracket.
Mistral's templates accept only 9-character alphanumeric call ids, so calls get those.
(The v11 form, ``[TOOL_CALLS]name[ARGS]{...}``, is not read.)"""

from __future__ import annotations

import secrets
import string

from engine.tools.format import Marker, ToolFormat

_ALPHANUMERIC = string.ascii_letters + string.digits


def mistral_call_id() -> str:
    return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))


MISTRAL = ToolFormat(
    name="mistral",
    markers=(Marker("[TOOL_CALLS]"),),
    end=None,
    template_hints=("[TOOL_CALLS]", "[AVAILABLE_TOOLS]"),
    required_prefix="[TOOL_CALLS]",
    named_prefix='[TOOL_CALLS] [{{"name": "{name}", "arguments": ',
    list_per_region=True,
    new_id=mistral_call_id,
)
