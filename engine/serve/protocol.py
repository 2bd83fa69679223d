"""The OpenAI request bodies ``folio serve`` accepts, and how each maps to SamplingParams.

Every field is honoured, ignored where that cannot change the reply, or refused with a 400
that names it (``fields.py`` says which and why); unknown fields are refused too
(``extra="forbid"``), so nothing a client asks for is dropped in silence.
"""

from __future__ import annotations

from dataclasses import fields as dataclass_fields
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.chat.request import ChatRequest
from engine.documents import FILE_PART
from engine.sampling_params import MAX_LOGPROBS, SEED_MAX, SEED_MIN, SamplingParams
from engine.serve import fields, unicode_text
from engine.serve.fields import UnsupportedField
from engine.serve.response_format import response_format
from engine.text.reasoning.options import TemplateOptions
from engine.tools.request import (
    InvalidField,
    ToolRequest,
    check_message_tools,
    check_results_answer_calls,
    tool_request,
)

MAX_N = 16  # candidates per request; each holds its own decode state
MAX_STOP = 4  # OpenAI's own limit on stop strings
_STRICT = ConfigDict(extra="forbid")

__all__ = ["ChatCompletionRequest", "CompletionRequest", "InvalidField", "SamplingFields",
           "UnsupportedField"]


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False
    # Random padding against a network observer guessing tokens from chunk sizes; an
    # OpenAI-side measure that changes no content, so no padding is sent.
    include_obfuscation: bool | None = None


class ContentPart(BaseModel):
    # Extra fields are checked by name in ChatMessage.check, with the part's position.
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None
    image_url: Any = None  # {"url": "data:image/png;base64,..."} (engine/vision/sources.py)


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: Any = None
    # Checked by engine.tools.request.check_message_tools, naming the bad part.
    tool_calls: Any = None
    tool_call_id: Any = None
    function_call: Any = None
    audio: Any = None
    refusal: Any = None
    # An earlier reply's thinking, as clients send back what they got: handed to the
    # template, which shows it where the model reads it (harmony: before the calls of the
    # turn in progress) and drops it elsewhere, as the templates of thinking models do.
    reasoning_content: str | None = None

    def check(self, i: int) -> None:
        where = f"messages.{i}."
        if self.role in fields.UNSUPPORTED_ROLES:
            raise UnsupportedField(where + "role", f"{where}role={self.role!r} is not "
                                   "supported by Folio: the deprecated functions API is not "
                                   "implemented; send tool results as role 'tool'")
        fields.refuse_set_fields(((n, getattr(self, n)) for n in fields.DEFAULT_ONLY_MESSAGE),
                                 fields.DEFAULT_ONLY_MESSAGE, where)
        check_message_tools(i, self.role, self.tool_calls, self.tool_call_id)
        for j, part in enumerate(self.content if isinstance(self.content, list) else []):
            at = f"{where}content.{j}."
            if part.type == FILE_PART:  # read by the prompt builder (engine/documents)
                _check_file_part(part, at)
                continue
            if part.type == "image_url":
                _check_image_url(part, at)
                continue
            if part.type != "text":
                raise UnsupportedField(at + "type", f"{at}type={part.type!r} is not "
                                       "supported by Folio: text, image_url and file parts are")
            for extra in part.model_extra or {}:
                raise UnsupportedField(at + extra, f"{at}{extra} is not supported by Folio")
            if part.text is None:
                raise ValueError(f"{at}text: a text part needs its text")

    def engine_content(self) -> str | list[dict]:
        """The content as the engine's prompt builder takes it: text, or its parts."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return [{"type": FILE_PART, FILE_PART: part.model_extra[FILE_PART]}
                if part.type == FILE_PART
                else {"type": "image_url", "image_url": {"url": part.image_url["url"]}}
                if part.type == "image_url" else {"type": part.type, "text": part.text}
                for part in self.content]


def _check_file_part(part: ContentPart, at: str) -> None:
    """A ``file`` part holds its ``file`` and nothing else (its contents are checked where
    they are read, each bad one a 400 naming the part or the file and why)."""
    for extra in part.model_extra or {}:
        if extra != FILE_PART:
            raise UnsupportedField(at + extra, f"{at}{extra} is not supported by Folio")
    if part.text is not None:
        raise UnsupportedField(at + "text", f"{at}text: a file part holds no text")
    if not isinstance((part.model_extra or {}).get(FILE_PART), dict):
        raise InvalidField(at + "file", f"{at}file: a file part needs its file "
                           "({file_data, filename})")


def _check_image_url(part: ContentPart, at: str) -> None:
    """OpenAI's image part: ``image_url`` an object with its ``url`` (and ``detail``,
    which Folio's models have no use for: each reads an image at its own size)."""
    for extra in part.model_extra or {}:
        raise UnsupportedField(at + extra, f"{at}{extra} is not supported by Folio")
    value = part.image_url
    if not isinstance(value, dict) or not isinstance(value.get("url"), str):
        raise ValueError(f"{at}image_url: must be an object with the image's url")
    for key in value:
        if key not in ("url", "detail"):
            raise UnsupportedField(f"{at}image_url.{key}",
                                   f"{at}image_url.{key} is not supported by Folio")


