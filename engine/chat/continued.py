"""A reply cut short (max tokens, Stop), continued in place.

The prompt is the one the reply answered, built again from the messages before it (the
same request, so the same ids), then the reply's own generated ids with its turn left
open: no end-of-turn token, nothing of it rendered by the template. The prefix cache
finds the whole prompt and the reply's full blocks (only the last block or so is
computed), and the model goes on as if it had not stopped: greedy, a reply of k tokens
continued by m tokens is the reply of k + m.

The reply's reader has to go on where the first one stopped (inside the thinking, in a
harmony channel, halfway through a tag): the reply's text, decoded as the engine decoded
it, is replayed into the new reader first (``ReplyPlan.replay``), so the finished
message is the whole reply while the events carry only what is new.
"""

from __future__ import annotations

from engine.chat.request import content_text
from engine.text.chat_template import ChatTokenizer


def replay_text(ids: list[int], tokenizer: ChatTokenizer, keeps_special: bool) -> str:
    """The reply's text as the engine decoded its tokens for the reader (special tokens
    kept where the prompt's sampling keeps them), to replay into the new reader."""
    return tokenizer.decode(ids, skip_special_tokens=not keeps_special)


def reply_ids(reply: dict, tokenizer: ChatTokenizer) -> list[int]:
    """The ids to continue from: the reply's own, or its text encoded where none were
    kept (a reply without thinking)."""
    ids = reply.get("token_ids")
    if ids is None:
        if reply.get("reasoning_content"):
            # Its text alone does not say how the model wrote its thinking.
            raise ValueError("messages[-1].token_ids: a reply with thinking is continued "
                             "from its token ids")
        ids = tokenizer.encode(_text(reply.get("content")), add_special_tokens=False)
    if not isinstance(ids, list | tuple) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise ValueError("messages[-1].token_ids must be a list of token ids >= 0")
    if ids and ids[-1] in tokenizer.eos_token_ids:
        raise ValueError("continue_reply: the reply ended its turn; there is nothing to "
                         "continue")
    return list(ids)


def _text(content) -> str:
    return content_text(content, "messages[-1].content")
