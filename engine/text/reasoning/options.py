"""What a chat passes its template beyond the messages and tools: the variables reasoning
models read, ``enable_thinking`` (Qwen 3's switch) and ``reasoning_effort`` (gpt-oss's
harmony system message: ``Reasoning: low|medium|high``). Each is passed only when set, so
a template keeps its own default; a template that never reads one ignores it."""

from __future__ import annotations

from dataclasses import dataclass, fields

REASONING_EFFORTS = ("low", "medium", "high")


@dataclass(slots=True, frozen=True)
class TemplateOptions:
    """The template variables of one prompt (None: not passed). The field names are the
    variables' names."""

    enable_thinking: bool | None = None
    reasoning_effort: str | None = None

    def __post_init__(self) -> None:
        if self.enable_thinking is not None and not isinstance(self.enable_thinking, bool):
            raise ValueError(f"enable_thinking must be true or false, got "
                             f"{self.enable_thinking!r}")
        if self.reasoning_effort is not None and self.reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(f"reasoning_effort must be one of "
                             f"{', '.join(map(repr, REASONING_EFFORTS))}, got "
                             f"{self.reasoning_effort!r}")

    def variables(self) -> dict[str, bool | str]:
        """The set options as keyword arguments of the template."""
        values = ((f.name, getattr(self, f.name)) for f in fields(self))
        return {name: value for name, value in values if value is not None}