class SamplingFields(BaseModel):
    """What chat and text completions share."""

    model_config = _STRICT
    model: str
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    seed: Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extensions: what SamplingParams has beyond OpenAI's fields. top_k -1 is
    # vLLM's "off", as 0 is here.
    top_k: Annotated[int, Field(ge=-1)] = 0
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0
    repetition_penalty: Annotated[float, Field(gt=0, le=2)] = 1.0
    ignore_eos: bool = False
    # Ollama's: how long the model stays loaded after this request (engine/hosting).
    keep_alive: str | float | None = None
    # vLLM's beam search (engine/serve/beam.py): n (or best_of) beams, deterministic.
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False

    DEFAULT_ONLY: ClassVar[dict] = fields.DEFAULT_ONLY_CHAT

    @model_validator(mode="before")
    @classmethod
    def _unicode_only(cls, data: Any) -> Any:
        # Before the fields: many are typed Any (tools, schemas) and reach the template
        # as they are.
        unicode_text.check_body(data)
        return data

    def sampling_params(self, max_tokens_default: int | None) -> SamplingParams:
        """SamplingParams for this request; ``max_tokens_default`` when the client sets no
        limit (None: the rest of the context, the engine stops at the context's end)."""
        fields.refuse_set_fields(self._checked_values(), self.DEFAULT_ONLY)
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stop):
            raise ValueError("stop strings must not be empty")
        return SamplingParams(n=self.n, temperature=self.temperature, top_p=self.top_p,
                              top_k=max(self.top_k, 0), min_p=self.min_p,
                              repetition_penalty=self.repetition_penalty, seed=self.seed,
                              max_tokens=self.limit or max_tokens_default, stop=stop,
                              ignore_eos=self.ignore_eos, logprobs=self.num_logprobs)

    def _checked_values(self):
        return ((name, getattr(self, name)) for name in self.DEFAULT_ONLY)

    @property
    def limit(self) -> int | None:
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    # Checked by engine/tools/request.py, which names the bad part of a value in any shape.
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    # Checked by response_format.py, which names the bad part.
    response_format: Any = None
    # vLLM's variables for the chat template: only reasoning models' are read
    # (engine.text.reasoning.options), reasoning_effort OpenAI's own field too.
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Any = None
    # Refused unless left at what Folio does (fields.DEFAULT_ONLY_CHAT); typed loosely so
    # that a value in any shape is refused by name, not mistyped.
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    # OpenAI's Predicted Outputs: {"type": "content", "content": text or text parts}.
    prediction: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    moderation: Any = None
    store: Any = None
    service_tier: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    # Ignored (fields.IGNORED_CHAT).
    safety_identifier: str | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        if not self.logprobs:
            if self.top_logprobs:
                raise ValueError("top_logprobs needs logprobs: true")
            return None
        return self.top_logprobs or 0

    def sampling_params(self, max_tokens_default: int | None) -> SamplingParams:
        for i, message in enumerate(self.messages):
            message.check(i)
        check_results_answer_calls(self.messages)
        params = super().sampling_params(max_tokens_default)
        params.response_format = response_format(self.response_format)
        params.prediction = predicted_text(self.prediction)
        return params

    def template_options(self) -> TemplateOptions:
        """``reasoning_effort`` and ``chat_template_kwargs``' reasoning variables (which
        may hold ``reasoning_effort`` too, as vLLM's clients send it); InvalidField names a
        bad value or any other variable."""
        options = dict(self.chat_template_kwargs or {})
        readable = [f.name for f in dataclass_fields(TemplateOptions)]
        for name in options:
            if name not in readable:
                raise InvalidField(f"chat_template_kwargs.{name}", f"chat_template_kwargs."
                                   f"{name} is not read: the chat template gets only "
                                   f"{' and '.join(readable)} (reasoning models' variables)")
        effort = options.get("reasoning_effort")
        if self.reasoning_effort is not None:
            if effort is not None and effort != self.reasoning_effort:
                raise InvalidField("reasoning_effort", "reasoning_effort and "
                                   "chat_template_kwargs.reasoning_effort differ; send one")
            options["reasoning_effort"] = self.reasoning_effort
        for name, value in options.items():
            try:
                TemplateOptions(**{name: value})
            except ValueError as exc:
                where = (name if name == "reasoning_effort" and self.reasoning_effort
                         is not None else f"chat_template_kwargs.{name}")
                raise InvalidField(where, str(exc) if where == name else
                                   f"chat_template_kwargs.{exc}") from exc
        return TemplateOptions(**options)

    def tool_request(self) -> ToolRequest:
        """The request's tools and how they may be called; InvalidField names a bad one."""
        return tool_request(self.tools, self.tool_choice, self.parallel_tool_calls)

    @property
    def has_tool_history(self) -> bool:
        return any(m.role == "tool" or m.tool_calls for m in self.messages)

    def chat_request(self) -> ChatRequest:
        """The conversation for the engine's prompt builder; InvalidField names a bad
        tool field or template variable."""
        return ChatRequest(self.engine_messages(), self.tool_request(),
                           self.template_options())

    def engine_messages(self) -> list[dict]:
        # The engine's chat templates know system/user/assistant/tool; OpenAI's newer
        # "developer" role is the system prompt under another name.
        out = []
        for m in self.messages:
            message = {"role": "system" if m.role == "developer" else m.role,
                       "content": m.engine_content()}
            if m.tool_calls:
                message["tool_calls"] = [{"id": c["id"], "type": "function",
                                          "function": dict(c["function"])}
                                         for c in m.tool_calls]
            if m.tool_call_id is not None:
                message["tool_call_id"] = m.tool_call_id
            if m.role == "assistant" and m.reasoning_content:
                message["reasoning_content"] = m.reasoning_content  # the template decides
            out.append(message)
        return out


