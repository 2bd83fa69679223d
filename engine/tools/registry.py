"""The one table from a model family to the tool formats it may speak.

Keyed by the family's ``model_type`` (``engine/models/registry.py`` decides a model's
family). A family can hold models of several formats (Mistral GGUF files load as the llama
family), so the model's own chat template picks among them: a format counts only when the
template shows it (``ToolFormat.template_hints``). A family missing here, or a template
that shows none of its formats, has no tool format: its replies stay text.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from engine.tools.format import ToolFormat
from engine.tools.hermes import HERMES
from engine.tools.llama3 import LLAMA3_JSON
from engine.tools.mistral import MISTRAL
from engine.tools.phi4 import PHI4_MINI

FORMATS: Mapping[str, tuple[ToolFormat, ...]] = MappingProxyType({
    "qwen2": (HERMES,),
    "qwen3": (HERMES,),
    "llama": (LLAMA3_JSON, MISTRAL),
    "mistral": (MISTRAL,),
    "phi3": (PHI4_MINI,),
})


def tool_format(model_type: str, chat_template: str | None) -> ToolFormat | None:
    """The format a model of this family with this chat template writes calls in."""
    for candidate in FORMATS.get(model_type, ()):
        if chat_template and any(h in chat_template for h in candidate.template_hints):
            return candidate
    return None
