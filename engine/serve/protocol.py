"""The OpenAI request bodies ``folio serve`` accepts, and how each maps to SamplingParams.

Fields OpenAI defines but Folio cannot honour (log probabilities, tools, penalties other
than zero) are refused with a message naming the field, instead of being silently
ignored; fields that do not change the output (``user``, ``metadata``) are accepted and
ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.sampling_params import SamplingParams

MAX_N = 16  # candidates per request; each holds its own decode state
MAX_STOP = 4  # OpenAI's own limit on stop strings


class UnsupportedField(ValueError):
    """A request field Folio does not implement, set to something other than its default."""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class SamplingFields(BaseModel):
    """What chat and text completions share."""

    model_config = ConfigDict(extra="ignore")
    model: str
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logprobs: bool | int | None = None
    user: str | None = None
    # vLLM's extension, for benchmarks that need replies of a fixed length.
    ignore_eos: bool = False

    def sampling_params(self, max_tokens_default: int) -> SamplingParams:
        """SamplingParams for this request; ``max_tokens_default`` when the client sets no
        limit (the rest of the context: the engine stops at the context's end)."""
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name):
                raise UnsupportedField(f"{name} is not supported by Folio; leave it at 0")
        if self.logprobs:
            raise UnsupportedField("logprobs are not supported by Folio")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stop):
            raise ValueError("stop strings must not be empty")
        return SamplingParams(n=self.n, temperature=self.temperature, top_p=self.top_p,
                              seed=self.seed, max_tokens=self.limit or max_tokens_default,
                              stop=stop, ignore_eos=self.ignore_eos)

    @property
    def limit(self) -> int | None:
        return self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: list[dict] | None = None
    top_logprobs: int | None = None

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def sampling_params(self, max_tokens_default: int) -> SamplingParams:
        if self.tools:
            raise UnsupportedField("tools (function calling) are not supported by Folio")
        return super().sampling_params(max_tokens_default)

    def engine_messages(self) -> list[dict]:
        # The engine's chat template knows system/user/assistant; OpenAI's newer
        # "developer" role is the system prompt under another name.
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                for m in self.messages]


class CompletionRequest(SamplingFields):
    # One prompt: text, or token ids. (OpenAI also takes a batch; one request per
    # prompt keeps each answer's choices and usage unambiguous.)
    prompt: str | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    echo: bool = False

    def sampling_params(self, max_tokens_default: int) -> SamplingParams:
        if self.echo:
            raise UnsupportedField("echo is not supported by Folio")
        return super().sampling_params(max_tokens_default)
