"""What to send when a chat outgrows the model's context (no Qt here).

The stored chat is never shortened: these functions only choose which of its messages go
into the next prompt. A chat's messages are cut into *turns*: a user message and the
replies after it (messages before the first user message belong to the first turn). The
system prompt (a leading "system" message) is always sent, the last turn (the message
being answered) is always sent, and a turn is either sent whole or not at all: never half
a message, never a reply without the question it answers.

Policies (``ChatSettings.overflow_policy``):

* ``keep_latest``  Keep the system prompt and the latest turns: drop the oldest turns.
* ``truncate_middle``  Keep the system prompt, the first turn and the latest turns: drop
  turns from the middle (the first turn often sets the task).
* ``stop``  Stop at the limit: send nothing and say the context is full.

Room is left for the reply: ``reply_reserve(max_tokens, context)`` tokens, the chat's max
tokens but at most a quarter of the context; with max tokens None ("up to the context")
room for a long answer, ``LONG_REPLY`` tokens, at most a quarter too. That room decides
where a long chat is cut; without a limit it is not a reason to refuse a message: one
that leaves a reply ``reply_floor`` tokens (``MIN_REPLY``) is still sent, its reply
getting what is left of the context. The prompt is
measured by ``count``, a function of a message list (the app passes the loaded model's
own prompt builder, so the figure is the engine's; see ``estimate_tokens`` for a model
without one).

Prefix cache: a prompt shares the KV blocks of the previous one only if it starts the
same way, so the cut point should not move every turn. ``plan_context`` therefore never
sends turns that an earlier cut dropped (``min_dropped``) and, when it has to cut, cuts a
little deeper than needed (``slack``: down to ``(1 - slack)`` of the budget). The next
turns then extend the new prompt and the engine's prefix cache takes over again until
the next cut.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

KEEP_LATEST = "keep_latest"
TRUNCATE_MIDDLE = "truncate_middle"
STOP = "stop"
POLICIES = (KEEP_LATEST, TRUNCATE_MIDDLE, STOP)
POLICY_LABELS = {
    KEEP_LATEST: "Keep the system prompt and the latest turns",
    TRUNCATE_MIDDLE: "Truncate the middle",
    STOP: "Stop at the limit",
}
DEFAULT_POLICY = KEEP_LATEST
# When a cut is needed, cut down to this share of the budget below it, so that the next
# few turns extend the same prompt (prefix cache hits) instead of moving the cut again.
CUT_SLACK = 0.2
# The room kept for a reply without a max tokens limit: a long answer, so a long chat is
# not cut a quarter of a large context early (the reply may still run past it: the
# engine stops it at the context's end).
LONG_REPLY = 4096
# Without a max tokens limit, the least room a message must leave for its reply to be
# sent at all (a long paste on a small context).
MIN_REPLY = 256
# A model without a tokenizer the app can run (a remote server): a conservative guess.
# English text averages about 4 characters per token with the usual BPE vocabularies;
# 3 overestimates the prompt, so a cut comes a little early rather than the server
# refusing the request. Each message also costs its template's role markers.
CHARS_PER_TOKEN = 3
TOKENS_PER_MESSAGE = 8

Messages = list[dict[str, Any]]
Counter = Callable[[Sequence[dict[str, Any]]], int]


def reply_reserve(max_tokens: int | None, context: int) -> int:
    """Tokens kept free for the reply: max tokens, at most a quarter of the context."""
    wanted = LONG_REPLY if max_tokens is None else int(max_tokens)
    return max(1, min(wanted, int(context) // 4))


def reply_floor(max_tokens: int | None, context: int) -> int:
    """The least room for the reply with which a turn is sent at all: the reserve when
    the chat sets max tokens; without a limit ``MIN_REPLY`` (at most a sixteenth)."""
    if max_tokens is not None:
        return reply_reserve(max_tokens, context)
    return max(1, min(MIN_REPLY, int(context) // 16))


def estimate_tokens(messages: Sequence[dict[str, Any]]) -> int:
    """A conservative prompt size for a model whose tokenizer the app does not have."""
    total = 0
    for m in messages:
        ids = m.get("token_ids")
        total += len(ids) if ids is not None else _content_tokens(m.get("content", ""))
        total += TOKENS_PER_MESSAGE
    return total + TOKENS_PER_MESSAGE  # the generation prompt


# A guess for an attachment's tokens where the app has no tokenizer (a server's model):
# an image as a vision model's typical tile count; a document by its bytes.
IMAGE_TOKENS = 1024


def _content_tokens(content: Any) -> int:
    if isinstance(content, str):
        return math.ceil(len(content) / CHARS_PER_TOKEN)
    total = 0
    for part in content if isinstance(content, list) else ():
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            total += math.ceil(len(part.get("text", "")) / CHARS_PER_TOKEN)
        elif kind in ("image", "image_url"):
            total += IMAGE_TOKENS
        elif kind == "file":
            total += math.ceil(len(str(part.get("file", {}).get("file_data", ""))) * 3 / 4
                               / CHARS_PER_TOKEN)
    return total


def split_turns(messages: Sequence[dict[str, Any]]) -> tuple[int, list[list[int]]]:
    """(number of leading system messages, turns as lists of message indices)."""
    head = 0
    while head < len(messages) and messages[head].get("role") == "system":
        head += 1
    turns: list[list[int]] = []
    for i in range(head, len(messages)):
        if messages[i].get("role") == "user" or not turns:
            turns.append([i])
        else:
            turns[-1].append(i)
    return head, turns


@dataclass(slots=True)
class ContextPlan:
    """What to send. ``refused`` is a message for the user when nothing can be sent."""

    messages: Messages
    prompt_tokens: int  # of `messages`, as `count` measured them
    budget: int  # prompt tokens allowed: the context minus the reply's room
    context: int
    dropped: list[int] = field(default_factory=list)  # indices of messages left out
    dropped_turns: int = 0  # how many turns the cut removed
    refused: str | None = None
    # The engine's prompt for `messages` where a model's prompt builder measured them
    # (controllers.context_window): what is submitted, so the count is the ids run.
    prompt: Any = None

    @property
    def cut(self) -> bool:
        return bool(self.dropped)


def plan_context(messages: Sequence[dict[str, Any]], policy: str, context: int,
                 max_tokens: int | None, count: Counter, *, min_dropped: int = 0,
                 slack: float = CUT_SLACK) -> ContextPlan:
    """Choose the messages to send under `policy` (see the module doc).

    min_dropped: turns an earlier cut of this chat dropped (a prefix cache hint): when the
    whole chat does not fit, at least that many are dropped again. slack: when the cut has
    to move, it moves until the prompt fits in ``(1 - slack) * budget``.
    """
    if policy not in POLICIES:
        raise ValueError(f"overflow policy must be one of {POLICIES}, got {policy!r}")
    messages = list(messages)
    budget = int(context) - reply_reserve(max_tokens, context)
    hard = int(context) - reply_floor(max_tokens, context)  # == budget with a limit
    head, turns = split_turns(messages)

    def build(drop: range) -> tuple[Messages, list[int]]:
        gone = {i for t in drop for i in turns[t]}
        return ([m for i, m in enumerate(messages) if i not in gone], sorted(gone))

    full = count(messages)
    if full <= budget or policy == STOP or len(turns) <= 1:
        plan = ContextPlan(messages, full, budget, context)
        if len(turns) <= 1 and full <= hard:
            return plan  # nothing to cut, and the reply still has room
        if full > budget:
            alone = len(turns) <= 1 or count(
                [messages[i] for i in range(head)] + [messages[i] for i in turns[-1]]) > hard
            plan.refused = _refusal(policy, full, hard if alone else budget, context, alone)
        return plan

    # Turns that may go: all but the last; under truncate_middle the first stays too
    # (while that leaves a prompt that fits: else it goes as well, the latest turn wins).
    first = 1 if policy == TRUNCATE_MIDDLE and len(turns) > 2 else 0
    for start in (first, 0) if first else (0,):
        droppable = len(turns) - 1 - start
        target = budget
        lo = min(max(min_dropped, 0), droppable)
        sent, gone = build(range(start, start + lo))
        tokens = count(sent) if lo else full
        if tokens > budget:
            # Cut deeper: the fewest turns that fit under (1 - slack) * budget, found by
            # bisection (fewer tokens with every turn dropped).
            target = max(1, int(budget * (1 - slack)))
            hi = droppable
            sent_hi, gone_hi = build(range(start, start + hi))
            tokens_hi = count(sent_hi)
            if tokens_hi > budget:
                if start == 0 and tokens_hi <= hard:  # the latest turn alone, a short reply
                    return ContextPlan(sent_hi, tokens_hi, budget, context, gone_hi, hi)
                continue  # even the shortest prompt of this shape does not fit
            if tokens_hi > target:
                target = budget  # slack unreachable: just fit
            best = (hi, sent_hi, gone_hi, tokens_hi)
            left, right = lo + 1, hi - 1
            while left <= right:
                mid = (left + right) // 2
                sent_mid, gone_mid = build(range(start, start + mid))
                tokens_mid = count(sent_mid)
                if tokens_mid <= target:
                    best = (mid, sent_mid, gone_mid, tokens_mid)
                    right = mid - 1
                else:
                    left = mid + 1
            lo, sent, gone, tokens = best
        return ContextPlan(sent, tokens, budget, context, gone, lo)
    # Not even the system prompt and the last message fit.
    sent, gone = build(range(0, len(turns) - 1))
    tokens = count(sent)
    plan = ContextPlan(sent, tokens, budget, context, gone, len(turns) - 1)
    plan.refused = _refusal(policy, tokens, hard, context, True)
    return plan


def _refusal(policy: str, tokens: int, budget: int, context: int, alone: bool) -> str:
    room = context - budget
    if alone:
        return (f"Context full: this message needs {tokens:,} tokens with the system prompt, "
                f"but the model's context holds {context:,} and {room:,} of them are kept "
                "for the reply. Shorten the message or the system prompt, lower the max "
                "tokens setting, or load a model with a longer context.")
    return (f"Context full: this chat needs {tokens:,} tokens, but the model's context "
            f"holds {context:,} and {room:,} of them are kept for the reply. Nothing was "
            "sent. Start a new chat, or in Settings choose the overflow policy "
            f"“{POLICY_LABELS[KEEP_LATEST]}” or “{POLICY_LABELS[TRUNCATE_MIDDLE]}” to send "
            "only part of the chat (the saved chat stays whole).")
