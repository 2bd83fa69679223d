"""Chat messages -> prompt token ids around a model's tokenizer (Folio's FileTokenizer or
transformers' fast tokenizer: the same interface), keeping the exact ids of earlier replies
so that each turn's prompt extends the previous one in the prefix cache.

The chat template is rendered as text with each assistant reply that carries its generated
``token_ids`` replaced by a marker; the text between markers is tokenized piece by piece
and the generated ids are spliced in unchanged. The template text that comes before a reply
is exactly the prompt the model saw when it wrote that reply (for templates whose
generation prompt is how they open an assistant turn: ChatML, Llama 3, ...), and each piece
is tokenized alone, so the prompt of turn k+1 starts with the prompt ids of turn k followed
by the ids generated in turn k: the engine's prefix cache can reuse all of it. When the
generated ids end with an end-of-turn token the template also writes after the reply
(``<|im_end|>``), the template's copy is dropped so it is not there twice.

Without a chat template the prompt is plain text, one message per line::

    system: You are terse.
    user: Hi
    assistant: Hello!
    user: Bye
    assistant:

(the tokenizer's BOS token first, if it adds one). Such a model has no end-of-turn token,
so ``ChatTokenizer.stop_strings`` then holds ``"\\nuser:"`` for the engine to stop on.

Tool calling (``folio serve``): ``tools`` go to the template's own ``tools=`` argument, as
transformers' ``apply_chat_template`` passes them, and ``role: "tool"`` messages and
assistant ``tool_calls`` reach it as the keys templates read (``tool_call_id``,
``tool_calls``); a reply spliced by its ids carries its calls in those ids already.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

from jinja2 import TemplateError

from engine.text.reasoning.options import TemplateOptions
from engine.text.turn_formats import FROM_FILE, chat_template_for, check_template, stop_tokens

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")
# Message keys handed to the template as they are, when a message sets them.
TEMPLATE_KEYS = ("tool_calls", "tool_call_id", "name", "tools", "reasoning_content")
PLAIN_STOP = "\nuser:"


class ChatTokenizer:
    """Wraps a model's tokenizer, Folio's or transformers' (``chat_template`` set when the
    model has one).

    ``extra_eos_token_ids``: further ids that end generation, e.g. a generation config's
    ``eos_token_id`` list.
    """

    def __init__(self, hf_tokenizer: Any, extra_eos_token_ids: Iterable[int] = (),
                 template_source: str = FROM_FILE, image_marker: str | None = None) -> None:
        """``template_source``: where the tokenizer's template came from (the file, the
        family's turn format, the user: engine/text/turn_formats.py). ``image_marker``:
        a vision model's image token (engine/vision), which a template that reads
        content parts gets as an image part."""
        self.hf = hf_tokenizer
        self.has_chat_template = bool(getattr(hf_tokenizer, "chat_template", None))
        self.template_source = template_source
        self.image_marker = image_marker
        # Templates that read content only as a list of parts (SmolVLM's) render a string
        # as nothing: each message's text goes to them as parts.
        self.parts_only = self.has_chat_template and _parts_only(hf_tokenizer)
        self._special = _special_tokens(hf_tokenizer)
        self._special_text = {token_id: text for text, token_id in self._special.items()}
        self.end_of_turn_token_id = self._find_end_of_turn()
        eos = {int(t) for t in extra_eos_token_ids}
        if hf_tokenizer.eos_token_id is not None:
            eos.add(int(hf_tokenizer.eos_token_id))
        if self.end_of_turn_token_id is not None:
            eos.add(self.end_of_turn_token_id)
        self.eos_token_ids: frozenset[int] = frozenset(eos)
        self.stop_strings: tuple[str, ...] = () if self.has_chat_template else (PLAIN_STOP,)
        with_special = self.encode("a", add_special_tokens=True)
        plain = self.encode("a", add_special_tokens=False)
        self._bos_prefix = with_special[: len(with_special) - len(plain)]

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def special_ids(self) -> frozenset[int]:
        """The ids of the special (added) tokens, which split a text's tokenization."""
        return frozenset(self._special.values())

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def encode_chat(
        self, messages: Sequence[dict], add_generation_prompt: bool = True,
        tools: Sequence[dict] | None = None, enable_thinking: bool | None = None,
        reasoning_effort: str | None = None,
    ) -> list[int]:
        """Prompt ids for `messages`: dicts with "role" (system, user, assistant or tool),
        "content" (str) and, on assistant messages, optional "token_ids" (the exact ids the
        model generated for that reply; ignored on other roles). ``tools``: function
        definitions in OpenAI's shape, for the template's ``tools`` variable; the keys of
        ``TEMPLATE_KEYS`` on a message reach the template unchanged. ``enable_thinking``,
        ``reasoning_effort``: reasoning models' template variables (None: the template's
        default; engine.text.reasoning.options checks them)."""
        _validate(messages)
        if (tools or _uses_tools(messages)) and not self.has_chat_template:
            raise ValueError("tools: this model has no chat template, so nothing can show "
                             "it tools, tool calls or tool results")
        ids = [] if self.has_chat_template else list(self._bos_prefix)
        end_of_reply: str | None = None
        options = TemplateOptions(enable_thinking, reasoning_effort).variables()
        for piece in self._render(messages, add_generation_prompt, list(tools or ()),
                                  options):
            if isinstance(piece, int):
                generated = [int(t) for t in messages[piece]["token_ids"]]
                ids += generated
                end_of_reply = None
                if generated and generated[-1] in self.eos_token_ids:
                    end_of_reply = self._special_text.get(generated[-1])
                continue
            if end_of_reply and piece.lstrip().startswith(end_of_reply):
                # The model already wrote the end of its turn: keep its token, not ours.
                piece = piece.lstrip()[len(end_of_reply):]
            end_of_reply = None
            if piece:
                ids += self.encode(piece, add_special_tokens=False)
        return ids

    def _render(self, messages: Sequence[dict], add_generation_prompt: bool,
                tools: list[dict], options: dict | None = None) -> list[str | int]:
        """The prompt as text pieces and, between them, indices of messages to splice."""
        spliced = [
            i for i, m in enumerate(messages)
            if m["role"] == "assistant" and m.get("token_ids") is not None
        ]
        if not self.has_chat_template:
            return _render_plain(messages, spliced, add_generation_prompt)
        tag = f"FolioSplice{secrets.token_hex(8)}"
        # A spliced reply's tool calls are in its generated ids, so the template gets only
        # the marker; other messages keep what the template reads of them.
        conversation = [
            {"role": m["role"], "content": f"{tag}N{i}E"} if i in spliced else _for_template(m)
            for i, m in enumerate(messages)
        ]
        text = self._apply_template(conversation, add_generation_prompt, tools, options)
        parts = re.split(f"{tag}N(\\d+)E", text)
        found = [int(p) for p in parts[1::2]]
        if found == spliced:
            return [int(p) if k % 2 else p for k, p in enumerate(parts)]
        # The template dropped, repeated or reordered a reply: fall back to its text.
        logger.warning("chat template did not render each reply once; re-tokenizing replies")
        plain_conversation = [_for_template(m) for m in messages]
        return [self._apply_template(plain_conversation, add_generation_prompt, tools,
                                     options)]

    def _apply_template(self, conversation: list[dict], add_generation_prompt: bool,
                        tools: list[dict] | None = None, options: dict | None = None) -> str:
        if self.parts_only:
            conversation = [_with_parts(m, self.image_marker) for m in conversation]
        try:
            return self.hf.apply_chat_template(
                conversation, add_generation_prompt=add_generation_prompt, tokenize=False,
                **({"tools": tools} if tools else {}), **(options or {}),
            )
        except TemplateError as exc:
            # raise_exception() in a template: its own words on what it cannot render.
            raise ValueError(f"messages: the model's chat template refused them: {exc}") from exc

    def _find_end_of_turn(self) -> int | None:
        """The special token the template writes right after an assistant reply, if any."""
        if not self.has_chat_template:
            return None
        marker = f"FolioReply{secrets.token_hex(8)}"
        probe = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": marker}]
        try:
            text = self._apply_template(probe, add_generation_prompt=False)
        except Exception:  # templates may reject anything; then there is none to find
            return None
        after = text.partition(marker)[2].lstrip()
        matches = [token for token in self._special if after.startswith(token)]
        return self._special[max(matches, key=len)] if matches else None


