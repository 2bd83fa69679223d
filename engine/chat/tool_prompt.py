"""A chat request with tools, made into prompt ids (for ``PromptBuilder``).

``ModelTools`` is read once per model: the model family's tool format, if it has one for
this chat template (``engine/tools/registry.py``), and what the template can show.
``tool_prompt`` checks a request against it, renders tools, calls and results through the
template, and starts the reply with the format's call marker when the client requires a
call (``tool_choice: "required"`` or a named function); the call's arguments are the
model's, unconstrained by the schemas. A family without a call format is made to call by
structured output instead: the reply is constrained to ``{"name", "arguments"}`` of the
tools (``engine/tools/constrained.py``), and where its template has no place for tools,
they, the earlier calls and their results are written into the conversation as text.
A harmony template (gpt-oss) shows tools, calls and results itself, and a forced call
opens the reply with harmony's call header (``engine/tools/harmony.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.chat.reply_tokens import ReplyTokens
from engine.sampling_params import ResponseFormat
from engine.text.reasoning import HARMONY, TemplateOptions, reasoning_format
from engine.tools.constrained import call_schema, shown_as_text
from engine.tools.format import ToolFormat
from engine.tools.harmony import call_opening
from engine.tools.registry import tool_format
from engine.tools.request import InvalidField, ToolRequest
from engine.tools.template import TemplateToolError, TemplateTools, prepare


def template_source(hf_tokenizer) -> str | None:
    template = getattr(hf_tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates ("default", "tool_use"): any of them
        return "\n".join(str(t) for t in template.values())
    return template


@dataclass(slots=True, frozen=True)
class ModelTools:
    fmt: ToolFormat | None  # None: the family has no call format Folio reads
    template: TemplateTools
    # The template speaks harmony: calls are messages of the reply's channels, read by its
    # reasoning reader (engine/tools/harmony.py).
    harmony: bool = False

    @classmethod
    def of(cls, model_type: str, source: str | None) -> ModelTools:
        """``model_type``: the family's (``family_of(config).model_type``); ``source``: the
        chat template's text."""
        fmt = tool_format(model_type, source)
        return cls(fmt, TemplateTools.of(source), reasoning_format(source) is HARMONY)

    @property
    def reads_calls(self) -> bool:
        """Replies' calls are read: by the family's format or the harmony channels."""
        return self.fmt is not None or self.harmony


@dataclass(slots=True, frozen=True)
class ToolPrompt:
    ids: list[int]
    fmt: ToolFormat | None  # the format the reply is read in; None: it stays text
    prefix: str  # what the reply was started with, read as its first text
    max_calls: int | None
    stop_ids: tuple[int, ...] = ()
    # A family without a call format, made to call: its reply constrained to one call.
    call_format: ResponseFormat | None = None


def tool_prompt(model: ModelTools, request: ToolRequest, messages: list[dict],
                tokenizer, replies: ReplyTokens | None = None,
                options: TemplateOptions | None = None) -> ToolPrompt:
    """Prompt ids; InvalidField naming what the model or its template cannot take.
    ``replies``: earlier replies' ids, spliced where calls are shown as their text;
    ``options``: reasoning models' template variables (unset: the template's defaults)."""
    options = options or TemplateOptions()
    forced = request.choice in ("required", "function")
    if model.harmony and model.template.takes_tools:
        return _harmony_prompt(model, request, messages, tokenizer, forced, options)
    if model.fmt is None and (forced or not model.template.takes_tools):
        return _constrained_prompt(model, request, messages, tokenizer, forced, replies,
                                   options)
    tools = request.tools if request.active else None
    try:
        prepared = prepare(messages, tools, model.fmt, model.template)
    except TemplateToolError as exc:
        raise InvalidField(exc.field, str(exc)) from exc
    prefix = model.fmt.prefix(request.function) if forced else ""
    try:
        ids = tokenizer.encode_chat(prepared, tools=tools, **options.variables())
    except (ValueError, TypeError) as exc:  # a template's own errors: the model's, not ours
        raise InvalidField("tools" if str(exc).startswith("tools") else "messages",
                           str(exc)) from exc
    if prefix:
        ids += tokenizer.encode(prefix, add_special_tokens=False)
    fmt = model.fmt if request.active else None
    return ToolPrompt(ids, fmt, prefix, None if request.parallel else 1,
                      _stop_ids(fmt, tokenizer))


def _harmony_prompt(model: ModelTools, request: ToolRequest, messages: list[dict],
                    tokenizer, forced: bool, options: TemplateOptions) -> ToolPrompt:
    """Harmony: the template shows tools, calls and results; a forced call is the reply
    opened with its header, which the reply's reader reads from the prompt's tail."""
    tools = request.tools if request.active else None
    try:
        prepared = prepare(messages, tools, None, model.template)
        ids = tokenizer.encode_chat(prepared, tools=tools, **options.variables())
    except TemplateToolError as exc:
        raise InvalidField(exc.field, str(exc)) from exc
    except (ValueError, TypeError) as exc:
        raise InvalidField("messages", str(exc)) from exc
    if forced:
        ids += tokenizer.encode(call_opening(request.function), add_special_tokens=False)
    return ToolPrompt(ids, None, "", None if request.parallel else 1)


def _constrained_prompt(model: ModelTools, request: ToolRequest, messages: list[dict],
                        tokenizer, forced: bool, replies: ReplyTokens | None,
                        options: TemplateOptions) -> ToolPrompt:
    """A family without a call format: the template shows the tools where it can, else
    they go into the conversation as text; a forced call is a constrained reply."""
    tools = request.tools if request.active else None
    if model.template.takes_tools:
        try:
            prepared = prepare(messages, tools, None, model.template)
        except TemplateToolError as exc:
            raise InvalidField(exc.field, str(exc)) from exc
    else:
        prepared, tools = shown_as_text(messages, request.tools), None
        if replies is not None:
            prepared = replies.attach(prepared)
    try:
        ids = tokenizer.encode_chat(prepared, tools=tools, **options.variables())
    except (ValueError, TypeError) as exc:
        raise InvalidField("messages", str(exc)) from exc
    fmt = None
    if forced:
        schema = call_schema(request.tools, request.function)
        fmt = ResponseFormat("json_schema", schema, "tool_call")
    return ToolPrompt(ids, None, "", 1, (), fmt)


def _stop_ids(fmt: ToolFormat | None, tokenizer) -> tuple[int, ...]:
    """The format's stop markers that are single tokens of this vocabulary."""
    if fmt is None:
        return ()
    added = tokenizer.hf.get_added_vocab()
    return tuple(added[m] for m in fmt.stop_markers if m in added)
