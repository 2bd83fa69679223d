"""Earlier replies' thinking in the prompt, as the model's chat template wants it.

What a template does with a reply's thinking decides how the reply goes back in:

* harmony (gpt-oss): the template writes each reply's headers again, so no reply is
  spliced as its ids; a reply's ``reasoning_content`` goes along with its tool calls,
  where the template shows it (before the calls of the turn in progress).
* a template that drops earlier thinking (Qwen 3's): a reply with thinking goes back as
  its answer text, not its ids (which hold the thinking), so the prompt is what the model
  was trained on; its ``reasoning_content`` reaches the template, which shows it where it
  wants (Qwen 3: the replies of the turn in progress).
* a template that keeps it: a reply without its ids is written back with its thinking
  in the template's tags; with its ids, they already hold it.

The reply before the new message was cached with its thinking, so a reply that goes back
as text is computed again: ``recomputed`` counts those tokens for the reply's metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.text.reasoning import HARMONY, ReasoningFormat
from engine.text.reasoning.think import CLOSE, OPEN

PROBE = "FolioThinkingProbe"


@dataclass(slots=True, frozen=True)
class History:
    """Earlier replies made ready for the template: the messages, and the tokens of the
    last reply computed again because it goes back as text."""

    messages: list[dict]
    recomputed: int = 0


def with_thinking(messages: list[dict], fmt: ReasoningFormat | None, drops_thinking: bool,
                  count: Callable[[str], int]) -> History:
    """``count(text)``: the tokens of a reply's text (the recomputed figure)."""
    if fmt is None:
        return History(messages)
    last_reply = max((i for i, m in enumerate(messages) if m["role"] == "assistant"),
                     default=-1)
    out, recomputed = [], 0
    for i, message in enumerate(messages):
        thinking = message.get("reasoning_content")
        if message["role"] != "assistant" or not (thinking or fmt is HARMONY):
            out.append(message)
            continue
        message = dict(message)
        as_text = fmt is HARMONY or drops_thinking
        if as_text and message.pop("token_ids", None) is not None and thinking \
                and i == last_reply:
            recomputed = count(message["content"])
        if fmt is HARMONY and not message.get("tool_calls"):
            message.pop("reasoning_content", None)
        elif not as_text and "token_ids" not in message:
            message["content"] = f"{OPEN}\n{thinking}\n{CLOSE}\n\n{message['content']}"
            del message["reasoning_content"]
        out.append(message)
    return History(out, recomputed)


def drops_thinking(render: Callable[[list[dict]], str]) -> bool:
    """Whether a template shows an earlier reply without its ``<think>`` part
    (``render``: a conversation to the template's text, with the generation prompt)."""
    reply = f"{OPEN}\n{PROBE}\n{CLOSE}\n\nok"
    conversation = [{"role": "user", "content": "a"}, {"role": "assistant", "content": reply},
                    {"role": "user", "content": "b"}]
    try:
        text = render(conversation)
    except Exception:  # noqa: BLE001 - a template that refuses the probe shows it as sent
        return False
    return PROBE not in text