def chat_tokenizer_for(hf_tokenizer: Any, turn_format: str,
                       choice: str | None = None,
                       image_marker: str | None = None) -> ChatTokenizer:
    """The ChatTokenizer of a loaded model: the user's template ``choice`` (checked by
    rendering a two-turn chat: ValueError naming chat_template), else the file's, else
    its family's ``turn_format``, set on ``hf_tokenizer``; its format's stop tokens
    (harmony's ``<|call|>``) end replies too."""
    if choice is not None:
        check_template(choice, hf_tokenizer.bos_token or "", hf_tokenizer.eos_token or "")
    template, source = chat_template_for(getattr(hf_tokenizer, "chat_template", None),
                                         turn_format, hf_tokenizer.get_vocab(), choice)
    if source != FROM_FILE:
        logger.info("chat template: %s (%s)", "the user's" if choice else turn_format, source)
    hf_tokenizer.chat_template = template
    stops = stop_tokens(template, hf_tokenizer.get_vocab())
    return ChatTokenizer(hf_tokenizer, stops, template_source=source,
                         image_marker=image_marker)


def _special_tokens(hf_tokenizer: Any) -> dict[str, int]:
    special = {
        token.content: int(token_id)
        for token_id, token in getattr(hf_tokenizer, "added_tokens_decoder", {}).items()
        if getattr(token, "special", False)
    }
    for token, token_id in zip(
        hf_tokenizer.all_special_tokens, hf_tokenizer.all_special_ids, strict=True
    ):
        special.setdefault(token, int(token_id))
    return special


