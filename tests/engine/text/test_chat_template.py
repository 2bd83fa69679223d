"""ChatTokenizer: prompts that keep the exact ids of earlier replies, on the starter's real
tokenizer and on a tiny hand-built one."""

from __future__ import annotations

import copy

import pytest
from transformers import PreTrainedTokenizerFast

from engine.text.chat_template import ChatTokenizer
from tests.engine.text.text_cases import IM_END, IM_START, NEWLINE, byte_tokenizer, user

# "<|im_start|>assistant\n": SmolLM2's generation prompt.
ASSISTANT_PROMPT = [IM_START, 520, 9531, NEWLINE]
DEFAULT_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n"
)
# " Hello" as the model might generate it, in two pieces; re-tokenizing gives [38699].
HELLO_AS_GENERATED = [5362, 5365]


def without_template(hf: PreTrainedTokenizerFast, template: str | None = None) -> ChatTokenizer:
    other = copy.deepcopy(hf)
    other.chat_template = template
    return ChatTokenizer(other)


def reply(text: str, token_ids: list[int] | None = None) -> dict:
    message = {"role": "assistant", "content": text}
    if token_ids is not None:
        message["token_ids"] = token_ids
    return message


def test_first_turn_is_the_template_with_its_default_system_prompt(starter) -> None:
    ids = starter.encode_chat([user("Hi there")])
    assert ids == [
        1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018,
        411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 26843, 665, 2, 198, 1, 520, 9531, 198,
    ]
    assert starter.decode(ids, skip_special_tokens=False) == (
        DEFAULT_SYSTEM + "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )


def test_an_explicit_system_prompt_replaces_the_default(starter) -> None:
    ids = starter.encode_chat([{"role": "system", "content": "Be brief."}, user("Hi")],
                              add_generation_prompt=False)
    assert starter.decode(ids, skip_special_tokens=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_end_of_turn_and_eos(starter) -> None:
    assert starter.end_of_turn_token_id == IM_END
    assert starter.eos_token_ids == {IM_END}
    assert starter.stop_strings == ()
    assert ChatTokenizer(starter.hf, extra_eos_token_ids=[0]).eos_token_ids == {0, IM_END}


def test_next_turn_starts_with_the_prompt_and_the_generated_ids(starter) -> None:
    first = starter.encode_chat([user("Hi")])
    generated = HELLO_AS_GENERATED + [IM_END]
    second = starter.encode_chat([user("Hi"), reply("Hello", generated), user("Bye")])
    bye = starter.encode("Bye", add_special_tokens=False)
    # The model's <|im_end|> stands in for the template's: it is not written twice.
    assert second == first + generated + [NEWLINE, IM_START, 4093, NEWLINE] + bye + [
        IM_END, NEWLINE, *ASSISTANT_PROMPT
    ]
    # Re-tokenizing the reply's text would have given other ids (and missed the cache).
    assert starter.encode_chat([user("Hi"), reply(" Hello"), user("Bye")]) != second


def test_a_reply_cut_short_gets_the_templates_end_of_turn(starter) -> None:
    first = starter.encode_chat([user("Hi")])
    second = starter.encode_chat([user("Hi"), reply("Hello", HELLO_AS_GENERATED), user("Bye")])
    assert second[: len(first) + 3] == first + HELLO_AS_GENERATED + [IM_END]


def test_every_turn_extends_the_previous_prompt_and_reply(starter) -> None:
    history: list[dict] = [{"role": "system", "content": "You count."}]
    previous: list[int] = []
    replies = [HELLO_AS_GENERATED + [IM_END], [28, 216, 33, 28], [339, 1083, 17, 30, IM_END]]
    for turn, generated in enumerate(replies):
        history.append(user(f"Turn {turn}: go on 😀"))
        prompt = starter.encode_chat(history)
        assert prompt[: len(previous)] == previous
        assert prompt[-len(ASSISTANT_PROMPT):] == ASSISTANT_PROMPT
        history.append(reply(starter.decode(generated), generated))
        previous = prompt + generated


def test_canonical_reply_ids_give_the_plain_template_prompt(starter_hf, starter) -> None:
    text = "Paris is the capital of France."
    generated = starter.encode(text, add_special_tokens=False) + [IM_END]
    messages = [user("Capital of France?"), reply(text), user("And Spain?")]
    rendered = starter_hf.apply_chat_template(messages, add_generation_prompt=True,
                                              tokenize=False)
    expected = starter_hf.encode(rendered, add_special_tokens=False)
    assert starter.encode_chat(messages) == expected
    messages[1]["token_ids"] = generated
    assert starter.encode_chat(messages) == expected


def test_token_ids_on_other_roles_are_ignored(starter) -> None:
    plain = starter.encode_chat([user("Hi")])
    assert starter.encode_chat([{"role": "user", "content": "Hi", "token_ids": [5]}]) == plain


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ([], "messages"),
        ([{"role": "function", "content": "x"}], r"messages\[0\]\.role"),
        ([{"role": "tool", "content": "x"}], r"messages\[0\]\.tool_call_id"),
        ([user("a"), {"role": "user", "content": "b", "tool_calls": []}],
         r"messages\[1\]\.tool_calls"),
        ([user("a"), {"role": "user", "content": None}], r"messages\[1\]\.content"),
        ([user("a"), reply("b", [-1])], r"messages\[1\]\.token_ids"),
        (["hello"], r"messages\[0\]"),
    ],
)
def test_bad_messages_name_the_field(starter, messages: list, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        starter.encode_chat(messages)


def test_without_a_template_the_prompt_is_role_colon_content(starter_hf) -> None:
    plain = without_template(starter_hf)
    assert plain.stop_strings == ("\nuser:",)
    assert plain.end_of_turn_token_id is None
    assert plain.eos_token_ids == {IM_END}
    system = {"role": "system", "content": "Be brief."}
    first = plain.encode_chat([system, user("Hi")])
    assert plain.decode(first) == "system: Be brief.\nuser: Hi\nassistant:"
    generated = plain.encode(" Hello there", add_special_tokens=False)
    second = plain.encode_chat([system, user("Hi"), reply("Hello there", generated), user("Bye")])
    assert second[: len(first) + len(generated)] == first + generated
    assert plain.decode(second) == (
        "system: Be brief.\nuser: Hi\nassistant: Hello there\nuser: Bye\nassistant:"
    )


def test_the_plain_format_starts_with_the_tokenizers_bos() -> None:
    plain = ChatTokenizer(byte_tokenizer(bos=True))
    assert plain.encode("Hi") == [256, 39, 72]
    assert plain.eos_token_ids == frozenset()  # no eos token, no template
    ids = plain.encode_chat([user("Hi")])
    assert ids[:4] == [256, 84, 82, 68]  # <s> u s e
    assert plain.decode(ids) == "user: Hi\nassistant:"


def test_whitespace_before_the_end_of_turn_is_dropped_with_it(starter_hf) -> None:
    # Llama 2 style: the template writes " <|im_end|>" after a reply.
    spaced = without_template(
        starter_hf,
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }} <|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    assert spaced.end_of_turn_token_id == IM_END
    first = spaced.encode_chat([user("Hi")])
    generated = HELLO_AS_GENERATED + [IM_END]
    second = spaced.encode_chat([user("Hi"), reply("Hello", generated), user("Bye")])
    assert second[: len(first) + len(generated) + 2] == first + generated + [NEWLINE, IM_START]


