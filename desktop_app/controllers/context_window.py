"""Measuring prompts for the context policy (data.context_policy) with the loaded model.

A local model's tokenizer is the engine's ``ChatTokenizer`` (``EngineBridge.tokenizer``):
``encode_chat`` is exactly what ``LLMEngine.encode`` runs on the messages the app submits
(template, earlier replies' ids spliced in), so the count is the engine's own. A bare
Hugging Face tokenizer is wrapped in one. A remote model has no tokenizer here: the
count is ``context_policy.estimate_tokens``, a conservative guess.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from desktop_app.data.context_policy import CHARS_PER_TOKEN, Counter, estimate_tokens

logger = logging.getLogger(__name__)
_wrapped: list[Any] = [None, None]  # the last HF tokenizer wrapped, and its ChatTokenizer


def chat_tokenizer(tokenizer: Any) -> Any | None:
    """The engine's ChatTokenizer for `tokenizer` (already one, or an HF tokenizer)."""
    if tokenizer is None:
        return None
    if hasattr(tokenizer, "encode_chat"):
        return tokenizer
    if _wrapped[0] is not tokenizer:  # building one probes the template: keep the last
        from engine.text.chat_template import ChatTokenizer

        _wrapped[:] = [tokenizer, ChatTokenizer(tokenizer)]
    return _wrapped[1]


def prompt_counter(tokenizer: Any) -> Counter:
    """count(messages) -> prompt tokens, as the engine will count them when it can."""
    chat = chat_tokenizer(tokenizer)
    if chat is None:
        return estimate_tokens

    def count(messages: Sequence[dict[str, Any]]) -> int:
        try:
            return len(chat.encode_chat(list(messages)))
        except Exception:  # noqa: BLE001 - a template that rejects the chat: guess instead
            logger.warning("could not render the chat template; estimating the prompt size",
                           exc_info=True)
            return estimate_tokens(messages)

    return count


def text_tokens(tokenizer: Any, text: str) -> int:
    """Tokens of a draft message (template markers not included)."""
    if not text:
        return 0
    chat = chat_tokenizer(tokenizer)
    if chat is None:
        return math.ceil(len(text) / CHARS_PER_TOKEN)
    try:
        return len(chat.encode(text, add_special_tokens=False))
    except Exception:  # noqa: BLE001
        return math.ceil(len(text) / CHARS_PER_TOKEN)
