"""Each model's chat template choice, kept in settings.json under ``model_templates`` by
the model's source (no Qt here).

The choices are those of the models dialog: the file's own template (the default; a file
without one gets its family's turn format), the family's format, ChatML, or a pasted
Jinja template. ``engine_template`` turns a choice into what ``EngineConfig.chat_template``
takes; the dialog checks it by rendering a two-turn chat before it is saved
(engine.text.turn_formats.check_template).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

FILE, FAMILY, CHATML, PASTED = "file", "family", "chatml", "pasted"
KINDS = (FILE, FAMILY, CHATML, PASTED)


@dataclass(slots=True)
class ModelTemplate:
    kind: str = FILE
    text: str = ""  # the pasted template (kind "pasted" only)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"ModelTemplate.kind must be one of {', '.join(KINDS)}, got "
                             f"{self.kind!r}")
        if not isinstance(self.text, str):
            raise ValueError(f"ModelTemplate.text must be a string, got {self.text!r}")
        if self.kind == PASTED and not self.text.strip():
            raise ValueError("ModelTemplate.text: a pasted template cannot be empty")

    @classmethod
    def from_dict(cls, data: Any) -> ModelTemplate:
        if not isinstance(data, dict):
            raise ValueError(f"a model template must be an object, got {data!r}")
        return cls(kind=data.get("kind", FILE), text=data.get("text", ""))


def engine_template(choice: ModelTemplate | None, turn_format: str) -> str | None:
    """The Jinja the engine runs for ``choice`` (None: the file's, else the family's);
    ``turn_format`` is the model family's (engine.models.registry)."""
    from engine.text.turn_formats import CHATML as CHATML_TEMPLATE
    from engine.text.turn_formats import FORMATS

    if choice is None or choice.kind == FILE:
        return None
    if choice.kind == FAMILY:
        return FORMATS[turn_format].template
    if choice.kind == CHATML:
        return CHATML_TEMPLATE
    return choice.text


def turn_format_of(model_type: str) -> str:
    """The turn format of a model_type's family (engine.models.registry), ChatML for one
    Folio does not know."""
    from types import SimpleNamespace

    from engine.models import family_of

    try:
        return family_of(SimpleNamespace(architectures=None, model_type=model_type)).turn_format
    except ValueError:
        return "chatml"


def template_config(config, choice: ModelTemplate, source: str):
    """``config`` (an EngineConfig) with ``choice`` for the model at ``source``; None when
    the model cannot be read (its load reports why)."""
    from engine.loaders.catalog import model_info, resolve_model

    try:
        turn_format = turn_format_of(model_info(resolve_model(source)).architecture)
    except (OSError, ValueError):
        return None
    return dataclasses.replace(config, chat_template=engine_template(choice, turn_format))