def test_a_template_that_drops_replies_falls_back_to_their_text(starter_hf) -> None:
    last_only = without_template(
        starter_hf,
        "{% for m in messages[-1:] %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    ids = last_only.encode_chat([user("Hi"), reply("Hello", HELLO_AS_GENERATED), user("Bye")])
    assert last_only.decode(ids, skip_special_tokens=False) == (
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_need_a_template(starter_hf) -> None:
    plain = without_template(starter_hf)
    with pytest.raises(ValueError, match="tools: this model has no chat template"):
        plain.encode_chat([user("Hi")], tools=[{"type": "function",
                                                "function": {"name": "f"}}])


def test_tools_and_tool_messages_reach_the_template(starter_hf) -> None:
    template = (
        "{% if tools %}TOOLS {{ tools | map(attribute='function.name') | join(',') }}\n"
        "{% endif %}{% for m in messages %}{{ m.role }}"
        "{% if m.tool_calls %} calls {{ m.tool_calls[0].function.name }}{% endif %}"
        "{% if m.tool_call_id %} answers {{ m.tool_call_id }}{% endif %}"
        ": {{ m.content }}\n{% endfor %}"
    )
    chat = without_template(starter_hf, template)
    messages = [user("Hi"),
                {"role": "assistant", "content": "",
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "f", "arguments": {}}}]},
                {"role": "tool", "content": "42", "tool_call_id": "c1"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    text = chat.decode(chat.encode_chat(messages, tools=tools), skip_special_tokens=False)
    assert text == "TOOLS f\nuser: Hi\nassistant calls f: \ntool answers c1: 42\n"
    # A reply spliced by its ids carries its calls in them: the template gets only the ids.
    spliced = [messages[0], {**messages[1], "token_ids": [42]}, messages[2]]
    ids = chat.encode_chat(spliced, tools=tools)
    assert 42 in ids and "calls f" not in chat.decode(ids, skip_special_tokens=False)
