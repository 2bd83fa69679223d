"""The overflow policies on plain message lists, with a word counter for a tokenizer."""

from __future__ import annotations

import pytest

from desktop_app.data.context_policy import (
    KEEP_LATEST,
    LONG_REPLY,
    POLICIES,
    STOP,
    TRUNCATE_MIDDLE,
    estimate_tokens,
    plan_context,
    reply_floor,
    reply_reserve,
    split_turns,
)


def count(messages):
    """One token per word, one per message for its role, one for the generation prompt."""
    return sum(len(m["content"].split()) + 1 for m in messages) + 1


def chat(turns: int, system: bool = True, words: int = 4):
    """system (3 words), then per turn a user message uK and a reply aK of `words` words,
    then the new user message (the one to answer)."""
    out = [{"role": "system", "content": "be very brief"}] if system else []
    for k in range(turns):
        out.append({"role": "user", "content": " ".join([f"u{k}"] * words)})
        out.append({"role": "assistant", "content": " ".join([f"a{k}"] * words),
                    "token_ids": [k] * words})
    out.append({"role": "user", "content": "new question"})
    return out


def tags(messages):
    return [m["content"].split()[0] if m["role"] != "system" else "sys" for m in messages]


def test_reply_reserve_is_max_tokens_but_at_most_a_quarter():
    assert reply_reserve(16, 256) == 16
    assert reply_reserve(512, 256) == 64
    assert reply_reserve(512, 2) == 1
    # Up to the context: room for a long answer, at most a quarter.
    assert reply_reserve(None, 256) == 64
    assert reply_reserve(None, 131072) == LONG_REPLY


def test_split_turns_keeps_replies_with_their_question():
    head, turns = split_turns(chat(2))
    assert head == 1
    assert turns == [[1, 2], [3, 4], [5]]
    # A reply before any user message belongs to the first turn.
    assert split_turns([{"role": "assistant", "content": "hi"},
                        {"role": "user", "content": "yo"}]) == (0, [[0], [1]])


@pytest.mark.parametrize("policy", POLICIES)
def test_a_chat_that_fits_is_sent_whole(policy):
    messages = chat(3)
    plan = plan_context(messages, policy, context=200, max_tokens=10, count=count)
    assert plan.messages == messages and not plan.cut and plan.refused is None
    assert plan.prompt_tokens == count(messages)
    assert plan.budget == 190


def test_keep_latest_drops_whole_oldest_turns_never_the_system_prompt():
    messages = chat(6)  # system 4 + 6 turns of 10 + new 3 + 1 = 68 tokens
    assert count(messages) == 68
    # budget 50 - 10 = 40: drop the fewest oldest turns that fit (no slack).
    plan = plan_context(messages, KEEP_LATEST, context=50, max_tokens=10, count=count,
                        slack=0.0)
    assert tags(plan.messages) == ["sys", "u3", "a3", "u4", "a4", "u5", "a5", "new"]
    assert plan.prompt_tokens == 38 == count(plan.messages) and plan.prompt_tokens <= 40
    assert plan.dropped == [1, 2, 3, 4, 5, 6] and plan.dropped_turns == 3
    assert plan.refused is None
    # Kept replies keep their exact token ids (the prefix cache needs them).
    assert plan.messages[2]["token_ids"] == [3, 3, 3, 3]


def test_keep_latest_with_slack_cuts_deeper_so_the_next_turns_reuse_the_prompt():
    messages = chat(6)
    plan = plan_context(messages, KEEP_LATEST, context=50, max_tokens=10, count=count,
                        slack=0.25)  # down to 30 tokens
    assert tags(plan.messages) == ["sys", "u4", "a4", "u5", "a5", "new"]
    assert plan.prompt_tokens == 28
    # The next turn starts from the same cut while it fits: same prompt start.
    plan2 = plan_context(chat(7), KEEP_LATEST, context=50, max_tokens=10, count=count,
                         min_dropped=plan.dropped_turns, slack=0.25)
    assert tags(plan2.messages) == ["sys", "u4", "a4", "u5", "a5", "u6", "a6", "new"]
    assert plan2.dropped_turns == 4


