"""Text <-> token ids around a transformers tokenizer: chat prompts that keep the exact ids
of earlier replies, a streaming detokenizer, and stop strings.

Chat prompts. The chat template is rendered as text with each assistant reply that carries
its generated ``token_ids`` replaced by a marker; the text between markers is tokenized
piece by piece and the generated ids are spliced in unchanged. The template text that comes
before a reply is exactly the prompt the model saw when it wrote that reply (for templates
whose generation prompt is how they open an assistant turn: ChatML, Llama 3, ...), and each
piece is tokenized alone, so the prompt of turn k+1 starts with the prompt ids of turn k
followed by the ids generated in turn k: the engine's prefix cache can reuse all of it.
When the generated ids end with an end-of-turn token the template also writes after the
reply (``<|im_end|>``), the template's copy is dropped so it is not there twice.

Without a chat template the prompt is plain text, one message per line::

    system: You are terse.
    user: Hi
    assistant: Hello!
    user: Bye
    assistant:

(the tokenizer's BOS token first, if it adds one). Such a model has no end-of-turn token,
so ``ChatTokenizer.stop_strings`` then holds ``"\\nuser:"`` for the engine to stop on.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
PLAIN_STOP = "\nuser:"
# Prompt tokens fed to the detokenizer before the first output token, so that a leading
# space of that token decodes as it does in context (sentencepiece drops it at the start).
DETOKENIZER_CONTEXT = 6
_REPLACEMENT = "\ufffd"


class _Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class ChatTokenizer:
    """Wraps a transformers fast tokenizer (``chat_template`` set when the model has one).

    ``extra_eos_token_ids``: further ids that end generation, e.g. a generation config's
    ``eos_token_id`` list.
    """

    def __init__(self, hf_tokenizer: Any, extra_eos_token_ids: Iterable[int] = ()) -> None:
        self.hf = hf_tokenizer
        self.has_chat_template = bool(getattr(hf_tokenizer, "chat_template", None))
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

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def encode_chat(
        self, messages: Sequence[dict], add_generation_prompt: bool = True
    ) -> list[int]:
        """Prompt ids for `messages`: dicts with "role" (system, user or assistant),
        "content" (str) and, on assistant messages, optional "token_ids" (the exact ids the
        model generated for that reply; ignored on other roles)."""
        _validate(messages)
        ids = [] if self.has_chat_template else list(self._bos_prefix)
        end_of_reply: str | None = None
        for piece in self._render(messages, add_generation_prompt):
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

    def _render(self, messages: Sequence[dict], add_generation_prompt: bool) -> list[str | int]:
        """The prompt as text pieces and, between them, indices of messages to splice."""
        spliced = [
            i for i, m in enumerate(messages)
            if m["role"] == "assistant" and m.get("token_ids") is not None
        ]
        if not self.has_chat_template:
            return _render_plain(messages, spliced, add_generation_prompt)
        tag = f"FolioSplice{secrets.token_hex(8)}"
        conversation = [
            {"role": m["role"], "content": f"{tag}N{i}E" if i in spliced else m["content"]}
            for i, m in enumerate(messages)
        ]
        text = self._apply_template(conversation, add_generation_prompt)
        parts = re.split(f"{tag}N(\\d+)E", text)
        found = [int(p) for p in parts[1::2]]
        if found == spliced:
            return [int(p) if k % 2 else p for k, p in enumerate(parts)]
        # The template dropped, repeated or reordered a reply: fall back to its text.
        logger.warning("chat template did not render each reply once; re-tokenizing replies")
        plain_conversation = [{"role": m["role"], "content": m["content"]} for m in messages]
        return [self._apply_template(plain_conversation, add_generation_prompt)]

    def _apply_template(self, conversation: list[dict], add_generation_prompt: bool) -> str:
        return self.hf.apply_chat_template(
            conversation, add_generation_prompt=add_generation_prompt, tokenize=False
        )

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


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas.

    Each step decodes a short window (the tokens of the last emitted delta plus the new
    ones) and emits what it adds, so leading-space tokens decode as they do in context.
    While the window's text ends in U+FFFD (half of a UTF-8 character) nothing is emitted.
    The deltas plus ``flush()`` concatenate to ``decode(output ids, skip_special_tokens=True)``
    (with ``prompt_ids``: to the text those ids add after the prompt, which is the same for
    byte-level BPE and differs only by a leading space for sentencepiece).
    """

    def __init__(
        self,
        tokenizer: _Decoder,
        prompt_ids: Sequence[int] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._window = list(prompt_ids[-DETOKENIZER_CONTEXT:]) if prompt_ids else []
        self._emitted_from = 0  # window[_emitted_from:_pending_from] was emitted last
        self._pending_from = len(self._window)  # window[_pending_from:] is not emitted yet
        self.output_ids: list[int] = []
        self.text = ""

    def add(self, token_id: int) -> str:
        """Feed one token; return the new text (possibly empty)."""
        self.output_ids.append(int(token_id))
        self._window.append(int(token_id))
        return self._emit(final=False)

    def flush(self) -> str:
        """At the end of generation: whatever is held back, even half a character."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self._pending_from == len(self._window):
            return ""
        new = self._decode(self._window[self._emitted_from:])
        if new.endswith(_REPLACEMENT) and not final:
            return ""
        old = self._decode(self._window[self._emitted_from:self._pending_from])
        delta = new[len(old):]
        self._window = self._window[self._pending_from:]
        self._emitted_from, self._pending_from = 0, len(self._window)
        self.text += delta
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special) if ids else ""


class StopChecker:
    """Streams text deltas through stop strings.

    ``check(delta) -> (stopped, text_to_emit)``: the emitted text never contains a stop
    string, and a tail that could still grow into one is held back until it cannot (then
    it is emitted) or it does (then the text is cut where the stop string starts). Text
    stops at the first character that completes any stop string.
    ``flush()`` returns the held-back tail once generation ends for another reason.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        if isinstance(stop, str):
            stop = [stop]
        if not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {stop!r}")
        self.stop = tuple(stop)
        self.stopped = False
        self._held = ""
        self._longest = max((len(s) for s in self.stop), default=0)

    def check(self, delta: str) -> tuple[bool, str]:
        if self.stopped:
            return True, ""
        if not self.stop:
            return False, delta
        text = self._held + delta
        # Generation stops at the first character that completes a stop string, however
        # the text was split into deltas: the earliest end wins, then the longest.
        hits = [(i + len(s), i) for s in self.stop if (i := text.find(s)) >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return True, text[:min(hits)[1]]
        keep = self._partial_match(text)
        self._held = text[len(text) - keep:]
        return False, text[:len(text) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _partial_match(self, text: str) -> int:
        """Length of the longest tail of `text` that starts some stop string."""
        for length in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[-length:]
            if any(s.startswith(tail) for s in self.stop):
                return length
        return 0