class CompletionRequest(SamplingFields):
    # One prompt: text, or token ids. (OpenAI also takes a batch; one request per
    # prompt keeps each answer's choices and usage unambiguous.)
    prompt: str | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    # OpenAI allows 5 alternatives here; Folio as many as in chat.
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: bool | None = False
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1)] | None = None

    DEFAULT_ONLY: ClassVar[dict] = fields.DEFAULT_ONLY_TEXT

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    def _checked_values(self):
        for name, value in super()._checked_values():
            # With use_beam_search, best_of is the beam width (engine/serve/beam.py).
            same = value == self.n or self.use_beam_search
            yield name, None if name == "best_of" and same else value


def predicted_text(prediction: Any) -> str | None:
    """The text of OpenAI's ``prediction`` field (its content as a string or as text
    parts); InvalidField names what is wrong."""
    if prediction is None:
        return None
    if not isinstance(prediction, dict) or prediction.get("type") != "content":
        raise InvalidField("prediction", 'prediction must be {"type": "content", "content": '
                           '...}')
    unknown = set(prediction) - {"type", "content"}
    if unknown:
        raise InvalidField("prediction", f"prediction has unknown fields {sorted(unknown)}")
    content = prediction.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content):
        return "".join(p["text"] for p in content)
    raise InvalidField("prediction.content", "prediction.content must be a string or a "
                       "list of text parts")