def _parts_only(hf_tokenizer: Any) -> bool:
    """The template drops a message whose content is a string (it reads parts only)."""
    probe = f"FolioProbe{secrets.token_hex(4)}"
    try:
        text = hf_tokenizer.apply_chat_template([{"role": "user", "content": probe}],
                                                add_generation_prompt=False, tokenize=False)
        if probe in text:
            return False
        parts = [{"role": "user", "content": [{"type": "text", "text": probe}]}]
        return probe in hf_tokenizer.apply_chat_template(parts, add_generation_prompt=False,
                                                         tokenize=False)
    except Exception:  # a template may refuse a lone user message: keep strings then
        return False


def _with_parts(message: dict, image_marker: str | None) -> dict:
    """``message`` with its text as content parts, each ``image_marker`` an image part
    (where the template writes its own marker back)."""
    content = message.get("content")
    if not isinstance(content, str):
        return message
    pieces = content.split(image_marker) if image_marker else [content]
    parts: list[dict] = []
    for k, piece in enumerate(pieces):
        if k:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return {**message, "content": parts}


def _for_template(message: dict) -> dict:
    # Only the keys a message sets: templates test presence ("'tool_calls' in message").
    out = {"role": message["role"], "content": message["content"]}
    out.update((k, message[k]) for k in TEMPLATE_KEYS if message.get(k) is not None)
    return out


def _uses_tools(messages: Sequence[dict]) -> bool:
    return any(m["role"] == "tool" or m.get("tool_calls") for m in messages)


def _validate(messages: Sequence[dict]) -> None:
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be a dict with role and content")
        if m.get("role") not in ROLES:
            raise ValueError(f"messages[{i}].role must be one of {ROLES}, got {m.get('role')!r}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}].content must be a string")
        if m["role"] == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise ValueError(f"messages[{i}].tool_call_id: a tool result names the call it "
                             "answers")
        calls = m.get("tool_calls")
        if calls is not None and (m["role"] != "assistant" or not isinstance(calls, list)):
            raise ValueError(f"messages[{i}].tool_calls must be a list, on an assistant "
                             "message")
        ids = m.get("token_ids")
        if ids is not None and not all(isinstance(t, int) and t >= 0 for t in ids):
            raise ValueError(f"messages[{i}].token_ids must be a list of token ids >= 0")


def _render_plain(
    messages: Sequence[dict], spliced: list[int], add_generation_prompt: bool
) -> list[str | int]:
    pieces: list[str | int] = []
    text = ""
    for i, m in enumerate(messages):
        text += f"{m['role']}:"
        if i in spliced:
            # Generated ids start where the generation prompt "assistant:" ended, so they
            # carry their own leading space.
            pieces += [text, i]
            text = ""
        else:
            text += f" {m['content']}"
        text += "\n"
    if add_generation_prompt:
        text += "assistant:"
    return pieces + [text]