def test_truncate_middle_keeps_the_first_turn_and_the_latest():
    messages = chat(6)
    plan = plan_context(messages, TRUNCATE_MIDDLE, context=50, max_tokens=10, count=count,
                        slack=0.0)
    assert tags(plan.messages) == ["sys", "u0", "a0", "u4", "a4", "u5", "a5", "new"]
    assert plan.dropped == [3, 4, 5, 6, 7, 8] and plan.dropped_turns == 3
    assert plan.prompt_tokens == 38


def test_truncate_middle_drops_the_first_turn_too_when_only_that_fits():
    messages = chat(2, words=8)  # sys 4, turns of 18, new 3, +1
    plan = plan_context(messages, TRUNCATE_MIDDLE, context=36, max_tokens=9, count=count,
                        slack=0.0)  # budget 27: sys + first + new = 26 fits
    assert tags(plan.messages) == ["sys", "u0", "a0", "new"]
    plan = plan_context(messages, TRUNCATE_MIDDLE, context=28, max_tokens=7, count=count,
                        slack=0.0)  # budget 21: sys + first + new (26) is too long
    assert tags(plan.messages) == ["sys", "new"]


def test_stop_refuses_with_what_to_do_and_sends_nothing_changed():
    messages = chat(6)
    plan = plan_context(messages, STOP, context=50, max_tokens=10, count=count)
    assert plan.refused is not None
    assert plan.refused.startswith("Context full")
    assert "Start a new chat" in plan.refused and "overflow policy" in plan.refused
    assert plan.messages == messages and not plan.cut


@pytest.mark.parametrize("policy", POLICIES)
def test_a_message_too_long_alone_is_refused_under_every_policy(policy):
    messages = chat(2)
    messages[-1]["content"] = "word " * 100
    plan = plan_context(messages, policy, context=64, max_tokens=16, count=count)
    assert plan.refused is not None and "Shorten the message" in plan.refused
    # The prompt it measured never holds half a message.
    assert all(m in messages for m in plan.messages)


@pytest.mark.parametrize("policy", POLICIES)
def test_without_a_limit_a_long_message_goes_if_its_reply_keeps_a_little_room(policy):
    """Max tokens "up to the context": the long-answer room decides cuts, not refusals; a
    message leaving the reply its floor is sent (alone, or with every older turn cut)."""
    assert reply_floor(None, 8192) == 256 and reply_floor(64, 8192) == 64
    for turns, first_kept in ((0, "sys"), (3, "sys")):
        messages = chat(turns)
        messages[-1]["content"] = "word " * 7000  # 7,003 tokens: past 8192 - 2048
        plan = plan_context(messages, policy, context=8192, max_tokens=None, count=count)
        if policy == STOP and turns:
            assert plan.refused is not None  # "stop at the limit" keeps its word
            continue
        assert plan.refused is None
        assert tags(plan.messages) == [first_kept, "word"]
        assert plan.prompt_tokens <= 8192 - 256
    messages = chat(0)
    messages[-1]["content"] = "word " * 7990  # leaves the reply less than its floor
    plan = plan_context(messages, policy, context=8192, max_tokens=None, count=count)
    assert plan.refused is not None and "256 of them are kept" in plan.refused


def test_without_a_system_prompt_the_latest_turns_are_kept():
    messages = chat(4, system=False)
    plan = plan_context(messages, KEEP_LATEST, context=30, max_tokens=5, count=count,
                        slack=0.0)  # budget 25
    assert tags(plan.messages) == ["u2", "a2", "u3", "a3", "new"]
    assert plan.messages[0]["role"] == "user"


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="overflow policy"):
        plan_context(chat(1), "nope", context=50, max_tokens=5, count=count)


def test_estimate_is_conservative_and_counts_exact_ids():
    text = "The quick brown fox jumps over the lazy dog. " * 10  # ~100 BPE tokens
    est = estimate_tokens([{"role": "user", "content": text}])
    assert est > len(text) / 4
    assert estimate_tokens([{"role": "assistant", "content": "x" * 300,
                             "token_ids": [1, 2, 3]}]) == 3 + 16
