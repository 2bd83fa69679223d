"""Token ids -> text deltas while a reply streams, so the UI can show text token by token.

Decoding each token alone is wrong in two ways: a token may hold only part of a UTF-8
character (emoji, CJK), and sentencepiece tokenizers drop a token's leading space when it
is decoded first. ``IncrementalDetokenizer`` decodes short windows in context instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

# Prompt tokens fed to the detokenizer before the first output token, so that a leading
# space of that token decodes as it does in context (sentencepiece drops it at the start).
DETOKENIZER_CONTEXT = 6
_REPLACEMENT = "\ufffd"


class _Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


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
