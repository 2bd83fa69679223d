"""Chat templates rendered as transformers 5 renders them, without importing transformers.

A model's chat template is Jinja written against transformers' ``apply_chat_template``:
what the template may call and see is that function's contract, so Folio renders it the
same way (tests/engine/text/test_template_render.py holds the two equal over every
template Folio ships or tests with):

- a sandboxed environment with trimmed blocks, ``loopcontrols``, a ``tojson`` that leaves
  non-ASCII text and HTML characters as they are, ``raise_exception``, ``strftime_now``,
  ``dict`` and a ``namespace`` that refuses underscore names, and the
  ``{% generation %}`` tag (training templates mark replies with it; rendering keeps
  its body as it is);
- messages with their None values dropped (templates test presence), copied as plain
  data, a reply's reasoning under all of ``reasoning_content``, ``thinking`` and
  ``reasoning``'s first set name (templates read different ones);
- the tokenizer's named special tokens as variables (``bos_token``, ``eos_token``, ...),
  which the caller's variables override;
- a file with several named templates uses ``tool_use`` when tools are given and it has
  one, else ``default``.

Folio's own tokenizer (engine/text/file_tokenizer.py) renders through this module, and
so does the check of a user's template (engine/text/turn_formats.py).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The names a message's reasoning goes by; templates read the first (or gpt-oss's
# ``thinking``).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def select_template(chat_template: str | Mapping[str, str] | None,
                    tools: Sequence[Any] | None = None) -> str:
    """The template to render: the one string, or of named ones ``tool_use`` when tools
    are given (and it exists), else ``default``; ValueError when there is none."""
    if isinstance(chat_template, Mapping):
        if tools is not None and "tool_use" in chat_template:
            return chat_template["tool_use"]
        if "default" in chat_template:
            return chat_template["default"]
        raise ValueError(f"chat_template: the model has named templates "
                         f"({', '.join(sorted(chat_template))}) and none is the default")
    if not chat_template:
        raise ValueError("chat_template: the model has no chat template")
    return chat_template


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], *,
                add_generation_prompt: bool = False, tools: Sequence[dict] | None = None,
                documents: Sequence[dict] | None = None, **variables: Any) -> str:
    """``template`` rendered over ``messages`` (dicts), as ``apply_chat_template(...,
    tokenize=False)`` renders it; ``variables`` are the template's other variables
    (special tokens, ``enable_thinking``). Jinja's TemplateError when the template
    refuses (``raise_exception``) or fails."""
    if not messages:
        raise ValueError("messages: a chat template renders at least one message")
    chat = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise TypeError(f"chat messages are dicts, got {message!r}")
        chat.append(_with_reasoning_aliases(_plain({k: v for k, v in message.items()
                                                    if v is not None})))
    for tool in tools or ():
        if not isinstance(tool, Mapping):
            raise ValueError("tools: each tool is a JSON schema (a dict)")
    return compiled(template).render(
        messages=chat, tools=_plain(list(tools)) if tools is not None else None,
        documents=_plain(list(documents)) if documents is not None else None,
        add_generation_prompt=add_generation_prompt, **_plain(variables))


@functools.lru_cache(maxsize=16)
def compiled(template: str) -> jinja2.Template:
    """The template compiled once per process (a chat renders it on every turn)."""
    return _environment().from_string(template)


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        # A call block, as transformers parses it: what the body sets stays inside it.
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
            lineno)

    @staticmethod
    def _body(caller: Any) -> str:
        return caller()


class _TemplateDict:
    """``dict(...)`` in a template, without the class itself (no attribute escapes)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's namespace, refusing underscore names (the interpreter's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's own signature
        self, rest = args[0], args[1:]
        for name in dict(*rest, **kwargs):
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, *rest, **kwargs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot set underscore names on a namespace ({name!r})")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _with_reasoning_aliases(message: dict) -> dict:
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None),
                     None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _plain(value: Any) -> Any:
    """``value`` rebuilt from JSON's types (subclasses to their base), so a template sees
    no object with methods of its own and never edits the caller's messages."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"
