"""What Folio does with each field of OpenAI's chat and text completion requests.

A client must never get a 200 whose reply ignored what it asked for (JSON, a tool call, a
biased token): each field is honoured; or ignored, only where ignoring it changes neither
the reply nor anything the client was promised; or refused with a 400 naming it when set
to anything but what Folio does anyway (``logit_bias: {}`` passes, a bias does not).
A field no one defines is refused the same way (``protocol.py`` forbids extra fields).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


class UnsupportedField(ValueError):
    """A request field Folio does not implement, set to something other than its default."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _unset(value: Any) -> bool:
    return value is None


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {}


def _zero(value: Any) -> bool:
    return not value


def _one_of(*allowed: Any) -> Callable[[Any], bool]:
    return lambda value: value is None or value in allowed


# Fields whose value Folio follows (protocol.py maps them to SamplingParams).
HONOURED_CHAT = ("model", "messages", "n", "temperature", "top_p", "max_tokens",
                 "max_completion_tokens", "stop", "seed", "stream", "stream_options",
                 "logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
                 "response_format", "chat_template_kwargs", "reasoning_effort",
                 "prediction")
HONOURED_TEXT = ("model", "prompt", "n", "temperature", "top_p", "max_tokens", "stop",
                 "seed", "stream", "stream_options", "logprobs")
# vLLM's names for what SamplingParams has beyond OpenAI's fields, and Ollama's keep_alive
# (how long the model stays loaded after the request: engine/hosting).
# vLLM's beam search (engine/serve/beam.py): use_beam_search, its length_penalty and
# early_stopping.
EXTENSIONS = ("top_k", "min_p", "repetition_penalty", "ignore_eos", "keep_alive",
              "use_beam_search", "length_penalty", "early_stopping")

# Accepted and ignored: labels for the caller's own bookkeeping and cache routing hints
# (Folio's prefix cache finds shared prefixes by their tokens), none of which can change
# a reply or promises anything Folio does not do.
IGNORED_CHAT = ("user", "safety_identifier", "metadata", "prompt_cache_key")
IGNORED_TEXT = ("user",)

# Accepted only at the value Folio behaves as anyway; anything else is refused, saying why.
_SHARED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "frequency_penalty": (_zero, "leave it at 0"),
    "presence_penalty": (_zero, "leave it at 0"),
    "logit_bias": (_empty, "token biases are not applied"),
}
DEFAULT_ONLY_CHAT: dict[str, tuple[Callable[[Any], bool], str]] = _SHARED | {
    "functions": (_empty, "the deprecated functions API is not implemented; use tools"),
    "function_call": (_one_of("none"), "the deprecated functions API is not implemented; "
                      "use tool_choice"),
    "audio": (_unset, "replies are text only"),
    "modalities": (_one_of(["text"]), "replies are text only"),
    "verbosity": (_unset, "the chat template gets no verbosity setting"),
    "web_search_options": (_unset, "Folio searches nothing"),
    "moderation": (_unset, "Folio runs no moderation"),
    "store": (_one_of(False), "Folio stores no completions to retrieve later"),
    "service_tier": (_one_of("auto", "default"), "there is one tier"),
    "prompt_cache_retention": (_one_of("in_memory"), "the prefix cache lives in memory, "
                               "evicted as blocks are needed"),
    "prompt_cache_options": (_empty, "the prefix cache keeps no breakpoints or lifetimes"),
}
DEFAULT_ONLY_TEXT: dict[str, tuple[Callable[[Any], bool], str]] = _SHARED | {
    "echo": (_zero, "the prompt is not sent back"),
    "suffix": (_one_of(""), "insertion (fill in the middle) is not implemented"),
    # best_of == n (generate n, return n: what Folio does) is checked as unset.
    "best_of": (_unset, "every generated candidate is returned (best_of must equal n)"),
}
# Message fields: the template renders a role, text, tool calls and the call a tool result
# answers (engine/tools/request.py checks those); anything more would be dropped.
DEFAULT_ONLY_MESSAGE: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (_unset, "the chat template has no place for a participant's name"),
    "function_call": (_unset, "the deprecated functions API is not implemented; use "
                      "tool_calls"),
    "audio": (_unset, "messages are text only"),
    "refusal": (_unset, "the chat template has no place for a refusal"),
}
UNSUPPORTED_ROLES = ("function",)  # the deprecated functions API; "tool" is its successor


def refuse_set_fields(values: Iterable[tuple[str, Any]],
                      table: dict[str, tuple[Callable[[Any], bool], str]],
                      prefix: str = "") -> None:
    """Raise UnsupportedField for the first (name, value) the table does not accept."""
    for name, value in values:
        rule = table.get(name)
        if rule is not None and not rule[0](value):
            raise UnsupportedField(prefix + name, f"{prefix}{name}={value!r} is not supported "
                                   f"by Folio: {rule[1]}")
